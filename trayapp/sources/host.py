"""The host: system RAM and CPU load through psutil, read each tick on the sampler thread.

The RAM read bandwidth that goes with a reading is kept by `sources/ram_bandwidth.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trayapp.core.model import HostReading, RamBandwidthChange, ValueSource
from trayapp.sources.cpu_state import cpu_frequency_mhz, thermal_max_c, thermal_zones

# What hardly ever changes (the core count, the list of thermal zones) is looked up again this often,
# not every tick (issue #26): a CPU brought online shows at most this much later.
STATIC_REFRESH_S = 60.0


class HostProbe:
    """System RAM and CPU load, read through psutil."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval
        self._clock = clock
        self._static_at_s: float | None = None
        self._cpu_count: int | None = None
        self._zones: list[Path] = []

    def _refresh_static(self) -> None:
        now_s = self._clock()
        if self._static_at_s is None or now_s - self._static_at_s >= STATIC_REFRESH_S:
            self._static_at_s = now_s
            self._cpu_count = psutil.cpu_count(logical=True)
            self._zones = thermal_zones()

    def read(
        self,
        ram_bandwidth_gbps: float | None = None,
        ram_bandwidth_source: ValueSource = "unknown",
        ram_bandwidth_measured_wall_s: float | None = None,
        ram_bandwidth_confidence: str | None = None,
        ram_bandwidth_change: RamBandwidthChange | None = None,
    ) -> HostReading:
        self._refresh_static()
        vm = psutil.virtual_memory()
        known = bool(ram_bandwidth_gbps)
        freq_mhz, freq_max_mhz = cpu_frequency_mhz()
        return HostReading(
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if known else "unknown",
            cpu_percent=psutil.cpu_percent(interval=None),
            cpu_count=self._cpu_count,
            ram_bandwidth_measured_wall_s=ram_bandwidth_measured_wall_s if known else None,
            ram_bandwidth_confidence=ram_bandwidth_confidence if known else None,
            ram_bandwidth_change=ram_bandwidth_change if known else None,
            cpu_freq_mhz=freq_mhz,
            cpu_freq_max_mhz=freq_max_mhz,
            thermal_max_c=thermal_max_c(zones=self._zones),
        )

    def close(self) -> None:
        pass
