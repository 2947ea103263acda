"""`llm-tray ceiling`: how fast can this model decode on this machine, and does it fit?

`build_ceiling_report` returns a JSON-ready dict; `format_ceiling_report` renders it
for humans. Every ceiling comes from `trayapp.core.placement.ceiling_for`, the rule the
tray, `status` and the detectors use; fit and KV sizes from `trayapp.core.physics`
(GB = 10^9 bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trayapp.core.machine import Machine
from trayapp.core.model import ModelFacts
from trayapp.core.physics import (
    REALISTIC_BAND,
    auto_gpu_fraction,
    fits,
    kv_cache_bytes,
    max_context_that_fits,
    realistic_band,
    requantize,
    required_bytes,
)
from trayapp.core.placement import ceiling_for, effective_gpu_fraction
from trayapp.core.quants import COMMON_QUANTS, normalize_quant_name, quant_note
from trayapp.core.units import format_bytes

_MAX_CONTEXT_SEARCH_TOKENS = 1 << 21


def build_ceiling_report(
    facts: ModelFacts,
    machine: Machine,
    context_tokens: int = 4096,
    gpu_fraction: float | None = None,
) -> dict[str, Any]:
    """The decode ceiling of `facts` on `machine` (its KV cache type included) at `context_tokens`,
    with a quant ladder.

    `ceiling_tok_s` assumes everything in fast memory (or the given `gpu_fraction` on a discrete
    GPU, the rest at RAM bandwidth; unified memory is one memory) and counts the KV cache read at
    that context. `split_ceiling_tok_s` is the automatic split when the model does not fit a
    discrete GPU. Unknown inputs give None values and a line in `notes`.
    """
    context = max(int(context_tokens), 0)
    bandwidth = machine.fast_bandwidth_gbps
    kv_type = machine.kv_type
    ram_bandwidth = machine.ram_bandwidth_gbps
    notes: list[str] = []

    kv_bytes = kv_cache_bytes(facts.kv, context, kv_type) if facts.kv is not None else None
    if kv_bytes is None:
        notes.append("KV-cache layout unknown: KV size and reads are left out")
    kv = kv_bytes or 0
    per_token_at_context = facts.bytes_per_token + kv
    needed = required_bytes(facts.weights_bytes, kv)
    available = machine.fast_capacity_bytes
    fit = fits(needed, available)
    if fit is None:
        notes.append("memory capacity unknown: cannot tell whether the model fits")

    given = None if gpu_fraction is None else min(max(gpu_fraction, 0.0), 1.0)
    fraction = effective_gpu_fraction(machine, given)
    if given is not None and fraction != given:
        notes.append("one memory (unified, or no GPU): a GPU share does not apply")
    ceiling = ceiling_for(facts, context, machine, fraction)
    ceiling_empty = ceiling_for(facts, 0, machine, fraction)
    if bandwidth is None:
        notes.append("memory bandwidth unknown: give --bandwidth-gbps or --gpu")
    elif fraction < 1.0 and ram_bandwidth is None:
        notes.append("RAM bandwidth unknown: cannot rate the CPU-resident part")
    if not machine.has_gpu:
        notes.append(
            "CPU only: the ceiling is an upper bound, not a prediction; CPU compute (attention, a large "
            "output head) often holds small models well below it"
        )

    auto_fraction: float | None = None
    split: float | None = None
    if gpu_fraction is None and fit is False:
        if machine.has_gpu and not machine.unified_memory:
            auto_fraction = auto_gpu_fraction(facts.weights_bytes, kv, available)
            if auto_fraction is not None:
                split = ceiling_for(facts, context, machine, auto_fraction)
            if split is None:
                notes.append("does not fit and RAM bandwidth is unknown: the offload speed cannot be rated")
            else:
                notes.append(
                    f"does not fit: about {auto_fraction:.0%} on the GPU, the rest from RAM "
                    "(a smaller quant or context usually beats offloading)"
                )
        else:
            notes.append("does not fit in memory: it will swap or fail to load")

    if split is not None:
        expected = realistic_band(split)
    elif fit is False and gpu_fraction is None:
        expected = None
    else:
        expected = realistic_band(ceiling)

    context_limit = facts.context_train or _MAX_CONTEXT_SEARCH_TOKENS
    max_context = (
        max_context_that_fits(facts.weights_bytes, facts.kv, available, kv_type, context_limit)
        if facts.kv is not None
        else None
    )

    current = normalize_quant_name(facts.quantization)
    quants: list[dict[str, object]] = []
    for quant in COMMON_QUANTS:
        variant = requantize(facts, quant)
        if variant is None:
            continue
        quants.append(
            {
                "quant": quant,
                "current": quant == current,
                "weights_bytes": variant.weights_bytes,
                "ceiling_tok_s": ceiling_for(variant, context, machine, 1.0),
                "fits": fits(required_bytes(variant.weights_bytes, kv), available),
                "note": quant_note(quant),
            }
        )
    if not quants:
        notes.append("quantization and parameter count unknown: no quant comparison")

    return {
        "model_quant": facts.quantization,
        "architecture": facts.architecture,
        "exact": facts.exact,
        "facts_source": facts.source,
        "weights_bytes": facts.weights_bytes,
        "bytes_per_token": facts.bytes_per_token,
        "bytes_per_token_at_context": per_token_at_context,
        "context": context,
        "kv_type": kv_type,
        "kv_bytes": kv_bytes,
        "machine": machine.label,
        "bandwidth_gbps": bandwidth,
        "ram_bandwidth_gbps": ram_bandwidth,
        "unified_memory": machine.unified_memory,
        "gpu_fraction": fraction,
        "ceiling_tok_s": ceiling,
        "ceiling_empty_context_tok_s": ceiling_empty,
        "split_ceiling_tok_s": split,
        "auto_gpu_fraction": auto_fraction,
        "expected_tok_s": list(expected) if expected is not None else None,
        "realistic_band": list(REALISTIC_BAND),
        "fits": fit,
        "required_bytes": needed,
        "available_bytes": available,
        "max_context_fits": max_context,
        "sources": dict(machine.sources),
        "quants": quants,
        "notes": notes,
    }


# --------------------------------------------------------------------------- text output


def _bytes(value: object) -> str:
    return format_bytes(value if isinstance(value, (int, float)) else None)


def _rate(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "—"
    if value >= 100:
        return f"{value:,.0f} tok/s"
    if value >= 10:
        return f"{value:.1f} tok/s"
    return f"{value:.2f} tok/s"


def _fits(value: object) -> str:
    return "yes" if value is True else "no" if value is False else "?"


def _source(sources: Mapping[str, object], key: str) -> str:
    value = sources.get(key)
    return f" ({value})" if value else ""


def format_ceiling_report(report: Mapping[str, Any]) -> str:
    """A short human-readable summary and quant table of a `build_ceiling_report` result."""
    sources = report.get("sources")
    sources = sources if isinstance(sources, Mapping) else {}
    bandwidth = report.get("bandwidth_gbps")
    ram = report.get("ram_bandwidth_gbps")
    bw_text = f"{bandwidth:,.0f} GB/s" if isinstance(bandwidth, (int, float)) else "bandwidth unknown"
    machine = f"{report.get('machine')}: {bw_text}{_source(sources, 'bandwidth')}"
    machine += f", {_bytes(report.get('available_bytes'))}{_source(sources, 'capacity')}"
    if isinstance(ram, (int, float)) and not report.get("unified_memory"):
        machine += f"; RAM {ram:,.0f} GB/s{_source(sources, 'ram_bandwidth')}"

    exact = "exact, from the model file" if report.get("exact") else "estimated"
    quant = report.get("model_quant") or "unknown quant"
    context = report.get("context")
    context_text = f"{context:,}" if isinstance(context, int) else "?"
    ceiling = report.get("ceiling_tok_s")
    ms = f" ({1000 / ceiling:.2f} ms/token)" if isinstance(ceiling, (int, float)) and ceiling > 0 else ""

    lines = [
        f"Model     {quant}, {_bytes(report.get('weights_bytes'))} weights ({exact})",
        f"Machine   {machine}",
        f"Reads     {_bytes(report.get('bytes_per_token'))} weights + {_bytes(report.get('kv_bytes'))} KV "
        f"per token at {context_text} tokens ({report.get('kv_type')} cache)",
    ]
    fraction = report.get("gpu_fraction")
    if isinstance(fraction, (int, float)) and fraction < 1.0:
        where = f"{fraction:.0%} on the GPU, the rest in RAM"
    else:
        where = "all in fast memory"
    lines.append(f"Ceiling   {_rate(ceiling)}{ms} at {context_text} tokens, {where}")
    empty = report.get("ceiling_empty_context_tok_s")
    if isinstance(empty, (int, float)) and empty != ceiling:
        lines.append(f"          {_rate(empty)} at empty context (weights only)")
    if report.get("split_ceiling_tok_s") is not None:
        auto = report.get("auto_gpu_fraction")
        share = f"{auto:.0%}" if isinstance(auto, float) else "?"
        lines.append(f"Offloaded {_rate(report.get('split_ceiling_tok_s'))} with {share} on the GPU")
    expected = report.get("expected_tok_s")
    if isinstance(expected, (list, tuple)) and len(expected) == 2:
        low = _rate(expected[0]).removesuffix(" tok/s")
        lines.append(f"Expect    {low}–{_rate(expected[1])} (60–75 % of the ceiling)")
    fit = report.get("fits")
    verdict = "fits" if fit is True else "does NOT fit" if fit is False else "unknown"
    needs = f"needs {_bytes(report.get('required_bytes'))} of {_bytes(report.get('available_bytes'))}"
    lines.append(f"Memory    {needs}: {verdict}")
    max_context = report.get("max_context_fits")
    if isinstance(max_context, int):
        lines.append(f"Context   up to {max_context:,} tokens fit")

    quants = report.get("quants")
    if isinstance(quants, list) and quants:
        lines.append("")
        lines.append(f"{'quant':<8} {'weights':>9} {'ceiling':>14}  fits  note")
        for row in quants:
            marker = "*" if row.get("current") else " "
            lines.append(
                f"{row.get('quant', '?'):<7}{marker} {_bytes(row.get('weights_bytes')):>9} "
                f"{_rate(row.get('ceiling_tok_s')):>14}  {_fits(row.get('fits')):<4}  {row.get('note') or ''}"
            )
    notes = report.get("notes")
    if isinstance(notes, list) and notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in notes)
    return "\n".join(lines)
