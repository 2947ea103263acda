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

from trayapp.core.model import HostReading, RamBandwidthChange, ValueSource
from trayapp.sources.cpu_state import cpu_freq_policies, cpu_frequency_mhz, thermal_max_c, thermal_zones
from trayapp.sources.relisted import STATIC_REFRESH_S, Relisted

__all__ = ["STATIC_REFRESH_S", "HostProbe", "meminfo_bytes", "ram_bytes"]

_LINUX = sys.platform.startswith("linux")
_MEMINFO_KEYS = (b"MemTotal:", b"MemFree:", b"MemAvailable:")


def meminfo_bytes(path: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(total, available) RAM in bytes from Linux's /proc/meminfo, as psutil.virtual_memory() gives
    them (available above total, as in some containers, is MemFree); None where MemAvailable is
    missing or 0 (kernels before 3.14: psutil estimates it) or the file cannot be read."""
    found: dict[bytes, int] = {}
    try:
        with open(path, "rb") as file:
            for line in file:  # the three come first
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


class HostProbe:
    """System RAM, CPU load, clock and temperature.

    What hardly ever changes (the core count, the thermal zones, the CPU frequency policies) is
    looked up again every STATIC_REFRESH_S, not every tick (issue #26): a CPU brought online shows at
    most that much later.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval
        self._cpu_count = Relisted(lambda: psutil.cpu_count(logical=True), clock)
        self._zones = Relisted(thermal_zones, clock)
        self._freq_policies = Relisted(cpu_freq_policies, clock) if _LINUX else None

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
        freq_mhz, freq_max_mhz = cpu_frequency_mhz(policies)
        return HostReading(
            ram_total_bytes=total_bytes,
            ram_available_bytes=available_bytes,
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if known else "unknown",
            cpu_percent=psutil.cpu_percent(interval=None),
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
