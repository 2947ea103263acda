"""Detectors: "why is my model slow?" in numbers.

Each detector looks at one model (or one GPU, or one server) at one instant
and returns `Finding`s with the evidence, the cause in plain words and a
computed fix. The offload detector and its cause/fix arithmetic live in
`offload.py`; the memory between ticks (trends, the model before a change) in
`diagnosis_tracker.py`; the episode rules (confirmation, hysteresis) in `episodes.py`.
This module is stateless.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import median
from typing import NamedTuple

from trayapp.core import physics
from trayapp.core.alert_kinds import ALERT_KINDS, AlertKindName
from trayapp.core.fixes import (
    CONTEXT_STEP_TOKENS,
    KV_FIX_TYPE,
    NVIDIA_SMI_PERFORMANCE,
    context_size_commands,
    kv_cache_commands,
    kv_cache_where,
    no_speculation_commands,
    report_command,
    round_up_context,
    unload_commands,
)
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Baseline,
    Finding,
    GpuProcess,
    HardwareSnapshot,
    ModelStatus,
    ServerStatus,
    Severity,
)
from trayapp.core.offload import free_gpu_bytes, offload_finding, parallel_slots
from trayapp.core.peers import PeerBand, peer_band_json
from trayapp.core.physics import REALISTIC_BAND
from trayapp.core.placement import ceiling_for
from trayapp.core.quants import kv_is_full_precision
from trayapp.core.server_kinds import engine_label, server_label
from trayapp.core.thresholds import Thresholds
from trayapp.core.throttle import Throttle
from trayapp.core.units import GB, format_gb, format_rate, format_tokens
from trayapp.core.vram_holders import HolderSnapshot, holders_besides, holders_evidence, holders_text

GPU_WORKLOAD_BYTES = GB  # holding this much VRAM marks a real GPU workload (another model, a game)
GENERIC_EFFICIENCY = (REALISTIC_BAND[0] + REALISTIC_BAND[1]) / 2  # 0.675: the middle of 60–75 %


# --------------------------------------------------------------------------- calibration


def usable_calibration(calibrated_efficiency: float | None) -> float | None:
    """The calibrated efficiency when it is a share of the ceiling (0 < e ≤ 1), else None."""
    if calibrated_efficiency is None or not 0.0 < calibrated_efficiency <= 1.0:
        return None
    return calibrated_efficiency


def calibration_factor(calibrated_efficiency: float | None) -> float:
    """How far this (model, hardware) sits from the generic healthy share: its benched efficiency at
    depth 0 ÷ 0.675; 1 without a (usable) calibration."""
    usable = usable_calibration(calibrated_efficiency)
    return 1.0 if usable is None else usable / GENERIC_EFFICIENCY


def healthy_band_shares(calibrated_efficiency: float | None) -> tuple[float, float]:
    """The realistic band as shares of the ceiling: 60–75 %, or centred on the calibrated efficiency
    (the same band scaled by `calibration_factor`)."""
    factor = calibration_factor(calibrated_efficiency)
    return REALISTIC_BAND[0] * factor, REALISTIC_BAND[1] * factor


def low_efficiency_share(t: Thresholds, calibrated_efficiency: float | None) -> float:
    """The share of the ceiling under which `low_efficiency` fires: `low_efficiency_ratio`, scaled by
    `calibration_factor` (ratio ÷ 0.675 × the calibrated efficiency)."""
    return t.low_efficiency_ratio * calibration_factor(calibrated_efficiency)


def band_text(calibrated_efficiency: float | None) -> str:
    low, high = healthy_band_shares(calibrated_efficiency)
    return f"{low * 100:.0f}–{high * 100:.0f} %"


class TrendPoint(NamedTuple):
    """One single-stream decode rate of a session, at its context depth."""

    context_tokens: int
    decode_tok_s: float
    exact: bool  # server-reported (a finished request's timings) rather than polled


ESTIMATE_MARGIN_PCT = 10.0  # a polled rate is within ~10 % of the server's own (tested on a busy host)
REGRESSION_EVIDENCE = 3  # the fastest of this many newest rates must still be below the mark


@dataclass(frozen=True)
class ModelView:
    """Everything the detectors may look at for one model: its status (with its GPU share's source
    and its benched calibration) and what the status cannot hold (earlier ticks, the machine, other
    processes)."""

    server: ServerStatus
    model: ModelStatus
    machine: Machine
    previous: ModelStatus | None = None  # the same model at an earlier tick (before a change)
    trend: Sequence[TrendPoint] = ()  # this session's single-stream decode rates, oldest first
    baseline: Baseline | None = None
    other_gpu_processes: Sequence[GpuProcess] = ()  # VRAM holders that are not this server
    vram_holders: HolderSnapshot | None = None  # those holders when the model loaded or spilled
    load_s: float | None = None  # model load time paid by a request just now
    cpu_percent: float | None = None
    throttle_reasons: Sequence[str] = ()
    throttle: Throttle | None = None  # what holds this machine's hardware back now (core/throttle.py)


# --------------------------------------------------------------------------- per model


def diagnose_model(view: ModelView, t: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    for detector in (
        offload_finding,
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
    return without_explained(findings, {f.kind for f in findings})


def without_explained(findings: Sequence[Finding], explaining: Collection[AlertKindName]) -> list[Finding]:
    """`findings` less those a finding of an `explaining` kind explains (`AlertKind.suppressed_by`):
    one root cause per model (and, for a GPU-wide kind, per machine)."""
    return [f for f in findings if ALERT_KINDS[f.kind].suppressed_by.isdisjoint(explaining)]


def resolved_kinds(view: ModelView) -> frozenset[AlertKindName]:
    """Kinds whose cause is certainly gone at this tick, so their episodes end at once: a KV
    slowdown once a fresh conversation began (the context back under 80 % of this session's deepest,
    where `_kv_slowdown` stops finding it too)."""
    deepest = max((p.context_tokens for p in view.trend), default=0)
    now = view.model.context_tokens
    if deepest and now is not None and now < 0.8 * deepest:
        return frozenset({"kv_slowdown"})
    return frozenset()


def _kv_slowdown(view: ModelView, t: Thresholds) -> Finding | None:
    points = [
        (p.context_tokens, p.decode_tok_s)
        for p in view.trend
        if p.context_tokens is not None and p.decode_tok_s > 0
    ]
    if len(points) < 2:
        return None
    min_ctx = min(c for c, _ in points)
    short = [r for c, r in points if c <= max(min_ctx * 2, min_ctx + 512)]
    if not short:
        return None
    deep_ctx = max(c for c, _ in points)
    if "kv_slowdown" in resolved_kinds(view) or points[-1][0] < deep_ctx * 0.8:
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
    commands: tuple[str, ...] = ()
    if kv_is_full_precision(view.machine.kv_type):
        commands = kv_cache_commands(view.server.kind, model.name, KV_FIX_TYPE, router=view.server.router)
        where = "" if commands else f" ({kv_cache_where(view.server.kind, KV_FIX_TYPE)})"
        fix += (
            f"; or enable flash attention and a {KV_FIX_TYPE} KV cache{where}, "
            "which about halves the KV bytes read per token"
        )
    fix += "."
    return Finding(
        "kv_slowdown",
        "warning",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        score=drop,
        fix_commands=commands,
    )


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
    fix, commands = _raise_context_fix(view)
    evidence = {
        "context_tokens": model.context_tokens,
        "context_length": model.context_length,
        "fill": round(fill, 3),
    }
    return Finding(
        "context_full",
        severity,
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        score=fill,
        fix_commands=commands,
    )


def _raise_context_fix(view: ModelView) -> tuple[str, tuple[str, ...]]:
    """A new conversation, or a context twice as large (in whole 1k steps), capped by the model's
    training and by what fits in GPU memory beside the weights when both are known; the commands
    that set that context on this server (the same number)."""
    model, machine = view.model, view.machine
    current = model.context_length or 0
    target = round_up_context(2 * current)
    limit = ""
    facts = model.facts
    if facts is not None and facts.context_train and facts.context_train < target:
        target = facts.context_train
        limit = f"the model was trained on {format_tokens(target)} tokens"
    free = free_gpu_bytes(view)
    checked = False
    if facts is not None and facts.kv is not None and free is not None and facts.source != "size":
        fits = physics.max_context_that_fits(facts.weights_bytes, facts.kv, free, machine.kv_type)
        if fits is not None:
            checked = True
            fits_per_request = fits // parallel_slots(view) // CONTEXT_STEP_TOKENS * CONTEXT_STEP_TOKENS
            if fits_per_request < target:
                target = fits_per_request
                limit = "a larger context does not fit in GPU memory beside the model"
    if target <= current:
        return f"Start a new conversation: {limit or 'the context cannot grow'}.", ()
    slots = parallel_slots(view)
    commands = context_size_commands(
        view.server.kind, model.name, target, parallel_slots=slots, router=view.server.router
    )
    memory = "it fits in GPU memory" if checked else "if memory allows"
    return (
        f"Start a new conversation, or raise the context to {format_tokens(target)} tokens ({memory}).",
        commands,
    )


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
    cause = None
    if model.spec_type and model.draft_acceptance is None:
        # llama-server counts drafts only when a request ends: until then, the drafter is a suspect
        cause = (
            f"speculative decoding ({model.spec_type}) is on and its acceptance is not known yet: "
            "a drafter whose drafts are rejected slows every step"
        )
        fix += " Or compare without speculative decoding (--spec-type none)."
        commands = no_speculation_commands(view.server.kind, model.name, router=view.server.router)
    else:
        commands = ()
    evidence: dict[str, object] = {"decode_tok_s": round(rate, 2), "floor_tok_s": t.below_floor_tok_s}
    if view.throttle is not None:
        cause = view.throttle.text if cause is None else f"{cause}; {view.throttle.text}"
        message += f" Held back: {view.throttle.text}."
        evidence["throttle"] = view.throttle.evidence
    return Finding(
        "below_floor",
        "critical",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause=cause,
        score=-rate,
        fix_commands=commands,
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
    calibrated = usable_calibration(model.calibrated_efficiency)
    # Without a bench here, the published peers' median stands in for the calibration (#23).
    peers = model.peer_band if calibrated is None else None
    reference = calibrated if calibrated is not None else (peers.median_share if peers else None)
    if rate is None or not ceiling or rate >= low_efficiency_share(t, reference) * ceiling:
        return None
    clues: list[str] = []
    if view.throttle_reasons:
        detail = f": {view.throttle.text}" if view.throttle is not None else ""
        clues.append("the GPU is throttling (" + ", ".join(view.throttle_reasons) + ")" + detail)
    elif view.throttle is not None:
        clues.append(view.throttle.text)
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
        f"{format_rate(ceiling)} tok/s ceiling; "
        + (
            f"it reached {calibrated * 100:.0f} % when benched here (healthy: {band_text(calibrated)})."
            if calibrated is not None
            else _peers_text(peers)
            if peers is not None
            else f"a healthy GPU reaches {band_text(None)}."
        )
    )
    if cause:
        message += f" Likely: {cause}."
    fix = (
        f"Check cooling and power limits ({NVIDIA_SMI_PERFORMANCE}), close other GPU work, update the server."
    )
    if peers is not None and share < peers.min_share and peers.causes:
        message += f" That is below every published peer; usually: {'; '.join(peers.causes[:3])}."
        fix = f"Try first: {peers.causes[0]}. {fix}"
    evidence = {
        "decode_tok_s": round(rate, 2),
        "ceiling_tok_s": round(ceiling, 2),
        "efficiency": round(share, 3),
        "calibrated_efficiency": None if calibrated is None else round(calibrated, 3),
        "peer_band": None if peers is None else peer_band_json(peers),
        "throttle_reasons": list(view.throttle_reasons),
        "cpu_percent": view.cpu_percent,
        "throttle": view.throttle.evidence if view.throttle is not None else None,
    }
    return Finding(
        "low_efficiency",
        "warning",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause,
        1 - share,
        fix_commands=(NVIDIA_SMI_PERFORMANCE,),
    )


def _peers_text(band: PeerBand) -> str:
    """ "its peers on M2 Max, Q4 reach 52–62 % (median 58 %, n=14)." """
    return (
        f"its peers on {band.basis} reach {band.low_share * 100:.0f}–{band.high_share * 100:.0f} % "
        f"(median {band.median_share * 100:.0f} %, n={band.n})."
    )


def _draft_acceptance(view: ModelView, t: Thresholds) -> Finding | None:
    """Speculative decoding that does not pay: few drafted tokens accepted, or decode measured slower
    than the same model's plain decode (an earlier session without it)."""
    model = view.model
    rate, speedup = model.draft_acceptance, model.spec_speedup
    low_acceptance = rate is not None and rate < t.draft_acceptance_min
    slower = speedup is not None and speedup < t.spec_min_speedup
    if not (low_acceptance or slower):
        return None
    kind = model.spec_type
    what = f"Speculative decoding ({kind})" if kind else "Speculative decoding"
    if low_acceptance:
        assert rate is not None
        message = (
            f"{what} on {model.name} accepts only {rate * 100:.0f} % of drafted tokens: {_spec_cost(kind)}"
        )
    else:
        message = f"{what} on {model.name} costs more than it saves: {_spec_cost(kind)}"
    if speedup is not None:
        message += f"; decode runs at {speedup:.2f}× the plain decode of an earlier session."
    else:
        message += ", and may make decode slower than without it."
    evidence = {
        "draft_acceptance": None if rate is None else round(rate, 3),
        "min_acceptance": t.draft_acceptance_min,
        "spec_type": kind,
        "speedup": None if speedup is None else round(speedup, 3),
    }
    score = max(1 - rate if rate is not None else 0.0, 1 - speedup if speedup is not None else 0.0)
    return Finding(
        "draft_acceptance",
        "warning",
        view.server.url,
        model.name,
        message,
        _spec_fix(kind),
        evidence,
        score=score,
        fix_commands=no_speculation_commands(view.server.kind, model.name, router=view.server.router),
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
    """Slower than the baseline, like with like: exact rates against an exact baseline need
    `regression_pct`; anything estimated needs `ESTIMATE_MARGIN_PCT` more (a poll's error is no
    regression). The fastest of the `REGRESSION_EVIDENCE` newest rates must be that slow, so one
    noisy tick raises nothing; the figure is their median."""
    base = view.baseline
    model = view.model
    if base is None or base.decode_tok_s <= 0:
        return None
    recent_points = list(view.trend)[-5:]
    if len(recent_points) < REGRESSION_EVIDENCE:
        return None
    now_ctx = median(p.context_tokens for p in recent_points)
    if base.context_tokens is not None and abs(now_ctx - base.context_tokens) > max(
        1024, 0.5 * base.context_tokens
    ):
        return None  # a deeper context is slower anyway (kv_slowdown's business), not a regression
    newest = recent_points[-REGRESSION_EVIDENCE:]
    exact = base.exact and all(p.exact for p in newest)
    needed_pct = t.regression_pct + (0.0 if exact else ESTIMATE_MARGIN_PCT)
    if (1 - max(p.decode_tok_s for p in newest) / base.decode_tok_s) * 100 < needed_pct:
        return None
    now_rate = median(p.decode_tok_s for p in newest)
    drop = 1 - now_rate / base.decode_tok_s
    old_v, new_v = base.server_version, view.server.version
    engine = engine_label(view.server.kind)
    versions = bool(old_v and new_v and old_v != new_v)
    kind = "bench" if base.source == "bench" else "session"
    baseline = f"{kind + ' ' if kind == 'bench' else ''}baseline on this hardware at a comparable context"
    if versions:  # the build that made it slower, named first
        message = (
            f"{model.name} is slower since {engine} {old_v} → {new_v}: {format_rate(base.decode_tok_s)} → "
            f"{format_rate(now_rate)} tok/s, {drop * 100:.0f} % below its {baseline}."
        )
    else:
        message = (
            f"{model.name} decodes at {format_rate(now_rate)} tok/s, {drop * 100:.0f} % below its "
            f"{format_rate(base.decode_tok_s)} tok/s {baseline}."
        )
    fix = (
        f"Compare with the earlier {engine} build ({old_v}): run it again to confirm, check the release "
        "notes between the two, and report it upstream with `llm-tray report`."
        if versions
        else f"Check what changed since the baseline {kind}: drivers, server flags, other GPU work."
    )
    commands = (report_command(model.session_id),) if versions else ()
    cause = None
    if view.throttle is not None:
        cause = view.throttle.text
        message += f" Held back now: {cause}."
        fix = "Check cooling and power limits before suspecting the server. " + fix
    evidence: dict[str, object] = {
        "decode_tok_s": round(now_rate, 2),
        "baseline_tok_s": round(base.decode_tok_s, 2),
        "drop_pct": round(drop * 100, 1),
        "baseline_session": base.session_id,
        "baseline_source": base.source,
        "exact": exact,
        "needed_pct": needed_pct,
        "baseline_version": old_v,
        "version": new_v,
        "engine": engine,
        "throttle": view.throttle.evidence if view.throttle is not None else None,
    }
    return Finding(
        "regression",
        "warning",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause=cause,
        score=drop,
        fix_commands=commands,
    )


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


def diagnose_hardware(
    hardware: HardwareSnapshot, t: Thresholds, servers: Sequence[ServerStatus] = ()
) -> list[Finding]:
    """GPU-wide findings. `servers`: this machine's servers, whose idle models a `vram_pressure` fix
    names (and unloads, where the server has a command for it)."""
    findings: list[Finding] = []
    idle = _idle_models(servers)
    for gpu in hardware.gpus:
        if not gpu.vram_total_bytes or gpu.vram_used_bytes is None or gpu.unified_memory:
            continue
        free = gpu.vram_total_bytes - gpu.vram_used_bytes
        free_pct = free / gpu.vram_total_bytes * 100
        if free_pct >= t.vram_free_min_pct:
            continue
        holders = holders_besides(HardwareSnapshot((gpu,), hardware.host), ())
        who = holders_text(holders)
        message = (
            f"{gpu.name} has only {format_gb(free)} free ({free_pct:.1f} %): the next context growth or "
            "model load will spill to the CPU."
        )
        if who:
            message += f" Largest users: {who}."
        fix = "Unload idle models (ollama stop, LM Studio eject) or close other GPU programs."
        commands: tuple[str, ...] = ()
        if idle:
            names = ", ".join(name for _, name in idle)
            fix = f"Unload idle models ({names}) or close other GPU programs."
            commands = tuple(c for kind, name in idle for c in unload_commands(kind, name))
        evidence = {
            "vram_free_bytes": free,
            "vram_total_bytes": gpu.vram_total_bytes,
            "free_pct": round(free_pct, 2),
            "vram_holders": holders_evidence(holders),
        }
        findings.append(
            Finding(
                "vram_pressure",
                "warning",
                f"gpu:{gpu.index}",
                None,
                message,
                fix,
                evidence,
                score=-free_pct,
                fix_commands=commands,
            )
        )
    return findings


IDLE_MODELS_NAMED = 3  # a vram_pressure fix names at most this many idle models, the largest first


def _idle_models(servers: Sequence[ServerStatus]) -> list[tuple[str, str]]:
    """(server kind, model name) of the idle models in GPU memory that their server can unload
    (Ollama, LM Studio: a llama-server's one model goes only with the server), largest first."""
    idle = [
        (model.vram_bytes or 0, server.kind, model.name)
        for server in servers
        if server.status == "ok"
        for model in server.models
        if model.phase == "idle"
        and (model.vram_bytes is None or model.vram_bytes > 0)
        and unload_commands(server.kind, model.name)  # a server that can unload one and keep running
    ]
    idle.sort(key=lambda entry: -entry[0])
    return [(kind, name) for _, kind, name in idle[:IDLE_MODELS_NAMED]]
