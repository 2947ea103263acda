"""CPU and memory of the headless sampler (`llm-tray watch`) watching a real llama-server.

    python bench/sampler_cost.py [--seconds 60] [--interval 1]

Starts a real llama-server with the test model (-t 1), runs `llm-tray watch` against it
at the given interval, keeps the server busy with a bounded series of requests from a
separate client for half of the window and idle for the other half, and reports the
watcher's own CPU (% of one core) and peak RSS in steady state (after a warm-up).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.llama import LlamaServer, generate


def _busy(url: str, stop: threading.Event, until_s: float) -> None:
    """Back-to-back 200-token requests until `until_s` (monotonic) or stop."""
    while not stop.is_set() and time.monotonic() < until_s:
        generate(url, "Write about the ocean.", 200, ignore_eos=True)


def measure(seconds: float, interval_s: float, warmup_s: float = 8.0) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix="llm-tray-bench-")
    env = {**os.environ, "LLM_TRAY_HOME": home}
    with LlamaServer(threads=1) as server:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "trayapp", "watch", "--json", "--interval", str(interval_s),
             "--duration", str(seconds + warmup_s + 5), "--endpoint", server.url, "--no-discover"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        proc = psutil.Process(watcher.pid)
        stop = threading.Event()
        busy_until = time.monotonic() + warmup_s + seconds / 2
        worker = threading.Thread(target=_busy, args=(server.url, stop, busy_until), daemon=True)
        worker.start()
        time.sleep(warmup_s)
        cpu0 = proc.cpu_times()
        t0 = time.monotonic()
        peak_rss = 0
        samples_busy: list[float] = []
        last = (t0, cpu0.user + cpu0.system)
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            now = time.monotonic()
            times = proc.cpu_times()
            used = times.user + times.system
            if now < busy_until:
                samples_busy.append((used - last[1]) / (now - last[0]) * 100)
            last = (now, used)
            peak_rss = max(peak_rss, proc.memory_info().rss)
        cpu1 = proc.cpu_times()
        elapsed = time.monotonic() - t0
        stop.set()
        watcher.terminate()
        watcher.wait(timeout=30)
    total_pct = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / elapsed * 100
    busy_pct = sum(samples_busy) / len(samples_busy) if samples_busy else float("nan")
    return {"cpu_pct_mean": total_pct, "cpu_pct_while_generating": busy_pct, "peak_rss_mib": peak_rss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    result = measure(args.seconds, args.interval)
    print(f"window {args.seconds:.0f} s at {args.interval:g} s interval (half generating, half idle)")
    print(f"watcher CPU: {result['cpu_pct_mean']:.2f} % of one core on average")
    print(f"watcher CPU while generating: {result['cpu_pct_while_generating']:.2f} % of one core")
    print(f"watcher peak RSS: {result['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
