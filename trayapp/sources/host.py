"""The host: system RAM and CPU load through psutil, read each tick on the sampler thread.

The RAM read bandwidth that goes with a reading is kept by `sources/ram_bandwidth.py`.
"""

from __future__ import annotations

import psutil

from trayapp.core.model import HostReading, RamBandwidthChange, ValueSource
from trayapp.sources.cpu_state import cpu_frequency_mhz, thermal_max_c


class HostProbe:
    """System RAM and CPU load, read through psutil."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval

    def read(
        self,
        ram_bandwidth_gbps: float | None = None,
        ram_bandwidth_source: ValueSource = "unknown",
        ram_bandwidth_measured_wall_s: float | None = None,
        ram_bandwidth_confidence: str | None = None,
        ram_bandwidth_change: RamBandwidthChange | None = None,
    ) -> HostReading:
        vm = psutil.virtual_memory()
        known = bool(ram_bandwidth_gbps)
        freq_mhz, freq_max_mhz = cpu_frequency_mhz()
        return HostReading(
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if known else "unknown",
            cpu_percent=psutil.cpu_percent(interval=None),
            cpu_count=psutil.cpu_count(logical=True),
            ram_bandwidth_measured_wall_s=ram_bandwidth_measured_wall_s if known else None,
            ram_bandwidth_confidence=ram_bandwidth_confidence if known else None,
            ram_bandwidth_change=ram_bandwidth_change if known else None,
            cpu_freq_mhz=freq_mhz,
            cpu_freq_max_mhz=freq_max_mhz,
            thermal_max_c=thermal_max_c(),
        )

    def close(self) -> None:
        pass
