"""The placement stage: where a model's weights sit, what is known of them, and its ceiling.

One place decides, per model and tick:

* its facts (exact from the model file, or estimated from the size the server reports);
* its share in GPU memory (`gpu_fraction`) and where that share came from;
* its ceiling, through `ceiling_for`, the one ceiling rule used for live statuses, request
  records, session records and the detectors alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trayapp.core import physics
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.machine import Machine
from trayapp.core.model import ModelFacts, ModelReading

FULL_GPU_SNAP = 0.9  # NVML shares at or above this are read as "all on the GPU" (see _nvml_share)

ShareSource = Literal["server", "nvml"]


@dataclass(frozen=True)
class Placement:
    facts: ModelFacts | None  # exact, or estimated from the server's size (`facts.exact` says which)
    gpu_fraction: float | None  # share of the model in GPU memory; None: unknown
    gpu_fraction_source: ShareSource | None
    vram_bytes: int | None  # the model's bytes in GPU memory, as the server or NVML reports them
    ceiling_tok_s: float | None  # at the live context and the split in force
    full_gpu_ceiling_tok_s: float | None  # same context, everything in fast memory


def effective_gpu_fraction(machine: Machine, gpu_fraction: float | None) -> float:
    """The share the ceiling uses: unified memory and CPU-only machines have one memory (1.0);
    an unknown share on a GPU machine is taken as "all on the GPU"."""
    if machine.unified_memory or not machine.has_gpu or gpu_fraction is None:
        return 1.0
    return gpu_fraction


def ceiling_for(
    facts: ModelFacts | None, context_tokens: int | None, machine: Machine, gpu_fraction: float | None
) -> float | None:
    """The decode ceiling (tok/s) of a model at a context depth on a machine, for its GPU share."""
    if facts is None:
        return None
    return physics.ceiling_at_context_tok_s(
        facts,
        context_tokens or 0,
        machine.fast_bandwidth_gbps,
        machine.kv_type,
        effective_gpu_fraction(machine, gpu_fraction),
        machine.ram_bandwidth_gbps,
    )


def server_gpu_fraction(size_bytes: int | None, vram_bytes: int | None) -> float | None:
    """The GPU share from the sizes a server reports (Ollama's `size_vram` / `size`).

    A size of 0 (which `ollama ps` shows as unknown) or a VRAM part larger than the whole is not a
    share: unknown, never "100 % GPU".
    """
    if not size_bytes or size_bytes <= 0 or vram_bytes is None or vram_bytes < 0 or vram_bytes > size_bytes:
        return None
    return vram_bytes / size_bytes


def weights_bytes(model: ModelReading) -> int | None:
    """The weights' size: exact facts first, then what the server reports, then estimated facts."""
    facts = model.facts
    if facts is not None and facts.exact:
        return facts.weights_bytes
    return model.weights_bytes or (facts.weights_bytes if facts is not None else None)


def model_facts(model: ModelReading) -> ModelFacts | None:
    """Exact facts when the server or the model file gave them; else an estimate from the size."""
    if model.facts is not None:
        return model.facts
    weights = weights_bytes(model) or model.size_bytes
    if not weights:
        return None
    return ModelFacts(weights_bytes=weights, bytes_per_token=weights, exact=False, source="size")


def place(
    model: ModelReading,
    context_tokens: int | None,
    server_pid: int | None,
    hardware: HardwareSnapshot,
    machine: Machine,
) -> Placement:
    facts = model_facts(model)
    share = server_gpu_fraction(model.size_bytes, model.vram_bytes)
    source: ShareSource | None = "server" if share is not None else None
    vram = model.vram_bytes
    if share is None:
        nvml = _nvml_share(facts, model.context_length, server_pid, hardware, machine)
        if nvml is not None:
            share, vram = nvml
            source = "nvml"
    return Placement(
        facts=facts,
        gpu_fraction=share,
        gpu_fraction_source=source,
        vram_bytes=vram,
        ceiling_tok_s=ceiling_for(facts, context_tokens, machine, share),
        full_gpu_ceiling_tok_s=ceiling_for(facts, context_tokens, machine, 1.0),
    )


def _nvml_share(
    facts: ModelFacts | None,
    context_length: int | None,
    server_pid: int | None,
    hardware: HardwareSnapshot,
    machine: Machine,
) -> tuple[float, int] | None:
    """(share, bytes) from the server process's NVML memory use against what the model needs.

    NVML counts the CUDA context and compute buffers too, and the need is an estimate (weights +
    KV + runtime overhead), so a share at or above FULL_GPU_SNAP is read as "all on the GPU".
    NVML often cannot see a server's process (containers, WSL, other users): that is "unknown",
    not "all on the CPU".
    """
    if facts is None or server_pid is None or not machine.has_gpu or machine.unified_memory:
        return None
    if not any(g.vendor == "nvidia" for g in hardware.gpus):
        return None
    used = [
        p.used_bytes
        for g in hardware.gpus
        for p in g.processes
        if p.pid == server_pid and p.used_bytes is not None
    ]
    if not used:
        return None
    kv = physics.kv_cache_bytes(facts.kv, context_length or 0, machine.kv_type)
    share = sum(used) / physics.required_bytes(facts.weights_bytes, kv)
    return (1.0 if share >= FULL_GPU_SNAP else max(0.0, share)), sum(used)
