"""Decode-speed physics: tok/s ceiling = memory bandwidth ÷ bytes read per token.

Every decoded token reads the active weights once plus the live KV cache, from
wherever they sit; the time per token is the sum over memories of
bytes ÷ bandwidth (DOMAIN.md §1–3, reference/hardware.md §5). GB = 10^9 bytes
everywhere; bandwidths are GB/s. Functions return None when an input they need
is unknown (absence is data), never raise for a missing number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.quants import EFFECTIVE_BPW, kv_bytes_per_element, normalize_quant_name
from trayapp.core.units import GB, GIB

# Realised single-stream decode on a healthy, fully resident GPU (DOMAIN.md §1, seed 001).
REALISTIC_BAND: tuple[float, float] = (0.60, 0.75)

# Memory a runtime needs besides weights and KV: CUDA/Metal context, compute buffers,
# logits. Model: a fixed 0.5 GiB plus 2 % of the weights held on the device. This matches
# llama.cpp's typical "CUDA0 compute buffer" (a few hundred MiB) plus the driver context
# for 1–70B models; it is a planning margin, not a measurement.
RUNTIME_OVERHEAD_BASE_BYTES = GIB // 2
RUNTIME_OVERHEAD_WEIGHTS_SHARE = 0.02

# --------------------------------------------------------------------------- KV cache


def kv_cache_bytes(kv: KvLayout | None, context_tokens: int, kv_type: str = "f16") -> int:
    """Bytes of KV cache live at `context_tokens` (sliding-window layers capped at their window).

    A missing layout counts as 0 bytes. Raises ValueError for an unknown `kv_type`.
    """
    if kv is None or context_tokens <= 0:
        return 0
    per_elem = kv_bytes_per_element(kv_type)
    swa_tokens = context_tokens if kv.sliding_window is None else min(context_tokens, kv.sliding_window)
    elems = kv.full_elems_per_token * context_tokens + kv.swa_elems_per_token * swa_tokens
    return round(elems * per_elem)


def kv_bytes_per_token(kv: KvLayout | None, kv_type: str = "f16") -> int:
    """KV bytes one more token of context adds (all layers, ignoring any SWA cap)."""
    if kv is None:
        return 0
    return round((kv.full_elems_per_token + kv.swa_elems_per_token) * kv_bytes_per_element(kv_type))


# --------------------------------------------------------------------------- time and ceilings


def decode_time_s(placements: Sequence[tuple[float, float | None]]) -> float | None:
    """Seconds per token for (bytes read on a device, that device's GB/s) pairs.

    time/token = Σ bytes_on_device ÷ bandwidth_device. Devices with 0 bytes are skipped;
    a device holding bytes with unknown or zero bandwidth makes the result None.
    """
    total_s = 0.0
    for n_bytes, bandwidth_gbps in placements:
        if n_bytes <= 0:
            continue
        if not bandwidth_gbps or bandwidth_gbps <= 0:
            return None
        total_s += n_bytes / (bandwidth_gbps * GB)
    return total_s


def ceiling_tok_s(bytes_per_token: float | None, bandwidth_gbps: float | None) -> float | None:
    """Decode ceiling (tok/s) when `bytes_per_token` are read at `bandwidth_gbps`."""
    if not bytes_per_token or bytes_per_token <= 0 or not bandwidth_gbps or bandwidth_gbps <= 0:
        return None
    return bandwidth_gbps * GB / bytes_per_token


def time_per_token_s(bytes_per_token: float | None, bandwidth_gbps: float | None) -> float | None:
    """Seconds to read `bytes_per_token` once at `bandwidth_gbps`."""
    rate = ceiling_tok_s(bytes_per_token, bandwidth_gbps)
    return 1.0 / rate if rate else None


def split_ceiling_tok_s(
    bytes_per_token: float | None,
    gpu_fraction: float,
    gpu_bandwidth_gbps: float | None,
    ram_bandwidth_gbps: float | None,
) -> float | None:
    """Ceiling with `gpu_fraction` of the bytes on the GPU and the rest computed from RAM.

    The CPU part runs at RAM bandwidth and the two times add up (DOMAIN.md §2).
    """
    if not bytes_per_token or bytes_per_token <= 0:
        return None
    fraction = min(max(gpu_fraction, 0.0), 1.0)
    seconds = decode_time_s(
        [
            (bytes_per_token * fraction, gpu_bandwidth_gbps),
            (bytes_per_token * (1 - fraction), ram_bandwidth_gbps),
        ]
    )
    return 1.0 / seconds if seconds else None


def bytes_per_token_at_context(facts: ModelFacts, context_tokens: int, kv_type: str = "f16") -> int:
    """Bytes read per decoded token at a context depth: active weights + the live KV cache."""
    return facts.bytes_per_token + kv_cache_bytes(facts.kv, context_tokens, kv_type)


def ceiling_at_context_tok_s(
    facts: ModelFacts,
    context_tokens: int,
    bandwidth_gbps: float | None,
    kv_type: str = "f16",
    gpu_fraction: float = 1.0,
    ram_bandwidth_gbps: float | None = None,
) -> float | None:
    """Ceiling at `context_tokens`: weights + KV read per token, both split by `gpu_fraction`.

    With `gpu_fraction` < 1 the CPU-resident layers (and their share of the KV cache)
    are read at `ram_bandwidth_gbps`. A model without a KV layout counts weights only.
    """
    total = bytes_per_token_at_context(facts, context_tokens, kv_type)
    return split_ceiling_tok_s(total, gpu_fraction, bandwidth_gbps, ram_bandwidth_gbps)


def ceiling_curve(
    facts: ModelFacts,
    bandwidth_gbps: float | None,
    max_context_tokens: int,
    kv_type: str = "f16",
    points: int = 33,
    gpu_fraction: float = 1.0,
    ram_bandwidth_gbps: float | None = None,
) -> list[tuple[int, float]]:
    """Ceiling (tok/s) against context depth, `points` evenly spaced from 0 to `max_context_tokens`.

    Returns [] when the ceiling is unknown (no bandwidth).
    """
    points = max(points, 2)
    curve: list[tuple[int, float]] = []
    for i in range(points):
        context = round(max_context_tokens * i / (points - 1))
        rate = ceiling_at_context_tok_s(
            facts, context, bandwidth_gbps, kv_type, gpu_fraction, ram_bandwidth_gbps
        )
        if rate is None:
            return []
        curve.append((context, rate))
    return curve


def realistic_band(ceiling: float | None) -> tuple[float, float] | None:
    """The (low, high) rate a healthy single stream usually reaches under `ceiling`."""
    if ceiling is None:
        return None
    return ceiling * REALISTIC_BAND[0], ceiling * REALISTIC_BAND[1]


# --------------------------------------------------------------------------- capacity


def runtime_overhead_bytes(weights_bytes: float) -> int:
    """Planning margin for runtime buffers: 0.5 GiB + 2 % of the weights on the device."""
    return int(RUNTIME_OVERHEAD_BASE_BYTES + RUNTIME_OVERHEAD_WEIGHTS_SHARE * max(weights_bytes, 0))


def required_bytes(weights_bytes: int, kv_bytes: int) -> int:
    """Memory to hold a model entirely: weights + KV cache + runtime overhead."""
    return int(weights_bytes + kv_bytes + runtime_overhead_bytes(weights_bytes))


def fits(required: int, capacity_bytes: int | None) -> bool | None:
    """True/False when the capacity is known, None when it is not."""
    if capacity_bytes is None:
        return None
    return required <= capacity_bytes


def auto_gpu_fraction(weights_bytes: int, kv_bytes: int, capacity_bytes: int | None) -> float | None:
    """Share of the model (weights, and the same share of KV) that fits in `capacity_bytes`.

    1.0 when everything fits, 0.0 when not even the runtime overhead does, None when the
    capacity is unknown. Solves f × (weights × (1 + overhead share) + kv) + base ≤ capacity,
    mirroring how a layer split puts whole layers (weights and their KV) on the GPU.
    """
    if capacity_bytes is None:
        return None
    if required_bytes(weights_bytes, kv_bytes) <= capacity_bytes:
        return 1.0
    per_full = weights_bytes * (1 + RUNTIME_OVERHEAD_WEIGHTS_SHARE) + kv_bytes
    if per_full <= 0:
        return 1.0
    fraction = (capacity_bytes - RUNTIME_OVERHEAD_BASE_BYTES) / per_full
    return min(max(fraction, 0.0), 1.0)


def max_context_that_fits(
    weights_bytes: int,
    kv: KvLayout | None,
    capacity_bytes: int | None,
    kv_type: str = "f16",
    max_tokens: int = 1 << 24,
) -> int | None:
    """Largest context (tokens, ≤ `max_tokens`) whose KV cache still fits beside the weights.

    None when the capacity is unknown; 0 when the weights alone do not fit.
    """
    if capacity_bytes is None:
        return None
    if required_bytes(weights_bytes, 0) > capacity_bytes:
        return 0
    lo, hi = 0, max_tokens
    if required_bytes(weights_bytes, kv_cache_bytes(kv, hi, kv_type)) <= capacity_bytes:
        return hi
    while lo < hi:  # KV grows monotonically with context: binary search
        mid = (lo + hi + 1) // 2
        if required_bytes(weights_bytes, kv_cache_bytes(kv, mid, kv_type)) <= capacity_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------- what-ifs


def requantize(facts: ModelFacts, quant: str) -> ModelFacts | None:
    """The same model at another quantization: weights and bytes/token scaled by the bpw ratio.

    The ratio is table bpw(new) ÷ table bpw(current); when the current level is not in the
    table, the measured bits per weight (weights × 8 ÷ parameters) stands in. The KV layout
    is kept. None when `quant` or the current bits per weight are unknown.
    """
    target = normalize_quant_name(quant)
    new_bpw = EFFECTIVE_BPW.get(target) if target else None
    current = normalize_quant_name(facts.quantization)
    old_bpw = EFFECTIVE_BPW.get(current) if current else None
    if old_bpw is None and facts.parameter_count:
        old_bpw = facts.weights_bytes * 8 / facts.parameter_count
    if new_bpw is None or not old_bpw:
        return None
    if target == current:
        return facts
    ratio = new_bpw / old_bpw
    return dataclasses.replace(
        facts,
        weights_bytes=round(facts.weights_bytes * ratio),
        bytes_per_token=round(facts.bytes_per_token * ratio),
        exact=False,
        source=f"{facts.source}, requantized",
        quantization=target,
    )
