"""The offload detector: part of a model spilled out of GPU memory onto the CPU.

The finding says how far the ceiling falls (DOMAIN.md §2), names a likely cause (a raised
context, another model or process holding VRAM) and computes the cheapest fix: what to close,
a shorter context, a q8_0 KV cache, or the nearest quantization that fits.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from trayapp.core.hardware_readings import GpuProcess
from trayapp.core.model import Finding, ModelFacts, Severity
from trayapp.core.quants import COMMON_QUANTS, effective_bpw, normalize_quant_name, quant_note
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import GB, format_gb, format_rate, format_spill_pct, format_tokens
from trayapp.core.vram_holders import (
    ClosingGain,
    VramHolder,
    closing_gain,
    holder_label,
    holders_evidence,
    holders_text,
    layers_on_gpu,
    sort_holders,
)

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
    evidence.update(_holders_evidence(view))
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
        return _culprits_cause(view)
    return None


def _other_processes(view: ModelView) -> tuple[VramHolder, ...]:
    """The GPU memory holders besides this model's server and its server's other models, as they were
    when it loaded or spilled (`ModelView.vram_holders`), else as they are now; largest first."""
    sibling_pids = {m.server_pid for m in view.server.models if m.name != view.model.name}
    if view.vram_holders is not None:
        found: list[VramHolder] = list(view.vram_holders.holders)
    else:
        found = [VramHolder(p.pid, p.name, p.used_bytes) for p in view.other_gpu_processes]
    return sort_holders(h for h in found if h.pid not in sibling_pids)


def _culprits_cause(view: ModelView) -> str:
    """'About 16 of 40 layers are on the CPU: 6.0 GB of the 12.9 GB of GPU memory was held by other
    processes when it was placed — python (pid 4121) 5.8 GB, Xorg 0.2 GB.' (a layer count where the
    model's facts give one; "is held" where no snapshot was kept)."""
    model, machine = view.model, view.machine
    others = _other_processes(view)
    held = sum(h.used_bytes or 0 for h in others)
    layers = ""
    n_layers = model.facts.kv.n_layers if model.facts is not None and model.facts.kv is not None else None
    if n_layers and model.gpu_fraction is not None:
        on_cpu = n_layers - layers_on_gpu(model.gpu_fraction, n_layers)
        layers = f"About {on_cpu} of {n_layers} layers are on the CPU: "
    of = (
        f" of the {format_gb(machine.fast_capacity_bytes)} of GPU memory"
        if machine.fast_capacity_bytes
        else ""
    )
    verb = "was held by other processes when it was placed" if view.vram_holders is not None else "is held"
    if view.vram_holders is None:
        verb += " by other processes"
    text = f"{layers}{format_gb(held)}{of} {verb} — {holders_text(others)}."
    return text[0].upper() + text[1:]


def _closing_option(view: ModelView) -> tuple[str, ClosingGain | None] | None:
    """'close python (pid 4121), which holds 5.8 GB, and reload the model: 16 more layers on the GPU
    (all 40), a decode ceiling of ~40 tok/s instead of ~13 tok/s' for the (at most 3) notable holders
    an alert names, with what closing them gives (`closing_gain`); None when none is notable."""
    model, machine = view.model, view.machine
    named = [h for h in _other_processes(view) if (h.used_bytes or 0) >= NOTABLE_VRAM_HOLDER_BYTES]
    named = named[:3]
    if not named:
        return None
    names = [holder_label(h) for h in named]
    who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    freed = sum(h.used_bytes or 0 for h in named)
    held = sum(held for _, held, _ in _vram_holders(view))
    gain = None
    if model.facts is not None and model.gpu_fraction is not None:
        gain = closing_gain(
            model.facts, model.context_length, model.context_tokens, machine, model.gpu_fraction, freed, held
        )
    holds = f"which hold{'s' if len(named) == 1 else ''} {format_gb(freed)}"
    if gain is None:
        return f"close {who}, {holds} of VRAM", None
    parts = []
    if gain.n_layers and gain.layers_on_gpu is not None and gain.layers_on_gpu_now is not None:
        back = gain.layers_on_gpu - gain.layers_on_gpu_now
        of = (
            f"all {gain.n_layers}"
            if gain.layers_on_gpu == gain.n_layers
            else f"{gain.layers_on_gpu} of {gain.n_layers}"
        )
        parts.append(f"{back} more layer{'' if back == 1 else 's'} on the GPU ({of})")
    else:
        parts.append(f"{format_spill_pct(gain.gpu_fraction)} of it on the GPU")
    if gain.ceiling_tok_s and model.ceiling_tok_s:
        parts.append(
            f"a decode ceiling of ~{format_rate(gain.ceiling_tok_s)} tok/s instead of "
            f"~{format_rate(model.ceiling_tok_s)} tok/s"
        )
    return f"close {who}, {holds}, and reload the model: " + ", ".join(parts), gain


def _holders_evidence(view: ModelView) -> dict[str, object]:
    """The holders kept for this alert and what closing them gives (status --json, the store)."""
    others = _other_processes(view)
    if not others:
        return {}
    evidence: dict[str, object] = {
        "vram_holders": holders_evidence(others),
        "vram_holders_at_wall_s": view.vram_holders.t_wall_s if view.vram_holders is not None else None,
        "vram_held_by_others_bytes": sum(h.used_bytes or 0 for h in others),
    }
    closing = _closing_option(view)
    gain = closing[1] if closing is not None else None
    if gain is not None:
        evidence.update(
            closing_gpu_fraction=round(gain.gpu_fraction, 4),
            closing_ceiling_tok_s=_round(gain.ceiling_tok_s),
            closing_layers_on_gpu=gain.layers_on_gpu,
            n_layers=gain.n_layers,
        )
    return evidence


def _vram_holders(view: ModelView) -> list[tuple[str, int, bool]]:
    """Who else holds GPU memory: (name, bytes, is a model of this server).

    NVML's process list when there is one (a process serving another model of the same
    server is named after that model); otherwise the server's other loaded models.
    """
    siblings = [m for m in view.server.models if m.name != view.model.name]
    processes: Sequence[VramHolder | GpuProcess] = (
        view.vram_holders.holders if view.vram_holders is not None else view.other_gpu_processes
    )
    if processes:
        by_pid = {m.server_pid: m.name for m in siblings if m.server_pid is not None}
        return [
            (by_pid[p.pid], p.used_bytes, True)
            if p.pid in by_pid
            else (_process_name(p), p.used_bytes, False)
            for p in processes
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
        closing = None if is_model else _closing_option(view)
        if closing is not None:
            options.append(closing[0])
        else:
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


def _process_name(process: GpuProcess | VramHolder) -> str:
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
