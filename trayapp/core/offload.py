"""The offload detector: part of a model spilled out of GPU memory onto the CPU.

The finding says how far the ceiling falls (DOMAIN.md §2), names a likely cause (a raised
context, another model or process holding VRAM) and computes the cheapest fix: what to close,
a shorter context, a q8_0 KV cache, or the nearest quantization that fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trayapp.core import physics
from trayapp.core.fixes import (
    KV_FIX_TYPE,
    cpu_moe_commands,
    gpu_fit_commands,
    joined,
    kv_cache_commands,
    unload_commands,
)
from trayapp.core.model import Finding, GpuProcess, ModelFacts, Severity
from trayapp.core.quants import COMMON_QUANTS, effective_bpw, normalize_quant_name, quant_note
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import GB, format_gb, format_rate, format_spill_pct, format_tokens

if TYPE_CHECKING:
    from trayapp.core.diagnose import ModelView

NOTABLE_VRAM_HOLDER_BYTES = GB // 2  # a holder this large is worth naming as a cause of an offload
Q4_BPW = 4.5  # below this a quantization costs visible quality (DOMAIN.md §9)


def offload_finding(view: ModelView, t: Thresholds) -> Finding | None:
    model, machine = view.model, view.machine
    fraction = model.gpu_fraction
    if fraction is None or not machine.has_gpu or machine.unified_memory:
        return None
    cpu_share = 1.0 - fraction
    if cpu_share * 100 < t.offload_min_cpu_pct:
        return None
    full = model.full_gpu_ceiling_tok_s
    split = model.ceiling_tok_s
    evidence: dict[str, object] = {
        "cpu_share": round(cpu_share, 4),
        "gpu_fraction": round(fraction, 4),
        "expected_full_gpu_tok_s": _round(full),
        "expected_split_tok_s": _round(split),
        "decode_tok_s": _round(model.decode_tok_s),
        "size_bytes": model.size_bytes,
        "vram_bytes": model.vram_bytes,
        "context_length": model.context_length,
        "source": model.gpu_fraction_source,
    }
    speed = ""
    if full and split:
        speed = (
            f": expect at most ~{format_rate(split)} tok/s instead of ~{format_rate(full)} tok/s "
            "fully in GPU memory"
        )
    cause = _cause(view)
    fix, commands = _fix(view)
    slowdown = (full / split) if full and split else None
    severity: Severity = (
        "critical" if (slowdown is not None and slowdown >= 3) or cpu_share >= 0.5 else "warning"
    )
    message = (
        f"{model.name} is {format_spill_pct(cpu_share)} on the CPU (it spilled out of GPU memory){speed}."
    )
    if cause:
        message += f" {cause}"
    return Finding(
        kind="offload",
        severity=severity,
        server=view.server.url,
        model=model.name,
        message=message,
        fix=fix,
        evidence=evidence,
        cause=cause,
        score=cpu_share,
        fix_commands=commands,
    )


def _cause(view: ModelView) -> str | None:
    model, previous = view.model, view.previous
    was_more_on_gpu = previous is not None and (
        previous.gpu_fraction is None
        or model.gpu_fraction is None
        or previous.gpu_fraction > model.gpu_fraction + 0.005
    )
    if (
        previous is not None
        and was_more_on_gpu
        and previous.context_length
        and model.context_length
        and model.context_length > previous.context_length
    ):
        raised = (
            f"The context was raised from {format_tokens(previous.context_length)} to "
            f"{format_tokens(model.context_length)} tokens"
        )
        if model.facts is not None and model.facts.kv is not None:
            kv_type = view.machine.kv_type
            grew = physics.kv_cache_bytes(
                model.facts.kv, model.context_length, kv_type
            ) - physics.kv_cache_bytes(model.facts.kv, previous.context_length, kv_type)
            return f"{raised} and the KV cache grew by {format_gb(grew)}."
        if model.size_bytes and previous.size_bytes and model.size_bytes > previous.size_bytes:
            grown = format_gb(model.size_bytes - previous.size_bytes)
            return f"{raised} and the model's memory grew by {grown}."
        return f"{raised}."
    holders = [h for h in _vram_holders(view) if h[1] >= NOTABLE_VRAM_HOLDER_BYTES]
    if holders:
        name, held, is_model = max(holders, key=lambda h: h[1])
        if is_model:
            return f"{name}, also loaded, holds {format_gb(held)} of VRAM."
        return f"Another process, {name}, holds {format_gb(held)} of VRAM."
    return None


def _vram_holders(view: ModelView) -> list[tuple[str, int, bool]]:
    """Who else holds GPU memory: (name, bytes, is a model of this server).

    NVML's process list when there is one (a process serving another model of the same
    server is named after that model); otherwise the server's other loaded models.
    """
    siblings = [m for m in view.server.models if m.name != view.model.name]
    if view.other_gpu_processes:
        by_pid = {m.server_pid: m.name for m in siblings if m.server_pid is not None}
        return [
            (by_pid[p.pid], p.used_bytes, True)
            if p.pid in by_pid
            else (_process_name(p), p.used_bytes, False)
            for p in view.other_gpu_processes
            if p.used_bytes
        ]
    return [(m.name, m.vram_bytes, True) for m in siblings if m.vram_bytes]


def parallel_slots(view: ModelView) -> int:
    """llama-server's slots (`-np`), for a fix that sets a context per request: `-c` N × slots with
    `-np` slots gives each N whatever the layout was; 1 for the other kinds (theirs is per request)."""
    if view.server.kind != "llamacpp":
        return 1
    return max(view.model.parallel_slots or 1, 1)


def free_gpu_bytes(view: ModelView) -> int | None:
    """GPU memory this model may use: the machine's, less what other models and processes hold.
    None without a GPU's capacity (or on unified memory, shared with everything else)."""
    machine = view.machine
    if not machine.has_gpu or machine.unified_memory or machine.fast_capacity_bytes is None:
        return None
    return machine.fast_capacity_bytes - sum(held for _, held, _ in _vram_holders(view))


