"""Detectors: "why is my model slow?" in numbers.

Each detector looks at one model (or one GPU, or one server) at one instant
and returns `Finding`s with the evidence, the cause in plain words and a
computed fix. The episode rules (confirmation, hysteresis) live in
`episodes.py`; this module is stateless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from trayapp.core import physics
from trayapp.core.alert_kinds import SUPPRESSED_BY_OFFLOAD
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Baseline,
    Finding,
    GpuProcess,
    HardwareSnapshot,
    ModelFacts,
    ModelStatus,
    ServerStatus,
    Severity,
    server_label,
)
from trayapp.core.placement import ceiling_for
from trayapp.core.quants import COMMON_QUANTS, effective_bpw, normalize_quant_name, quant_note
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import GB, format_gb, format_rate, format_spill_pct, format_tokens

NOTABLE_VRAM_HOLDER_BYTES = GB // 2  # a holder this large is worth naming as a cause of an offload
GPU_WORKLOAD_BYTES = GB  # holding this much VRAM marks a real GPU workload (another model, a game)


@dataclass(frozen=True)
class ModelView:
    """Everything the detectors may look at for one model."""

    server: ServerStatus
    model: ModelStatus
    machine: Machine
    previous: ModelStatus | None = None  # the same model at an earlier tick (before a change)
    trend: Sequence[tuple[int, float]] = ()  # (context tokens, decode tok/s) in this session
    baseline: Baseline | None = None
    other_gpu_processes: Sequence[GpuProcess] = ()  # VRAM holders that are not this server
    load_s: float | None = None  # model load time paid by a request just now
    cpu_percent: float | None = None
    throttle_reasons: Sequence[str] = ()
    gpu_fraction_source: str | None = None  # "ollama", "nvml", ...
    fields_extra: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------- per model


def diagnose_model(view: ModelView, t: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    for detector in (
        _offload,
        _kv_slowdown,
        _context_full,
        _below_floor,
        _low_efficiency,
        _draft_acceptance,
        _regression,
        _cold_load,
    ):
        finding = detector(view, t)
        if finding is not None:
            findings.append(finding)
    if any(f.kind == "offload" for f in findings):
        findings = [f for f in findings if f.kind not in SUPPRESSED_BY_OFFLOAD]
    return findings


def _offload(view: ModelView, t: Thresholds) -> Finding | None:
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
        "source": view.gpu_fraction_source,
    }
    speed = ""
    if full and split:
        speed = (
            f": expect at most ~{format_rate(split)} tok/s instead of ~{format_rate(full)} tok/s "
            "fully in GPU memory"
        )
    cause = _offload_cause(view)
    fix = _offload_fix(view)
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
    )


def _offload_cause(view: ModelView) -> str | None:
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


def _offload_fix(view: ModelView) -> str:
    """The cheapest change that puts the whole model back in GPU memory, computed."""
    model, machine = view.model, view.machine
    facts = model.facts
    capacity = machine.fast_capacity_bytes
    generic = (
        "Use a smaller quantization or a shorter context (num_ctx / -c) so the whole model "
        "fits in GPU memory."
    )
    if facts is None or capacity is None or facts.source == "size":
        return generic  # no real weights size: any number computed here would be a guess
    holders = _vram_holders(view)
    free_for_model = capacity - sum(held for _, held, _ in holders)
    context = model.context_length or 4096
    kv_type = machine.kv_type
    options: list[str] = []

    big = [h for h in holders if h[1] >= NOTABLE_VRAM_HOLDER_BYTES]
    if big:
        name, held, is_model = max(big, key=lambda h: h[1])
        verb = "unload" if is_model else "close"
        options.append(f"{verb} {name}, which holds {format_gb(held)} of VRAM")
    max_ctx = physics.max_context_that_fits(facts.weights_bytes, facts.kv, free_for_model, kv_type)
    if max_ctx is not None and 2048 <= max_ctx < context:
        options.append(f"lower the context to {format_tokens(_round_down_ctx(max_ctx))} tokens")
    if kv_type == "f16" and facts.kv is not None:
        kv_q8 = physics.kv_cache_bytes(facts.kv, context, "q8_0")
        if physics.required_bytes(facts.weights_bytes, kv_q8) <= free_for_model:
            options.append("a q8_0 KV cache (with flash attention) keeps this context in GPU memory")
    quant = _nearest_quant_that_fits(facts, context, kv_type, free_for_model)
    if quant is None or (effective_bpw(quant) or 0) < Q4_BPW:
        # No Q4-or-better build fits at this context: say what Q4+ needs, before a lossy step.
        shorter = _q4_with_shorter_context(facts, context, kv_type, free_for_model)
        if shorter is not None:
            options.append(f"{shorter[0]} with a context of {format_tokens(shorter[1])} tokens fits")
    if quant is not None:
        text = f"{quant} fits at this context"
        note = quant_note(quant)
        if (effective_bpw(quant) or 99) < Q4_BPW and note:
            text += f" ({note})"
        options.append(text)
    if not options:
        return (
            f"No common quantization of this model fits in the {format_gb(free_for_model)} of GPU memory "
            "available at this context: use a smaller model (or accept the CPU speed)."
        )
    text = "; or ".join(options) + "."
    return text[0].upper() + text[1:]


Q4_BPW = 4.5  # below this a quantization costs visible quality (DOMAIN.md §9)


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


def _kv_slowdown(view: ModelView, t: Thresholds) -> Finding | None:
    points = [(c, r) for c, r in view.trend if c is not None and r and r > 0]
    if len(points) < 2:
        return None
    min_ctx = min(c for c, _ in points)
    short = [r for c, r in points if c <= max(min_ctx * 2, min_ctx + 512)]
    if not short:
        return None
    deep_ctx = max(c for c, _ in points)
    if points[-1][0] < deep_ctx * 0.8:
        return None  # back at a short context (a new conversation): the slowdown is over
    deep = [r for c, r in points if c >= deep_ctx * 0.8]
    short_ctx = int(median([c for c, _ in points if c <= max(min_ctx * 2, min_ctx + 512)]))
    long_ctx = int(median([c for c, _ in points if c >= deep_ctx * 0.8]))
    if long_ctx < short_ctx + 1000 or long_ctx < 2 * max(short_ctx, 1):
        return None  # no real growth in context: a drop here is something else
    short_rate, long_rate = median(short), median(deep)
    drop = 1.0 - long_rate / short_rate
    if drop * 100 < t.kv_slowdown_pct:
        return None
    model = view.model
    expected_drop = None
    if model.facts is not None:
        c_short = ceiling_for(model.facts, short_ctx, view.machine, model.gpu_fraction)
        c_long = ceiling_for(model.facts, long_ctx, view.machine, model.gpu_fraction)
        if c_short and c_long:
            expected_drop = 1.0 - c_long / c_short
    explained = (expected_drop / drop) if expected_drop is not None and drop > 0 else None
    evidence = {
        "short_context_tokens": short_ctx,
        "short_decode_tok_s": round(short_rate, 2),
        "context_tokens": long_ctx,
        "decode_tok_s": round(long_rate, 2),
        "drop_pct": round(drop * 100, 1),
        "expected_drop_pct": round(expected_drop * 100, 1) if expected_drop is not None else None,
        "explained_share": round(explained, 2) if explained is not None else None,
    }
    explain = ""
    if explained is not None:
        share = min(explained, 1.0) * 100
        explain = f" The KV-cache reads explain about {share:.0f} % of the drop"
        explain += "; attention compute adds the rest." if explained < 0.9 else "."
    message = (
        f"{model.name} decodes {drop * 100:.0f} % slower at {format_tokens(long_ctx)} tokens of context "
        f"({format_rate(long_rate)} tok/s) than at {format_tokens(short_ctx)} tokens "
        f"({format_rate(short_rate)} tok/s): every token re-reads the growing KV cache.{explain}"
    )
    fix = "Start a fresh conversation or trim the context"
    if view.machine.kv_type in ("f16", "bf16", "f32"):
        fix += (
            "; or enable flash attention and a q8_0 KV cache (--cache-type-k/v q8_0, "
            "OLLAMA_KV_CACHE_TYPE=q8_0), which about halves the KV bytes read per token"
        )
    fix += "."
    return Finding("kv_slowdown", "warning", view.server.url, model.name, message, fix, evidence, score=drop)


def _context_full(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    if not model.context_tokens or not model.context_length:
        return None
    fill = model.context_tokens / model.context_length
    if fill * 100 < t.context_full_pct:
        return None
    severity: Severity = "critical" if fill >= 0.97 else "warning"
    message = (
        f"{model.name}'s context is {fill * 100:.0f} % full ({format_tokens(model.context_tokens)} of "
        f"{format_tokens(model.context_length)} tokens): the server will truncate or shift it soon."
    )
    fix = "Start a new conversation, or raise the context size (num_ctx / -c) if memory allows."
    evidence = {
        "context_tokens": model.context_tokens,
        "context_length": model.context_length,
        "fill": round(fill, 3),
    }
    return Finding("context_full", severity, view.server.url, model.name, message, fix, evidence, score=fill)


def _below_floor(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    rate = model.decode_tok_s
    if model.phase != "decoding" or rate is None or rate >= t.below_floor_tok_s:
        return None
    message = (
        f"{model.name} decodes at {rate:.1f} tok/s: below {t.below_floor_tok_s:g} tok/s, "
        "streaming feels broken rather than slow."
    )
    fix = "Use a smaller model or quantization; check the dashboard for offload or throttling."
    evidence = {"decode_tok_s": round(rate, 2), "floor_tok_s": t.below_floor_tok_s}
    return Finding(
        "below_floor", "critical", view.server.url, model.name, message, fix, evidence, score=-rate
    )


def _low_efficiency(view: ModelView, t: Thresholds) -> Finding | None:
    model, machine = view.model, view.machine
    if not machine.has_gpu or model.phase != "decoding":
        return None
    if model.active_streams > 1:
        return None  # batching lowers the per-stream rate by design (DOMAIN.md §6)
    if model.gpu_fraction is not None and model.gpu_fraction < t.offload_gpu_fraction:
        return None
    rate, ceiling = model.decode_tok_s, model.ceiling_tok_s
    if rate is None or not ceiling or rate >= t.low_efficiency_ratio * ceiling:
        return None
    clues: list[str] = []
    if view.throttle_reasons:
        clues.append("the GPU is throttling (" + ", ".join(view.throttle_reasons) + ")")
    # Holding ≥ 1 GB of VRAM marks a real GPU workload (another model, a game), not a desktop.
    busy = [p for p in view.other_gpu_processes if p.used_bytes and p.used_bytes >= GPU_WORKLOAD_BYTES]
    if busy:
        clues.append("other processes use the GPU: " + ", ".join(f"{p.name or p.pid}" for p in busy[:3]))
    if view.cpu_percent is not None and view.cpu_percent >= 90:
        clues.append(f"the CPU is saturated ({view.cpu_percent:.0f} %)")
    if model.gpu_fraction is None:
        clues.append("part of the model may be on the CPU (the server does not report its GPU share)")
    cause = "; ".join(clues) if clues else None
    share = rate / ceiling
    message = (
        f"{model.name} decodes at {format_rate(rate)} tok/s, {share * 100:.0f} % of its "
        f"{format_rate(ceiling)} tok/s ceiling; a healthy GPU reaches 60–75 %."
    )
    if cause:
        message += f" Likely: {cause}."
    fix = (
        "Check cooling and power limits (nvidia-smi -q -d PERFORMANCE), close other GPU work, "
        "update the server."
    )
    evidence = {
        "decode_tok_s": round(rate, 2),
        "ceiling_tok_s": round(ceiling, 2),
        "efficiency": round(share, 3),
        "throttle_reasons": list(view.throttle_reasons),
        "cpu_percent": view.cpu_percent,
    }
    return Finding(
        "low_efficiency", "warning", view.server.url, model.name, message, fix, evidence, cause, 1 - share
    )


def _draft_acceptance(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    rate = model.draft_acceptance
    if rate is None or rate >= t.draft_acceptance_min:
        return None
    kind = model.spec_type
    what = f"Speculative decoding ({kind})" if kind else "Speculative decoding"
    message = (
        f"{what} on {model.name} accepts only {rate * 100:.0f} % of drafted tokens: "
        f"{_spec_cost(kind)} and may make decode slower than without it."
    )
    fix = _spec_fix(kind)
    evidence = {
        "draft_acceptance": round(rate, 3),
        "min_acceptance": t.draft_acceptance_min,
        "spec_type": kind,
    }
    return Finding(
        "draft_acceptance", "warning", view.server.url, model.name, message, fix, evidence, score=1 - rate
    )


def _spec_cost(kind: str | None) -> str:
    """What a rejected draft costs, by kind of speculative decoding."""
    if kind and kind.startswith("ngram"):
        return "every rejected n-gram guess costs a wasted verification step"
    if kind == "draft-mtp":
        return "the MTP heads (a few hundred MB) run every step, and rejected drafts are wasted work"
    return "the draft model costs memory and time on every step"


def _spec_fix(kind: str | None) -> str:
    if kind and kind.startswith("ngram"):
        return (
            "n-gram drafting only pays off on repetitive text (code edits, quotes): turn it off for this "
            "workload (--spec-type none) or draft fewer tokens (--spec-draft-n-max)."
        )
    return (
        "Draft fewer tokens (--spec-draft-n-max, formerly --draft-max), try a better-matched drafter, "
        "or run without speculative decoding (--spec-type none)."
    )


def _regression(view: ModelView, t: Thresholds) -> Finding | None:
    base = view.baseline
    model = view.model
    if base is None or base.decode_tok_s <= 0:
        return None
    recent_points = list(view.trend)[-5:]
    if len(recent_points) < 3:
        return None
    now_ctx = median(c for c, _ in recent_points)
    if base.context_tokens is not None and abs(now_ctx - base.context_tokens) > max(
        1024, 0.5 * base.context_tokens
    ):
        return None  # a deeper context is slower anyway (kv_slowdown's business), not a regression
    now_rate = median(r for _, r in recent_points)
    drop = 1 - now_rate / base.decode_tok_s
    if drop * 100 < t.regression_pct:
        return None
    old_v, new_v = base.server_version, view.server.version
    versions = ""
    if old_v and new_v and old_v != new_v:
        versions = f" The server changed from {old_v} to {new_v}."
    message = (
        f"{model.name} decodes at {format_rate(now_rate)} tok/s, {drop * 100:.0f} % below its "
        f"{format_rate(base.decode_tok_s)} tok/s baseline on this hardware at a comparable context.{versions}"
    )
    fix = (
        f"Compare with the earlier server version ({old_v}) or check its release notes; report it upstream "
        "with `llm-tray report`."
        if versions
        else "Check what changed since the baseline session: drivers, server flags, other GPU work."
    )
    evidence = {
        "decode_tok_s": round(now_rate, 2),
        "baseline_tok_s": round(base.decode_tok_s, 2),
        "drop_pct": round(drop * 100, 1),
        "baseline_session": base.session_id,
        "baseline_version": old_v,
        "version": new_v,
    }
    return Finding("regression", "warning", view.server.url, model.name, message, fix, evidence, score=drop)


def _cold_load(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    if view.load_s is not None and view.load_s >= t.cold_load_min_s:
        message = f"A request to {model.name} waited {view.load_s:.1f} s for the model to load."
        fix = "Keep the model loaded longer (Ollama keep_alive / OLLAMA_KEEP_ALIVE, LM Studio TTL)."
        return Finding(
            "cold_load", "info", view.server.url, model.name, message, fix, {"load_s": view.load_s}
        )
    if model.phase == "loading" and view.server.status == "loading":  # a router's loads are timed instead
        message = f"{model.name} is loading; requests wait until it is in memory."
        return Finding(
            "cold_load", "info", view.server.url, model.name, message, "Wait, or keep it loaded.", {}
        )
    return None


# --------------------------------------------------------------------------- server and hardware


def diagnose_server(server: ServerStatus, was_up: bool) -> list[Finding]:
    if server.status in ("unreachable", "error") and was_up:
        name = server_label(server.kind)
        message = f"{name} at {server.url} stopped answering: {server.reason or server.status}."
        fix = "Check that the server is running; llm-tray reconnects by itself when it is back."
        evidence = {"status": server.status, "reason": server.reason}
        return [Finding("server_down", "warning", server.url, None, message, fix, evidence)]
    return []


def diagnose_hardware(hardware: HardwareSnapshot, t: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    for gpu in hardware.gpus:
        if not gpu.vram_total_bytes or gpu.vram_used_bytes is None or gpu.unified_memory:
            continue
        free = gpu.vram_total_bytes - gpu.vram_used_bytes
        free_pct = free / gpu.vram_total_bytes * 100
        if free_pct >= t.vram_free_min_pct:
            continue
        holders = sorted(gpu.processes, key=lambda p: p.used_bytes or 0, reverse=True)[:3]
        who = ", ".join(f"{p.name or p.pid} {format_gb(p.used_bytes or 0)}" for p in holders if p.used_bytes)
        message = (
            f"{gpu.name} has only {format_gb(free)} free ({free_pct:.1f} %): the next context growth or "
            "model load will spill to the CPU."
        )
        if who:
            message += f" Largest users: {who}."
        fix = "Unload idle models (ollama stop, LM Studio eject) or close other GPU programs."
        evidence = {
            "vram_free_bytes": free,
            "vram_total_bytes": gpu.vram_total_bytes,
            "free_pct": round(free_pct, 2),
        }
        findings.append(
            Finding(
                "vram_pressure", "warning", f"gpu:{gpu.index}", None, message, fix, evidence, score=-free_pct
            )
        )
    return findings


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None
