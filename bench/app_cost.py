"""CPU, memory and start-up time of the real tray app, beside a bare PySide6 tray in the same run.

    python bench/app_cost.py [--seconds 30] [--warmup 10] [--starts 3] [--as-installed] [--idle-only]
                             [--src DIR] [--json]

Runs a real llama-server (test model, -t 1), a real X display (Xvfb + trayer) and the real app
(`python -m trayapp --endpoint llamacpp=URL --no-discover`) as a subprocess, then measures the
app process with psutil in four phases of `--seconds` each, in this order:

1. dashboard closed, server idle
2. dashboard closed, a separate client keeps the server generating (back-to-back requests)
3. dashboard open (a second start brings it forward, as a user would), still generating
4. dashboard open, server idle

The baseline, on the same display before the app: a bare PySide6 tray (a QSystemTrayIcon
whose number is redrawn every second, nothing else), measured for one phase like the first; the
ratios app ÷ bare are printed. Start-up: `--starts` cold starts of each, from Popen to the icon
docked in trayer's panel (polled with xdotool every 20 ms); the app's starts share one
LLM_TRAY_HOME, so the first of them also makes its config and store.

`--src DIR`: run the app from another source tree (e.g. `git archive HEAD trayapp | tar -x -C DIR`,
to compare a commit with the working tree while others edit it). `--idle-only`: only the first phase.

`--as-installed`: the app as a user runs it, discovery on (the default ports scanned every 30 s) and
a recording proxy configured in front of the server, instead of `--no-discover` and no proxy.

CPU is user+system time over the phase's wall time, in % of one core; RSS is sampled every
second (mean and peak). Icon and plot redraws per phase come from the app's
LLM_TRAY_TEST_EVENTS file. Needs Xvfb, trayer, xdotool and ImageMagick (tests/provision.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trayrun import BusyClient

from tests.support import trayapp_process
from tests.support.llama import LlamaServer, free_port
from tests.support.trayapp_process import Event, Geometry, TrayAppProcess, geometry, inside, is_event
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

MIB = 2**20
DOCK_TIMEOUT_S = 60.0
BARE_CLASS = "bare-tray"
# The baseline: the least a PySide6 tray icon costs (Qt, a QSystemTrayIcon, a number redrawn each second).
BARE_TRAY = """
import signal, sys
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QApplication, QMenu, QSystemTrayIcon
app = QApplication(["bare-tray"])
app.setQuitOnLastWindowClosed(False)
tray = QSystemTrayIcon()
menu = QMenu()
menu.addAction("Quit", app.quit)
tray.setContextMenu(menu)
count = [0]
def redraw():
    pixmap = QPixmap(22, 22)
    pixmap.fill(QColor("#303030"))
    painter = QPainter(pixmap)
    painter.setPen(QColor("white"))
    painter.drawText(pixmap.rect(), Qt.AlignmentFlag.AlignCenter, str(count[0] % 100))
    painter.end()
    tray.setIcon(QIcon(pixmap))
    count[0] += 1