def _fix(view: ModelView) -> tuple[str, tuple[str, ...]]:
    """The cheapest change that puts the whole model back in GPU memory, computed, and the commands
    that make it on this server (the same numbers: each option computes its figure once)."""
    model, machine = view.model, view.machine
    kind, name, router = view.server.kind, model.name, view.server.router
    facts = model.facts
    capacity = machine.fast_capacity_bytes
    generic = (
        "Use a smaller quantization or a shorter context (num_ctx / -c) so the whole model "
        "fits in GPU memory."
    )
    if facts is None or capacity is None or facts.source == "size":
        return generic, ()  # no real weights size: any number computed here would be a guess
    holders = _vram_holders(view)
    free_for_model = capacity - sum(held for _, held, _ in holders)
    # The KV cache's size: llama-server's -c. With its default (auto) slots the cache is one pool
    # that every slot may fill (`kv_unified`: each slot's n_ctx is all of -c); with -np N alone each
    # slot gets -c ÷ N. The server says neither, so a slot's context is taken as the whole cache, and
    # the fix sets -c, the total, which fits in either layout (slots keep the user's -np).
    total = model.context_length or 4096
    kv_type = machine.kv_type
    options: list[str] = []
    commands: list[tuple[str, ...]] = []

    big = [h for h in holders if h[1] >= NOTABLE_VRAM_HOLDER_BYTES]
    if big:
        holder, held, is_model = max(big, key=lambda h: h[1])
        verb = "unload" if is_model else "close"
        options.append(f"{verb} {holder}, which holds {format_gb(held)} of VRAM")
        commands.append(unload_commands(kind, holder) if is_model else ())
    max_ctx = physics.max_context_that_fits(facts.weights_bytes, facts.kv, free_for_model, kv_type)
    if max_ctx is not None and 2048 <= max_ctx < total:
        shorter = _round_down_ctx(max_ctx)
        options.append(f"lower the context to {format_tokens(shorter)} tokens")
        commands.append(gpu_fit_commands(kind, name, shorter, router=router))
    if kv_type == "f16" and facts.kv is not None:
        kv_q8 = physics.kv_cache_bytes(facts.kv, total, KV_FIX_TYPE)
        if physics.required_bytes(facts.weights_bytes, kv_q8) <= free_for_model:
            options.append(
                f"a {KV_FIX_TYPE} KV cache (with flash attention) keeps this context in GPU memory"
            )
            commands.append(kv_cache_commands(kind, name, KV_FIX_TYPE, router=router))
    experts = cpu_moe_layers(facts, total, kv_type, free_for_model) if kind == "llamacpp" else None
    if experts is not None:
        layers, moved = experts
        options.append(
            f"keep the experts of the first {layers} layers ({format_gb(moved)}) in system RAM "
            "and the rest of the model on the GPU"
        )
        commands.append(cpu_moe_commands(kind, name, layers, router=router))
    quant = _nearest_quant_that_fits(facts, total, kv_type, free_for_model)
    if quant is None or (effective_bpw(quant) or 0) < Q4_BPW:
        # No Q4-or-better build fits at this context: say what Q4+ needs, before a lossy step.
        q4 = _q4_with_shorter_context(facts, total, kv_type, free_for_model)
        if q4 is not None:
            options.append(f"{q4[0]} with a context of {format_tokens(q4[1])} tokens fits")
    if quant is not None:
        text = f"{quant} fits at this context"
        note = quant_note(quant)
        if (effective_bpw(quant) or 99) < Q4_BPW and note:
            text += f" ({note})"
        options.append(text)
    if not options:
        return (
            f"No common quantization of this model fits in the {format_gb(free_for_model)} of GPU memory "
            "available at this context: use a smaller model (or accept the CPU speed).",
            (),
        )
    text = "; or ".join(options) + "."
    return text[0].upper() + text[1:], joined(*commands)


