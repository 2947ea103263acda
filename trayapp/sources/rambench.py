"""RAM read-bandwidth benchmark, run as a short-lived subprocess.

    python -m trayapp.sources.rambench [--budget-s 0.5] [--skip-if-busy-pct 25]

prints one JSON line: {"gbps", "busy_cpu_pct", "runs", "buffer_bytes",
"threads", "peak_rss_bytes"} ("gbps" is null when the machine was busy and
--skip-if-busy-pct asked to skip). numpy is imported only here, so it never
loads in the app, and the buffer's memory goes back to the OS when this
process ends. `trayapp.sources.ram_bandwidth.run_rambench` starts it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from trayapp.core.units import GB

MIN_BUFFER_BYTES = 64 * 2**20
MAX_BUFFER_BYTES = 256 * 2**20
FALLBACK_LLC_BYTES = 32 * 2**20
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def last_level_cache_bytes(sysfs_cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the largest CPU cache: Linux sysfs, else os.sysconf, else 32 MiB."""
    sizes = []
    for size_file in sysfs_cpu.glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
        except OSError:
            continue
        if text and text[-1] in _UNITS and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * _UNITS[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    if not sizes and sysfs_cpu == Path("/sys/devices/system/cpu/cpu0/cache"):
        for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
            try:
                value = os.sysconf(name)
            except (ValueError, OSError, AttributeError):
                continue
            if value > 0:
                sizes.append(value)
                break
    return max(sizes, default=FALLBACK_LLC_BYTES)


def buffer_bytes_for(llc_bytes: int) -> int:
    """The benchmark buffer: 8× the last-level cache, at least 64 MiB, at most 256 MiB."""
    return min(MAX_BUFFER_BYTES, max(MIN_BUFFER_BYTES, 8 * llc_bytes))


def busy_cpu_pct_of_others(interval_s: float = 0.5, own_pids: tuple[int, ...] = ()) -> float:
    """Share of all cores (0..100) busy over `interval_s`, minus this process and `own_pids`."""
    own = [psutil.Process()]
    for pid in own_pids:
        with contextlib.suppress(psutil.Error):
            own.append(psutil.Process(pid))

    def own_cpu_s() -> float:
        total = 0.0
        for proc in own:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def busy_and_total_s() -> tuple[float, float]:
        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        total = sum(times)
        # guest time is already counted in user on Linux
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        return total - idle, total

    busy0, total0 = busy_and_total_s()
    own0 = own_cpu_s()
    time.sleep(interval_s)
    busy1, total1 = busy_and_total_s()
    own1 = own_cpu_s()
    total = total1 - total0
    if total <= 0:
        return 0.0
    others = (busy1 - busy0) - (own1 - own0)
    return round(min(100.0, max(0.0, 100.0 * others / total)), 1)


def default_threads() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def measure(
    budget_s: float = 0.5, threads: int | None = None, buffer_bytes: int | None = None
) -> tuple[float, int]:
    """(read GB/s (10^9 B/s) with all cores, timed runs): the best run within `budget_s`.

    Each thread sums its own disjoint slice of one float64 array (numpy
    releases the GIL for large reductions), so the probe reads memory the way
    decode does. The first run only warms the pages and the threads.
    """
    import numpy as np

    threads = max(1, threads or default_threads())
    if buffer_bytes is None:
        buffer_bytes = buffer_bytes_for(last_level_cache_bytes())
    data = np.ones(buffer_bytes // 8, dtype=np.float64)
    slices = np.array_split(data, threads)
    best_s = math.inf
    passes = 0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ram-bandwidth") as pool:
        deadline = time.perf_counter() + budget_s
        while passes < 3 or (time.perf_counter() < deadline and passes < 50):
            start = time.perf_counter()
            list(pool.map(np.sum, slices))
            elapsed = time.perf_counter() - start
            if passes > 0:
                best_s = min(best_s, elapsed)
            passes += 1
    return data.nbytes / best_s / GB, passes - 1


def peak_rss_bytes(status_path: Path = Path("/proc/self/status")) -> int | None:
    """This process's peak resident memory.

    On Linux from `VmHWM` (this program's own memory): `ru_maxrss` survives `exec`, so a benchmark
    started from a big parent (a test runner, the app) would report the parent's peak. Elsewhere
    `ru_maxrss` (bytes on macOS); None on Windows.
    """
    try:
        for line in status_path.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # "VmHWM:  299176 kB"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trayapp.sources.rambench")
    parser.add_argument("--budget-s", type=float, default=0.5)
    parser.add_argument("--busy-interval-s", type=float, default=0.5)
    parser.add_argument("--skip-if-busy-pct", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--buffer-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    # Our own: this process and the app that started it.
    busy_pct = busy_cpu_pct_of_others(args.busy_interval_s, own_pids=(os.getppid(),))
    buffer_bytes = args.buffer_bytes or buffer_bytes_for(last_level_cache_bytes())
    threads = max(1, args.threads or default_threads())
    result: dict[str, object] = {
        "gbps": None,
        "busy_cpu_pct": busy_pct,
        "runs": 0,
        "buffer_bytes": buffer_bytes,
        "threads": threads,
    }
    if args.skip_if_busy_pct is None or busy_pct <= args.skip_if_busy_pct:
        gbps, runs = measure(args.budget_s, threads, buffer_bytes)
        result.update(gbps=round(gbps, 3), runs=runs)
    result["peak_rss_bytes"] = peak_rss_bytes()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