redraw()
tray.show()
timer = QTimer(interval=1000, timeout=redraw)
timer.start()
signal.signal(signal.SIGINT, lambda *_: app.quit())
wake = QTimer(interval=200, timeout=lambda: None)  # lets Python see SIGINT
wake.start()
sys.exit(app.exec())
"""


def _models_in(phase: str) -> Callable[[Event], bool]:
    """A snapshot event where every model is idle (phase "idle") or some model is in `phase`."""

    def match(event: Event) -> bool:
        models = event.get("models")
        if event["event"] != "snapshot" or not isinstance(models, list) or not models:
            return False
        phases = [m["phase"] for m in models]
        return all(p == "idle" for p in phases) if phase == "idle" else phase in phases

    return match


def sample(proc: psutil.Process, seconds: float) -> dict[str, float]:
    """CPU % of one core and RSS (mean, peak) of `proc` over `seconds`."""
    cpu0 = proc.cpu_times()
    t0 = time.monotonic()
    rss: list[int] = []
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        rss.append(proc.memory_info().rss)
    cpu1 = proc.cpu_times()
    elapsed = time.monotonic() - t0
    used_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "seconds": elapsed,
        "cpu_pct": used_s / elapsed * 100,
        "rss_mean_mib": sum(rss) / len(rss) / MIB,
        "rss_peak_mib": max(rss) / MIB,
    }


def docked_icon(display: XDisplay, class_name: str) -> Geometry | None:
    """A small window of `class_name` inside trayer's panel: the icon, docked."""
    found_panels = [geometry(display, w) for w in display.find_windows("trayer")]
    panels = [g for g in found_panels if g is not None and g[2] > 50]  # trayer's other windows are tiny
    for window in display.find_windows(class_name):
        found = geometry(display, window)
        if found is not None and found[2] <= 64 and any(inside(found, panel) for panel in panels):
            return found
    return None


