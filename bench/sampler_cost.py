"""CPU and memory of the headless sampler (`llm-tray watch`) watching a real llama-server.

    python bench/sampler_cost.py [--seconds 60] [--interval 1] [--rounds 1] [--src DIR ...]

Starts a real llama-server with the test model (-t 1), runs `llm-tray watch` against it
at the given interval, keeps the server busy with a bounded series of requests from a
separate client for half of the window (and to the end of the request running then) and
idle for the other half (from 2 s after that request ended), and reports the watcher's own
CPU (% of one core) and peak RSS in steady state (from a warm-up after its first reading):
over both, while generating, and while idle (the issue #26 target: idle real server).

`--src` (repeatable) names llm-tray source trees to compare (this checkout, a `git archive`
of an earlier commit): each round measures one window of each, in rotating order, against
the same server, so a busy shared machine affects them alike. The load average is printed
before and after each window.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.llama import LlamaServer, generate

REPO = Path(__file__).resolve().parents[1]


def _busy(url: str, stop: threading.Event, until_s: float) -> None:
    """Back-to-back 200-token requests until `until_s` (monotonic) or stop."""
    while not stop.is_set() and time.monotonic() < until_s:
        generate(url, "Write about the ocean.", 200, ignore_eos=True)


def _drain(watcher: subprocess.Popen[bytes], first_line: threading.Event) -> None:
    """Read the watcher's output (a reading per line) so it never blocks; flag the first one."""
    assert watcher.stdout is not None
    for _ in watcher.stdout:
        first_line.set()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(
    server_url: str, seconds: float, interval_s: float, src: Path = REPO, warmup_s: float = 8.0
) -> dict[str, float]:
    """One window of `watch` from the source tree `src`: generating for the first half, idle after."""
    home = tempfile.mkdtemp(prefix="llm-tray-bench-")
    env = {**os.environ, "LLM_TRAY_HOME": home, "PYTHONPATH": str(src)}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "trayapp", "watch", "--json", "--interval", str(interval_s),
         "--duration", "3600", "--endpoint", server_url, "--no-discover"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=src,
    )  # fmt: skip
    proc = psutil.Process(watcher.pid)
    started_s = time.monotonic()
    first_line = threading.Event()
    threading.Thread(target=_drain, args=(watcher, first_line), daemon=True).start()
    # The window starts `warmup_s` after the first reading, not after the launch: a fresh home
    # measures the RAM bandwidth first (a few seconds, longer on a busy machine), and the imports
    # and the first tick (the model's GGUF facts) must not fall into the steady-state window.
    if not first_line.wait(120.0):
        watcher.kill()
        raise RuntimeError("watch printed no reading within 120 s")
    startup_s = time.monotonic() - started_s
    stop = threading.Event()
    busy_until = time.monotonic() + warmup_s + seconds / 2
    worker = threading.Thread(target=_busy, args=(server_url, stop, busy_until), daemon=True)
    worker.start()
    time.sleep(warmup_s)
    peak_rss = 0

    def phase(until: Callable[[float], bool]) -> tuple[float, float]:
        """(CPU seconds the watcher used, seconds) until `until(seconds so far)`."""
        nonlocal peak_rss
        cpu0 = proc.cpu_times()
        t0 = time.monotonic()
        while not until(time.monotonic() - t0):
            time.sleep(0.25)
            peak_rss = max(peak_rss, proc.memory_info().rss)
        cpu1 = proc.cpu_times()
        return (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), time.monotonic() - t0

    # Generating: the half window, and on to the end of the request running then.
    busy_used_s, busy_spent_s = phase(lambda _: not worker.is_alive())
    time.sleep(2.0)  # the watcher sees the request end (its last /slots, /metrics and log lines)
    idle_used_s, idle_spent_s = phase(lambda elapsed: elapsed >= seconds / 2)
    stop.set()
    watcher.terminate()
    watcher.wait(timeout=30)
    worker.join(timeout=60)
    total_pct = (busy_used_s + idle_used_s) / (busy_spent_s + idle_spent_s) * 100

    return {
        "cpu_pct_mean": total_pct,
        "cpu_pct_while_generating": busy_used_s / busy_spent_s * 100,
        "cpu_pct_while_idle": idle_used_s / idle_spent_s * 100,
        "generating_window_s": busy_spent_s,
        "idle_window_s": idle_spent_s,
        "peak_rss_mib": peak_rss / 2**20,
        "startup_s": startup_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1, help="windows per source tree")
    parser.add_argument(
        "--src", type=Path, action="append", help="llm-tray source tree (repeatable; default: this one)"
    )
    args = parser.parse_args()
    sources: list[Path] = [p.resolve() for p in args.src] if args.src else [REPO]
    results: dict[Path, list[dict[str, float]]] = {src: [] for src in sources}
    print(
        f"window {args.seconds:.0f} s at {args.interval:g} s interval "
        "(half generating, to the end of the last request, then half idle)"
    )
    with LlamaServer(threads=1) as server:
        for round_no in range(args.rounds):
            order = sources[round_no % len(sources) :] + sources[: round_no % len(sources)]
            for src in order:
                before = _load()
                result = measure(server.url, args.seconds, args.interval, src)
                results[src].append(result)
                print(
                    f"round {round_no + 1} {src}: mean {result['cpu_pct_mean']:.2f} %, generating "
                    f"{result['cpu_pct_while_generating']:.2f} %, idle {result['cpu_pct_while_idle']:.2f} % "
                    f"({result['generating_window_s']:.0f} s + {result['idle_window_s']:.0f} s), "
                    f"first reading after {result['startup_s']:.1f} s, "
                    f"peak RSS {result['peak_rss_mib']:.0f} MiB; "
                    f"load {before} -> {_load()}",
                    flush=True,
                )
    for src, runs in results.items():
        print(f"\n{src} ({len(runs)} windows)")
        for key, label in (
            ("cpu_pct_mean", "watcher CPU, whole window"),
            ("cpu_pct_while_generating", "watcher CPU while generating"),
            ("cpu_pct_while_idle", "watcher CPU while idle"),
        ):
            values = [r[key] for r in runs]
            print(
                f"{label}: median {statistics.median(values):.2f} % of one core "
                f"(min {min(values):.2f}, max {max(values):.2f})"
            )
        print(f"watcher peak RSS: {max(r['peak_rss_mib'] for r in runs):.0f} MiB")


if __name__ == "__main__":
    main()
