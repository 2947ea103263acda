"""Immutable readings of the hardware: what the hardware probe (trayapp/sources/hardware.py)
returns from one poll of the GPUs and the host, and the machine a user describes.

They hold raw counters and facts, no rates. Units are in the names (`_bytes`, `_gbps`, `_mhz`,
`_c`, `_w`, `_j`). `None` means "unknown"; where it matters a `reason` string says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from trayapp.core.energy_types import EnergyReading

ValueSource = Literal["measured", "spec", "nvml", "given", "table", "unknown"]

VALUE_SOURCES: tuple[ValueSource, ...] = get_args(ValueSource)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str | None  # None: gone or unnamed; core/vram_holders.OTHER_USER: another user's, unreadable
    used_bytes: int | None  # None: the driver does not say (NVML under Windows WDDM): "unavailable", never 0


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    vendor: str  # "nvidia" | "amd" | "apple" | "other"
    vram_total_bytes: int | None
    vram_used_bytes: int | None
    bandwidth_gbps: float | None
    bandwidth_source: ValueSource = "unknown"
    unified_memory: bool = False
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    clocks_event_reasons: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # human names of the active slowdown reasons
    processes_rss: bool = False  # Apple (unified memory): `processes` are the largest users of RAM by RSS
    memory_pressure: str | None = None  # Apple: the kernel's memory pressure: normal | warning | critical
    energy_j: float | None = None  # NVML's total-energy counter since the driver loaded; None: not supported
    power_limit_w: float | None = None  # the enforced power limit (NVML)
    sm_clock_mhz: float | None = None  # SM clock now, and its maximum (NVML_CLOCK_SM)
    sm_clock_max_mhz: float | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class RamBandwidthChange:
    """The last time the RAM bandwidth behind the ceiling changed: from what, to what, when and why
    ("first quiet measurement", "hardware changed", "decode faster than the ceiling allowed", …)."""

    previous_gbps: float
    gbps: float
    changed_at_wall_s: float
    reason: str


@dataclass(frozen=True)
class HostReading:
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    ram_bandwidth_gbps: float | None
    ram_bandwidth_source: ValueSource = "unknown"
    cpu_percent: float | None = None
    cpu_count: int | None = None
    ram_bandwidth_measured_wall_s: float | None = None  # when a measured figure was measured
    ram_bandwidth_confidence: str | None = None  # measured: "quiet" | "provisional" (busy) | "suspect"
    ram_bandwidth_change: RamBandwidthChange | None = None  # its last change, for the UI to say so
    cpu_freq_mhz: float | None = None  # CPU frequency now and its maximum, where readable
    cpu_freq_max_mhz: float | None = None
    thermal_max_c: float | None = None  # the hottest thermal zone, where readable


@dataclass(frozen=True)
class HardwareSnapshot:
    gpus: tuple[GpuReading, ...]
    host: HostReading
    gpu_reason: str | None = None  # why no GPU is listed, e.g. "NVML library not found"
    energy: tuple[EnergyReading, ...] = ()  # RAPL packages, macmon's SoC (GPUs carry their own)
    energy_reason: str | None = None  # why no host energy is read (no RAPL, not readable, no macmon)


@dataclass(frozen=True)
class HardwareProfile:
    """The machine a server runs on, when the user describes it (remote box, overrides)."""

    gpu_name: str | None = None
    bandwidth_gbps: float | None = None
    vram_bytes: int | None = None
    ram_bandwidth_gbps: float | None = None
    kv_type: str = "f16"

    def overridden_by(self, override: HardwareProfile | None) -> HardwareProfile:
        """This profile with what `override` states (a command line's flags over the config's)."""
        if override is None:
            return self
        return HardwareProfile(
            gpu_name=override.gpu_name or self.gpu_name,
            bandwidth_gbps=(
                override.bandwidth_gbps if override.bandwidth_gbps is not None else self.bandwidth_gbps
            ),
            vram_bytes=override.vram_bytes if override.vram_bytes is not None else self.vram_bytes,
            ram_bandwidth_gbps=(
                override.ram_bandwidth_gbps
                if override.ram_bandwidth_gbps is not None
                else self.ram_bandwidth_gbps
            ),
            kv_type=override.kv_type if override.kv_type != "f16" else self.kv_type,
        )
