"""Resolve "the machine that runs the model" from readings and user overrides.

The ceiling needs a few numbers: the bandwidth of the memory that holds the
weights, its capacity, and the RAM bandwidth for layers that spill to the CPU.
They come from NVML / tables / a measurement, or from the user's flags
(`--gpu`, `--bandwidth-gbps`, `--vram-gb`, `--ram-bandwidth-gbps`) for a
server on another machine. Each figure keeps its source so the UI can say
whether it is measured or a spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from trayapp.core.hardware_readings import HardwareProfile, HardwareSnapshot, RamBandwidthChange

GpuLookup = Callable[[str], "tuple[float, int | None] | None"]  # name -> (bandwidth_gbps, vram_bytes)

CPU_ONLY_LABEL = "CPU (system RAM)"  # a machine without a GPU: the weights live in system RAM


@dataclass(frozen=True)
class Machine:
    """The memory system a model runs from.

    `fast_bandwidth_gbps` / `fast_capacity_bytes` describe where the weights
    should live: the GPU(s), unified memory, or — with no GPU — system RAM.
    `ram_bandwidth_gbps` is what CPU-resident layers run at after a spill.
    """

    label: str
    fast_bandwidth_gbps: float | None
    fast_capacity_bytes: int | None
    ram_bandwidth_gbps: float | None
    has_gpu: bool
    unified_memory: bool = False
    gpu_bandwidths_gbps: tuple[float, ...] = ()
    kv_type: str = "f16"
    sources: Mapping[str, str] = field(default_factory=dict)


def resolve_machine(
    hardware: HardwareSnapshot | None,
    profile: HardwareProfile | None = None,
    gpu_lookup: GpuLookup | None = None,
) -> Machine:
    """Combine readings with overrides; an override always wins over a reading."""
    profile = profile or HardwareProfile()
    sources: dict[str, str] = {}
    gpus = hardware.gpus if hardware else ()
    host = hardware.host if hardware else None

    ram_bw = profile.ram_bandwidth_gbps
    if ram_bw is not None:
        sources["ram_bandwidth"] = "given"
    elif host is not None and host.ram_bandwidth_gbps:
        ram_bw = host.ram_bandwidth_gbps
        sources["ram_bandwidth"] = host.ram_bandwidth_source

    # An explicit GPU description replaces whatever was detected.
    if profile.gpu_name or profile.bandwidth_gbps is not None:
        bw = profile.bandwidth_gbps
        vram = profile.vram_bytes
        label = profile.gpu_name or "given GPU"
        if profile.gpu_name and gpu_lookup is not None:
            found = gpu_lookup(profile.gpu_name)
            if found is not None:
                if bw is None:
                    bw = found[0]
                    sources["bandwidth"] = "table"
                if vram is None:
                    vram = found[1]
                    sources["capacity"] = "table" if vram else "unknown"
        if "bandwidth" not in sources:
            sources["bandwidth"] = "given" if bw is not None else "unknown"
        if "capacity" not in sources:
            sources["capacity"] = "given" if vram is not None else "unknown"
        unified = _is_unified_name(label)
        return Machine(
            label=label,
            fast_bandwidth_gbps=bw,
            fast_capacity_bytes=vram,
            ram_bandwidth_gbps=ram_bw if not unified else bw,
            has_gpu=True,
            unified_memory=unified,
            gpu_bandwidths_gbps=(bw,) if bw else (),
            kv_type=profile.kv_type,
            sources=sources,
        )

    if gpus:
        bws = tuple(g.bandwidth_gbps for g in gpus if g.bandwidth_gbps)
        # Layer split (llama.cpp default): devices are read one after another, so the
        # single-stream rate is set by the slowest; use the minimum as the fast tier.
        bw = min(bws) if bws else None
        totals = [g.vram_total_bytes for g in gpus if g.vram_total_bytes]
        vram = sum(totals) if totals else None
        if profile.vram_bytes is not None:
            vram = profile.vram_bytes
            sources["capacity"] = "given"
        else:
            sources["capacity"] = "nvml" if gpus[0].vendor == "nvidia" else "spec"
        sources["bandwidth"] = gpus[0].bandwidth_source
        unified = any(g.unified_memory for g in gpus)
        names = ", ".join(g.name for g in gpus)
        return Machine(
            label=names,
            fast_bandwidth_gbps=bw,
            fast_capacity_bytes=vram,
            ram_bandwidth_gbps=(bw if unified else ram_bw),
            has_gpu=True,
            unified_memory=unified,
            gpu_bandwidths_gbps=bws,
            kv_type=profile.kv_type,
            sources=sources,
        )

    # CPU only: the weights live in system RAM.
    capacity = profile.vram_bytes
    if capacity is None and host is not None:
        capacity = host.ram_total_bytes
    sources["bandwidth"] = sources.get("ram_bandwidth", "unknown")
    sources["capacity"] = "given" if profile.vram_bytes is not None else "psutil"
    return Machine(
        label=CPU_ONLY_LABEL,
        fast_bandwidth_gbps=ram_bw,
        fast_capacity_bytes=capacity,
        ram_bandwidth_gbps=ram_bw,
        has_gpu=False,
        unified_memory=True,
        kv_type=profile.kv_type,
        sources=sources,
    )


def _is_unified_name(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("apple", "m1", "m2", "m3", "m4", "m5")) or "strix halo" in lowered


def ram_bandwidth_change_line(change: RamBandwidthChange | None, now_wall_s: float) -> str | None:
    """'ceiling changed 28.4 → 31.3 GB/s RAM at 14:02 UTC: first quiet measurement' (with the date
    when it was not today, UTC); None when the measured RAM bandwidth never changed."""
    if change is None:
        return None
    at = datetime.fromtimestamp(change.changed_at_wall_s, tz=timezone.utc)
    today = datetime.fromtimestamp(now_wall_s, tz=timezone.utc).date() == at.date()
    when = at.strftime("%H:%M" if today else "%Y-%m-%d %H:%M")
    return (
        f"ceiling changed {change.previous_gbps:.1f} → {change.gbps:.1f} GB/s RAM at {when} UTC: "
        f"{change.reason}"
    )
