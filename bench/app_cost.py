"""CPU and memory of the real tray app, dashboard closed and open, idle and while a server generates.

    python bench/app_cost.py [--seconds 30] [--warmup 10] [--json]

Runs a real llama-server (test model, -t 1), a real X display (Xvfb + trayer) and the real app
(`python -m trayapp --endpoint llamacpp=URL --no-discover`) as a subprocess, then measures the
app process with psutil in four phases of `--seconds` each, in this order:

1. dashboard closed, server idle
2. dashboard closed, a separate client keeps the server generating (back-to-back requests)
3. dashboard open (a second start brings it forward, as a user would), still generating
4. dashboard open, server idle

CPU is the app's user+system time over the phase's wall time, in % of one core; RSS is
sampled every second (mean and peak). Icon and plot redraws per phase come from the app's
LLM_TRAY_TEST_EVENTS file. Needs Xvfb, trayer, xdotool and ImageMagick (tests/provision.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trayrun import BusyClient

from tests.support.llama import LlamaServer
from tests.support.trayapp_process import Event, TrayAppProcess, is_event
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

MIB = 2**20


def _models_in(phase: str) -> Callable[[Event], bool]:
    """A snapshot event where every model is idle (phase "idle") or some model is in `phase`."""

    def match(event: Event) -> bool:
        models = event.get("models")
        if event["event"] != "snapshot" or not isinstance(models, list) or not models:
            return False
        phases = [m["phase"] for m in models]
        return all(p == "idle" for p in phases) if phase == "idle" else phase in phases

    return match


def measure_phase(app: TrayAppProcess, proc: psutil.Process, seconds: float) -> dict[str, float]:
    """CPU % of one core and RSS (mean, peak) of the app over `seconds`, plus its redraw counts."""
    first_event = len(app.events())
    cpu0 = proc.cpu_times()
    t0 = time.monotonic()
    rss: list[int] = []
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        rss.append(proc.memory_info().rss)
    cpu1 = proc.cpu_times()
    elapsed = time.monotonic() - t0
    events = app.events()[first_event:]
    used_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "seconds": elapsed,
        "cpu_pct": used_s / elapsed * 100,
        "rss_mean_mib": sum(rss) / len(rss) / MIB,
        "rss_peak_mib": max(rss) / MIB,
        "snapshots": sum(1 for e in events if e["event"] == "snapshot"),
        "icon_redraws": sum(1 for e in events if e["event"] == "icon"),
        "plot_redraws": sum(1 for e in events if e["event"] == "curve"),
    }


def measure(seconds: float, warmup_s: float, work_dir: Path) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with LlamaServer(threads=1, log_dir=work_dir) as server, XDisplay() as display:
        app = TrayAppProcess(display, server.url, work_dir)
        client: BusyClient | None = None
        try:
            proc = psutil.Process(app.proc.pid)
            app.wait_for("'tray_shown'", is_event("tray_shown"))
            app.wait_for("the first idle snapshot", _models_in("idle"))
            time.sleep(warmup_s)  # start-up work (imports, RAM bandwidth probe) is not steady state
            results["closed, idle"] = measure_phase(app, proc, seconds)

            client = BusyClient(server.url, n_predict=200).start()
            app.skip_to_end()
            app.wait_for("decoding", _models_in("decoding"), 90)
            results["closed, generating"] = measure_phase(app, proc, seconds)

            app.open_dashboard()
            time.sleep(2.0)  # the first full redraw after showing is a one-off
            results["open, generating"] = measure_phase(app, proc, seconds)

            client.stop()
            client = None
            app.skip_to_end()
            app.wait_for("the server idle again", _models_in("idle"), 60)
            results["open, idle"] = measure_phase(app, proc, seconds)
        finally:
            if client is not None:
                client.stop()
            code = app.quit()
    if code != 0:
        raise RuntimeError(f"the app exited with {code}; log: {app.log_path}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after start before measuring")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = xdisplay_tools_missing()
    if missing:
        raise SystemExit(f"missing X display tools: {', '.join(missing)} (tests/provision.sh installs them)")
    with tempfile.TemporaryDirectory(prefix="llm-tray-cost-") as work:
        results = measure(args.seconds, args.warmup, Path(work))
    if args.json:
        print(json.dumps(results))
        return
    print(f"tray app on Xvfb + trayer, {args.seconds:.0f} s per phase (after a {args.warmup:.0f} s warm-up)")
    widths = (-20, 10, 8, 6, 6, 5, 6)
    header = ("dashboard, server", "CPU % core", "RSS MiB", "peak", "snaps", "icon", "plots")
    print(" ".join(f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for phase, r in results.items():
        print(
            f"{phase:<20} {r['cpu_pct']:>10.2f} {r['rss_mean_mib']:>8.0f} {r['rss_peak_mib']:>6.0f} "
            f"{r['snapshots']:>6.0f} {r['icon_redraws']:>5.0f} {r['plot_redraws']:>6.0f}"
        )


if __name__ == "__main__":
    main()
