"""Is the hardware held back? The driver's own evidence, as words a finding can give as its cause.

A GPU is held back when NVML names an active slowdown reason (`GpuReading.throttle_reasons`:
software power cap, hardware slowdown, thermal, power brake); the evidence adds what the driver
reads beside it: the enforced power limit against the draw, the SM clock against its maximum, the
temperature ("power-capped at 400 W, drawing 398 W, SM clock 1.6 of 2.4 GHz"). A CPU is held back
when its clock sits well under its maximum while a thermal zone is hot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading

POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake"})
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})
CPU_SLOW_SHARE = 0.7  # a CPU under 70 % of its maximum clock …
CPU_HOT_C = 90.0  # … while a thermal zone is this hot is thermally throttled


@dataclass(frozen=True)
class Throttle:
    """What holds the hardware back, in words and as evidence."""

    text: str  # "GPU 0 power-capped at 400 W, drawing 398 W, SM clock 1.6 of 2.4 GHz"
    evidence: dict[str, object] = field(default_factory=dict)


def gpu_throttle_text(gpu: GpuReading) -> str | None:
    """One GPU's slowdown in words, or None when the driver names no slowdown reason."""
    reasons = set(gpu.throttle_reasons)
    if not reasons:
        return None
    parts: list[str] = []
    if reasons & POWER_REASONS:
        capped = "power-capped" if "sw_power_cap" in reasons else "power-braked"
        if gpu.power_limit_w is not None:
            capped += f" at {gpu.power_limit_w:.0f} W"
        if gpu.power_w is not None:
            capped += f", drawing {gpu.power_w:.0f} W"
        parts.append(capped)
    if reasons & THERMAL_REASONS:
        hot = "thermally throttled"
        if gpu.temperature_c is not None:
            hot += f" at {gpu.temperature_c:.0f} °C"
        parts.append(hot)
    if "hw_slowdown" in reasons:
        parts.append("slowed by the hardware (overheating or an external power brake)")
    if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz:
        parts.append(f"SM clock {gpu.sm_clock_mhz / 1000:.1f} of {gpu.sm_clock_max_mhz / 1000:.1f} GHz")
    return ", ".join(parts)


def cpu_throttle_text(host: HostReading) -> str | None:
    """The CPU's slowdown in words: well under its maximum clock while hot; None otherwise or unknown."""
    now, top, hot = host.cpu_freq_mhz, host.cpu_freq_max_mhz, host.thermal_max_c
    if now is None or not top or hot is None or now >= CPU_SLOW_SHARE * top or hot < CPU_HOT_C:
        return None
    return f"the CPU runs at {now / 1000:.1f} of {top / 1000:.1f} GHz at {hot:.0f} °C (thermal throttling)"


def throttle_cause(hardware: HardwareSnapshot, gpus_used: Sequence[int] | None = None) -> Throttle | None:
    """What holds this machine back now: its throttled GPUs (of `gpus_used`, default all) with their
    evidence, else a throttled CPU; None when the drivers name nothing."""
    texts: list[str] = []
    evidence: dict[str, object] = {}
    gpus = [g for g in hardware.gpus if gpus_used is None or g.index in gpus_used]
    for gpu in gpus:
        text = gpu_throttle_text(gpu)
        if text is None:
            continue
        label = f"GPU {gpu.index}" if len(hardware.gpus) > 1 else "the GPU is"
        texts.append(f"{label} {text}")
        evidence[f"gpu{gpu.index}"] = {
            "reasons": list(gpu.throttle_reasons),
            "power_w": gpu.power_w,
            "power_limit_w": gpu.power_limit_w,
            "sm_clock_mhz": gpu.sm_clock_mhz,
            "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
            "temperature_c": gpu.temperature_c,
        }
    if not texts:
        cpu = cpu_throttle_text(hardware.host)
        if cpu is None:
            return None
        texts.append(cpu)
        evidence["cpu"] = {
            "freq_mhz": hardware.host.cpu_freq_mhz,
            "freq_max_mhz": hardware.host.cpu_freq_max_mhz,
            "thermal_max_c": hardware.host.thermal_max_c,
        }
    return Throttle("; ".join(texts), evidence)