def cpu_moe_layers(facts: ModelFacts, context: int, kv_type: str, capacity: int) -> tuple[int, int] | None:
    """For an MoE model that does not fit: the fewest leading layers whose experts, moved to system
    RAM (llama-server `--n-cpu-moe N`), leave the rest fitting in `capacity` beside the KV cache of
    `context` tokens; and the bytes moved. None for a dense model, one that fits, or facts too thin.

    Expert parameters = (total − active) ÷ (1 − used/count) (only used/count of them are read per
    token); their bytes are that share of the weights, spread evenly over the layers (a leading
    dense layer makes the share per layer a little larger than assumed: N errs on the side of fitting).
    """
    total, active = facts.parameter_count, facts.active_parameter_count
    count, used = facts.expert_count, facts.expert_used_count
    layers = facts.kv.n_layers if facts.kv is not None else None
    if not (total and active and count and used and layers) or used >= count or active >= total:
        return None
    expert_params = (total - active) / (1 - used / count)
    if not 0 < expert_params < total:
        return None
    per_layer = facts.weights_bytes * expert_params / total / layers
    kv = physics.kv_cache_bytes(facts.kv, context, kv_type)
    if physics.required_bytes(facts.weights_bytes, kv) <= capacity:
        return None
    for n in range(1, layers + 1):
        moved = round(per_layer * n)
        if physics.required_bytes(facts.weights_bytes - moved, kv) <= capacity:
            return n, moved
    return None


def _process_name(process: GpuProcess) -> str:
    return f"{process.name} (pid {process.pid})" if process.name else f"pid {process.pid}"


def _round_down_ctx(tokens: int) -> int:
    step = 1024 if tokens >= 4096 else 256
    return max(step, tokens // step * step)


def _smaller_quants(facts: ModelFacts) -> list[str]:
    """Common quantizations below the model's own, largest (the smallest step down) first."""
    current_bpw = effective_bpw(normalize_quant_name(facts.quantization))
    out = []
    for quant in reversed(COMMON_QUANTS):
        bpw = effective_bpw(quant)
        if bpw is not None and (current_bpw is None or bpw < current_bpw):
            out.append(quant)
    return out


def _nearest_quant_that_fits(facts: ModelFacts, context: int, kv_type: str, capacity: int) -> str | None:
    kv = physics.kv_cache_bytes(facts.kv, context, kv_type)
    for quant in _smaller_quants(facts):
        smaller = physics.requantize(facts, quant)
        if smaller is not None and physics.required_bytes(smaller.weights_bytes, kv) <= capacity:
            return quant
    return None


def _q4_with_shorter_context(
    facts: ModelFacts, context: int, kv_type: str, capacity: int
) -> tuple[str, int] | None:
    """A Q4-or-better step down that fits at a shorter context, and that context.

    The largest such quantization whose context is still useful (≥ 8k tokens, or the current
    context when smaller); failing that, the one that allows the longest context ≥ 2k.
    """
    useful = min(context, 8192)
    best: tuple[str, int] | None = None
    for quant in _smaller_quants(facts):
        if (effective_bpw(quant) or 0) < Q4_BPW:
            break
        smaller = physics.requantize(facts, quant)
        if smaller is None:
            continue
        fits_ctx = physics.max_context_that_fits(smaller.weights_bytes, smaller.kv, capacity, kv_type)
        if fits_ctx is None or fits_ctx < 2048 or fits_ctx >= context:
            continue
        if fits_ctx >= useful:
            return quant, _round_down_ctx(fits_ctx)
        if best is None or fits_ctx > best[1]:
            best = (quant, _round_down_ctx(fits_ctx))
    return best


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None
