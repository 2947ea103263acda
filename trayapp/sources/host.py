"""The host: system RAM and CPU load (psutil; RAM from /proc/meminfo on Linux), read each tick on
the sampler thread.

The RAM read bandwidth that goes with a reading is kept by `sources/ram_bandwidth.py`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trayapp.core.hardware_readings import HostReading, RamBandwidthChange, ValueSource
from trayapp.sources.cpu_state import cpu_freq_policies, cpu_frequency_mhz, thermal_max_c, thermal_zones
from trayapp.sources.procfs import read_bytes
from trayapp.sources.relisted import STATIC_REFRESH_S, Relisted

__all__ = ["STATIC_REFRESH_S", "CpuLoad", "HostProbe", "busy_percent", "meminfo_bytes", "ram_bytes"]

_LINUX = sys.platform.startswith("linux")
_MEMINFO_KEYS = (b"MemTotal:", b"MemFree:", b"MemAvailable:")


def meminfo_bytes(path: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(total, available) RAM in bytes from Linux's /proc/meminfo, as psutil.virtual_memory() gives
    them (available above total, as in some containers, is MemFree); None where MemAvailable is
    missing or 0 (kernels before 3.14: psutil estimates it) or the file cannot be read."""
    found: dict[bytes, int] = {}
    try:
        for line in read_bytes(path).splitlines():  # the three come first
            fields = line.split()
            if fields and fields[0] in _MEMINFO_KEYS:
                found[fields[0]] = int(fields[1]) * 1024
                if len(found) == len(_MEMINFO_KEYS):
                    break
    except (OSError, ValueError, IndexError):
        return None
    total, available = found.get(b"MemTotal:"), found.get(b"MemAvailable:")
    if total is None or not available:
        return None
    return total, available if available <= total else found.get(b"MemFree:", 0)


def ram_bytes() -> tuple[int, int]:
    """System RAM (total, available) in bytes: /proc/meminfo's two lines on Linux (a sixth of
    psutil's full parse, issue #26), psutil.virtual_memory() elsewhere or when they are missing."""
    if _LINUX:
        read = meminfo_bytes()
        if read is not None:
            return read
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def proc_stat_cpu_ticks(path: str = "/proc/stat") -> list[int] | None:
    """The whole machine's CPU time by kind, in clock ticks, from /proc/stat's first line (user, nice,
    system, idle, iowait, irq, softirq, steal, guest, guest_nice: as many as the kernel gives); None
    when unreadable."""
    try:
        fields = read_bytes(path, 4096).split(b"\n", 1)[0].split()
        return [int(value) for value in fields[1:11]] if fields[:1] == [b"cpu"] else None
    except (OSError, ValueError):
        return None


def busy_percent(before: list[int], after: list[int]) -> float:
    """The CPU's busy share between two `proc_stat_cpu_ticks()`, as psutil.cpu_percent() computes it:
    negative steps count 0, guest time is already in user and nice, idle and iowait are not busy."""
    deltas = [max(0, b - a) for a, b in zip(before, after, strict=False)]
    total = sum(deltas) - sum(deltas[8:10])
    busy = total - sum(deltas[3:5])
    return round(busy / total * 100, 1) if total else 0.0


class CpuLoad:
    """The CPU's busy % since the last read: from /proc/stat on Linux (a third of psutil's cost, issue
    #26), psutil.cpu_percent(interval=None) elsewhere or where /proc/stat cannot be read."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self._path = path
        self._last = proc_stat_cpu_ticks(path) if _LINUX else None
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval

    def percent(self) -> float:
        now = proc_stat_cpu_ticks(self._path) if self._last is not None else None
        if now is None or self._last is None:
            return float(psutil.cpu_percent(interval=None))
        before, self._last = self._last, now
        return busy_percent(before, now)


class HostProbe:
    """System RAM, CPU load, clock and temperature.

    What hardly ever changes (the core count, the thermal zones, the CPU frequency policies) is
    looked up again every STATIC_REFRESH_S, not every tick (issue #26): a CPU brought online shows at
    most that much later. So is the clock of a Linux CPU without cpufreq policies (a VM): it has no
    maximum, so it cannot show throttling, and /proc/cpuinfo is the dearest file a tick would read.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cpu_load = CpuLoad()
        self._cpu_count = Relisted(lambda: psutil.cpu_count(logical=True), clock)
        self._zones = Relisted(thermal_zones, clock)
        self._freq_policies = Relisted(cpu_freq_policies, clock) if _LINUX else None
        self._freq_without_policies = Relisted(lambda: cpu_frequency_mhz([]), clock)

    def read(
        self,
        ram_bandwidth_gbps: float | None = None,
        ram_bandwidth_source: ValueSource = "unknown",
        ram_bandwidth_measured_wall_s: float | None = None,
        ram_bandwidth_confidence: str | None = None,
        ram_bandwidth_change: RamBandwidthChange | None = None,
    ) -> HostReading:
        total_bytes, available_bytes = ram_bytes()
        known = bool(ram_bandwidth_gbps)
        policies = self._freq_policies.get() if self._freq_policies is not None else None
        if policies is not None and not policies:
            freq_mhz, freq_max_mhz = self._freq_without_policies.get()
        else:
            freq_mhz, freq_max_mhz = cpu_frequency_mhz(policies)
        return HostReading(
            ram_total_bytes=total_bytes,
            ram_available_bytes=available_bytes,
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if known else "unknown",
            cpu_percent=self._cpu_load.percent(),
            cpu_count=self._cpu_count.get(),
            ram_bandwidth_measured_wall_s=ram_bandwidth_measured_wall_s if known else None,
            ram_bandwidth_confidence=ram_bandwidth_confidence if known else None,
            ram_bandwidth_change=ram_bandwidth_change if known else None,
            cpu_freq_mhz=freq_mhz,
            cpu_freq_max_mhz=freq_max_mhz,
            thermal_max_c=thermal_max_c(zones=self._zones.get()),
        )

    def close(self) -> None:
        pass
