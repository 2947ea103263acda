"""The context detectors: decode slowing as the KV cache grows (`kv_slowdown`), and a context
window about to fill (`context_full`, with a larger context that fits as its fix)."""

from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING

from trayapp.core import physics
from trayapp.core.alert_kinds import AlertKindName
from trayapp.core.fixes import (
    CONTEXT_STEP_TOKENS,
    KV_FIX_TYPE,
    context_size_commands,
    kv_cache_commands,
    kv_cache_where,
    round_up_context,
)
from trayapp.core.model import Finding, Severity
from trayapp.core.offload import free_gpu_bytes, parallel_slots
from trayapp.core.placement import ceiling_for
from trayapp.core.quants import kv_is_full_precision
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_rate, format_tokens

if TYPE_CHECKING:
    from trayapp.core.diagnose import ModelView


def resolved_kinds(view: ModelView) -> frozenset[AlertKindName]:
    """Kinds whose cause is certainly gone at this tick, so their episodes end at once: a KV
    slowdown once a fresh conversation began (the context back under 80 % of this session's deepest,
    where `kv_slowdown` stops finding it too)."""
    deepest = max((p.context_tokens for p in view.trend), default=0)
    now = view.model.context_tokens
    if deepest and now is not None and now < 0.8 * deepest:
        return frozenset({"kv_slowdown"})
    return frozenset()


def kv_slowdown(view: ModelView, t: Thresholds) -> Finding | None:
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


def context_full(view: ModelView, t: Thresholds) -> Finding | None:
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