def time_to_dock(display: XDisplay, class_name: str, proc: subprocess.Popen[bytes], t0: float) -> float:
    """Seconds from `t0` (just before Popen) until the icon is docked."""
    deadline = t0 + DOCK_TIMEOUT_S
    while docked_icon(display, class_name) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"{class_name} exited ({proc.returncode}) before its icon docked")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{class_name}: no docked icon within {DOCK_TIMEOUT_S:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def start_bare(display: XDisplay) -> tuple[subprocess.Popen[bytes], float]:
    """The bare tray started; seconds until its icon docked."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", BARE_TRAY],
        env=display.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return proc, time_to_dock(display, BARE_CLASS, proc, t0)
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def measure_bare(display: XDisplay, seconds: float, warmup_s: float, starts: int) -> dict[str, object]:
    """The baseline's start-up times and one idle phase."""
    times = []
    for _ in range(starts):
        proc, took_s = start_bare(display)
        times.append(took_s)
        stop(proc)
    proc, _took = start_bare(display)
    try:
        time.sleep(warmup_s)
        phase = sample(psutil.Process(proc.pid), seconds)
    finally:
        stop(proc)
    return {"start_to_dock_s": times, "idle": phase}


def app_start_times(display: XDisplay, url: str, work_dir: Path, starts: int) -> list[float]:
    """Cold starts of the app to its docked icon (each one quit before the next)."""
    times = []
    for _ in range(starts):
        t0 = time.monotonic()
        app = TrayAppProcess(display, url, work_dir)
        try:
            times.append(time_to_dock(display, "llm-tray", app.proc, t0))
        finally:
            app.quit()
    return times


def measure_phase(app: TrayAppProcess, proc: psutil.Process, seconds: float) -> dict[str, float]:
    """CPU % of one core and RSS (mean, peak) of the app over `seconds`, plus its redraw counts."""
    first_event = len(app.events())
    result = sample(proc, seconds)
    events = app.events()[first_event:]
    return {
        **result,
        "snapshots": sum(1 for e in events if e["event"] == "snapshot"),
        "icon_redraws": sum(1 for e in events if e["event"] == "icon"),
        "plot_redraws": sum(1 for e in events if e["event"] == "curve"),
    }


def as_installed_config(server_url: str) -> str:
    """A recording proxy on a free loopback port in front of the server (README's [[proxies]])."""
    return (
        f'[[proxies]]\nlisten = "127.0.0.1:{free_port()}"\nupstream = "{server_url}"\n'
        'kind = "llamacpp"\nenabled = true\n'
    )


def use_source_tree(src: Path) -> None:
    """The app runs from `src`: its working directory (first on `python -m`'s path) and PYTHONPATH."""
    trayapp_process.REPO = src
    os.environ["PYTHONPATH"] = str(src)


def measure(
    seconds: float, warmup_s: float, starts: int, work_dir: Path, as_installed: bool, idle_only: bool = False
) -> dict[str, Any]:
    results: dict[str, dict[str, float]] = {}
    with LlamaServer(threads=1, log_dir=work_dir) as server, XDisplay() as display:
        bare = measure_bare(display, seconds, warmup_s, starts)
        start_times = app_start_times(display, server.url, work_dir, starts)
        config = as_installed_config(server.url) if as_installed else None
        app = TrayAppProcess(display, server.url, work_dir, config_toml=config, discover=as_installed)
        client: BusyClient | None = None
        try:
            proc = psutil.Process(app.proc.pid)
            app.wait_for("'tray_shown'", is_event("tray_shown"))
            app.wait_for("the first idle snapshot", _models_in("idle"))
            time.sleep(warmup_s)  # start-up work (imports, RAM bandwidth probe) is not steady state
            results["closed, idle"] = measure_phase(app, proc, seconds)
            if not idle_only:
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
    return {
        "phases": results,
        "start_to_dock_s": start_times,
        "bare": bare,
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "as_installed": as_installed,
        "src": str(trayapp_process.REPO),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after start before measuring")
    parser.add_argument("--starts", type=int, default=3, help="cold starts of each to time")
    parser.add_argument("--as-installed", action="store_true", help="discovery on and a proxy configured")
    parser.add_argument("--idle-only", action="store_true", help="only the first phase (closed, idle)")
    parser.add_argument("--src", type=Path, default=None, help="llm-tray source tree to run (default: this)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.src is not None:
        use_source_tree(args.src.resolve())
    missing = xdisplay_tools_missing()
    if missing:
        raise SystemExit(f"missing X display tools: {', '.join(missing)} (tests/provision.sh installs them)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="llm-tray-cost-") as work:
        work_dir = Path(work)
        results = measure(args.seconds, args.warmup, args.starts, work_dir, args.as_installed, args.idle_only)
    results["load_average_before"] = list(load_before)
    if args.json:
        print(json.dumps(results))
        return
    report(results, args.seconds, args.warmup)


def report(results: dict[str, Any], seconds: float, warmup_s: float) -> None:
    phases, bare = results["phases"], results["bare"]
    print(f"tray app on Xvfb + trayer, {seconds:.0f} s per phase (after a {warmup_s:.0f} s warm-up)")
    widths = (-20, 10, 8, 6, 6, 5, 6, 8)
    header = ("dashboard, server", "CPU % core", "RSS MiB", "peak", "snaps", "icon", "plots", "RSS/bare")
    print(" ".join(f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    base = bare["idle"]
    print(
        f"{'bare PySide6 tray':<20} {base['cpu_pct']:>10.2f} {base['rss_mean_mib']:>8.0f} "
        f"{base['rss_peak_mib']:>6.0f} {'':>6} {'':>5} {'':>6} {1:>7.2f}x"
    )
    for phase, r in phases.items():
        print(
            f"{phase:<20} {r['cpu_pct']:>10.2f} {r['rss_mean_mib']:>8.0f} {r['rss_peak_mib']:>6.0f} "
            f"{r['snapshots']:>6.0f} {r['icon_redraws']:>5.0f} {r['plot_redraws']:>6.0f} "
            f"{r['rss_mean_mib'] / base['rss_mean_mib']:>7.2f}x"
        )
    app_s, bare_s = results["start_to_dock_s"], bare["start_to_dock_s"]
    print(
        f"start to docked icon: app {' '.join(f'{t:.2f}' for t in app_s)} s "
        f"(median {statistics.median(app_s):.2f}), bare {' '.join(f'{t:.2f}' for t in bare_s)} s "
        f"(median {statistics.median(bare_s):.2f})"
    )
    before, after = results["load_average_before"], results["load_average"]
    print(
        f"load average (1, 5, 15 min) before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after "
        f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} on {results['cpus']} CPUs"
    )


if __name__ == "__main__":
    main()
