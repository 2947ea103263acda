"""Energy readings and the machine's energy state: the types the sources fill and the meter reads.

Units are in the names (`_j`, `_w`, `_s`). A figure that cannot be measured is None with a reason,
never 0 (issue #21).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnergyReading:
    """One energy domain of this machine read at one tick: a cumulative counter, or only the power
    drawn now (integrated over time, that is an estimate), or neither with the reason."""

    domain: str  # "package-0" (RAPL), "soc" (macmon); GPUs come from GpuReading.energy_j / power_w
    source: str  # "rapl" | "macmon"
    counter_j: float | None = None  # cumulative energy; restarts from 0 past wrap_j when that is set
    wrap_j: float | None = None  # the counter's range (RAPL's max_energy_range_uj, in joules)
    power_w: float | None = None  # power drawn now, where no counter can be read
    reason: str | None = None  # why neither can be read (e.g. RAPL readable by root only)


@dataclass(frozen=True)
class EnergyDomainTotal:
    """The energy one domain used since the monitor started (deltas summed, wraps undone)."""

    domain: str  # "gpu0", "package-0", "soc"
    source: str  # "nvml", "nvml-power", "rapl", "macmon", "amdgpu-power"
    total_j: float
    estimated: bool  # power × time, not a hardware energy counter


@dataclass(frozen=True)
class EnergyStatus:
    """The machine's energy at one tick, for the views: power now, the idle draw, totals per domain."""

    power_w: float | None  # all domains, averaged over the last tick
    idle_w: float | None  # the draw while no server generates (median of idle ticks); None until measured
    domains: tuple[EnergyDomainTotal, ...] = ()
    estimated: bool = False  # some domain is power × time
    reason: str | None = None  # why no energy (or no complete energy) is measured here
