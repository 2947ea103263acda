"""The host: RAM and CPU through psutil, and a measured RAM read bandwidth.

`measure_ram_bandwidth_gbps()` and `cached_ram_bandwidth()` take about half a
second of all cores and a few hundred MiB of memory. Never call them on the GUI
thread; the caller runs them once on a worker and hands the figure to
`HardwareProbe.set_ram_bandwidth()`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil

from trayapp.core.model import HostReading, ValueSource

MIN_ARRAY_BYTES = 256 * 2**20
MAX_ARRAY_BYTES = 1024 * 2**20
_FALLBACK_LLC_BYTES = 32 * 2**20


class HostProbe:
    """System RAM and CPU load, read through psutil."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval

    def read(
        self, ram_bandwidth_gbps: float | None = None, ram_bandwidth_source: ValueSource = "unknown"
    ) -> HostReading:
        vm = psutil.virtual_memory()
        return HostReading(
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if ram_bandwidth_gbps else "unknown",
            cpu_percent=psutil.cpu_percent(interval=None),
            cpu_count=psutil.cpu_count(logical=True),
        )

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- RAM bandwidth


def last_level_cache_bytes(sysfs_cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the largest CPU cache (Linux sysfs), or 32 MiB where it cannot be read."""
    sizes = []
    for size_file in sysfs_cpu.glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=_FALLBACK_LLC_BYTES)


def _default_threads() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def measure_ram_bandwidth_gbps(
    budget_s: float = 0.5, threads: int | None = None, array_bytes: int | None = None
) -> float:
    """RAM read bandwidth in GB/s (10^9 B/s), measured with all cores. Blocking: never on the GUI thread.

    Each thread sums its own disjoint slice of one float64 array (numpy
    releases the GIL for large reductions), so the probe reads memory the way
    decode does. The array is at least 256 MiB and 8× the last-level cache
    (at most 1 GiB); the result is the best pass within `budget_s`, after one
    warm-up pass.
    """
    threads = max(1, threads or _default_threads())
    if array_bytes is None:
        array_bytes = min(MAX_ARRAY_BYTES, max(MIN_ARRAY_BYTES, 8 * last_level_cache_bytes()))
    data = np.ones(array_bytes // 8, dtype=np.float64)
    slices = np.array_split(data, threads)
    best_s = math.inf
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ram-bandwidth") as pool:
        passes = 0
        deadline = time.perf_counter() + budget_s
        while passes < 3 or (time.perf_counter() < deadline and passes < 50):
            start = time.perf_counter()
            list(pool.map(np.sum, slices))
            elapsed = time.perf_counter() - start
            if passes > 0:  # the first pass warms the pages and the threads
                best_s = min(best_s, elapsed)
            passes += 1
    return data.nbytes / best_s / 1e9


def _fingerprint() -> dict[str, object]:
    """What a cached measurement belongs to: a new CPU or more RAM invalidates it."""
    return {
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": int(psutil.virtual_memory().total),
    }


def cached_ram_bandwidth(
    cache_path: Path,
    max_age_s: float = 7 * 86400,
    measure: Callable[[], float] = measure_ram_bandwidth_gbps,
    now_s: float | None = None,
) -> tuple[float, str, float]:
    """(gbps, "measured", measured_wall_s), from `cache_path` when fresh, else measured and stored.

    A missing, corrupt, stale or foreign cache (other CPU/RAM) is re-measured.
    Blocking (it may measure): never on the GUI thread.
    """
    now_s = time.time() if now_s is None else now_s
    fingerprint = _fingerprint()
    try:
        cached = json.loads(cache_path.read_text(encoding="utf-8"))
        gbps = float(cached["gbps"])
        measured_s = float(cached["measured_wall_s"])
        if (
            math.isfinite(gbps)
            and gbps > 0
            and 0 <= now_s - measured_s <= max_age_s
            and cached.get("fingerprint") == fingerprint
        ):
            return gbps, "measured", measured_s
    except (OSError, ValueError, TypeError, KeyError):
        pass
    gbps = float(measure())
    record = {
        "gbps": gbps,
        "source": "measured",
        "measured_wall_s": now_s,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s)),
        "fingerprint": fingerprint,
    }
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(cache_path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, cache_path)
    except OSError:
        pass  # an unwritable cache costs a re-measurement next time, nothing more
    return gbps, "measured", now_s


def default_ram_bandwidth() -> tuple[float, str]:
    """(gbps, source) from the cache, measured at most once a week. Blocking: never on the GUI thread."""
    from trayapp import paths

    gbps, source, _ = cached_ram_bandwidth(paths.cache_dir() / "ram_bandwidth.json")
    return gbps, source
