"""Decode physics (trayapp.core.physics): the worked examples of DOMAIN.md §1–3."""

from __future__ import annotations

import dataclasses

import pytest

from trayapp.core import physics
from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.modelfacts import kv_layout_from_metadata

GB = 1e9
GIB = 1024**3
KIB = 1024
MIB = 1024**2


def num(value: float | None) -> float:
    """The value, asserting that it is known."""
    assert value is not None
    return value


def close(value: float | None, expected: float, rel: float = 0.03) -> bool:
    return value is not None and abs(value - expected) <= rel * expected


def facts(weights_bytes: float, kv: KvLayout | None = None, quant: str | None = "Q4_K_M") -> ModelFacts:
    return ModelFacts(
        weights_bytes=int(weights_bytes),
        bytes_per_token=int(weights_bytes),
        exact=False,
        source="test",
        quantization=quant,
        kv=kv,
    )


LLAMA_31_8B_META = {
    "general.architecture": "llama",
    "llama.block_count": 32,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.embedding_length": 4096,
}


# --------------------------------------------------------------------------- §1 worked examples


@pytest.mark.parametrize(
    ("bandwidth_gbps", "weights_gb", "expected_tok_s"),
    [
        (1008, 4.9, 205),  # RTX 4090, 8B Q4_K_M
        (546, 18, 30),  # M4 Max, 31B Q4
        (1792, 5, 350),  # RTX 5090, 8B Q4
        (614, 40, 15),  # M5 Max, 70B Q4
    ],
)
def test_worked_ceilings(bandwidth_gbps: float, weights_gb: float, expected_tok_s: float) -> None:
    assert close(physics.ceiling_tok_s(weights_gb * GB, bandwidth_gbps), expected_tok_s)


def test_70b_q4_does_not_fit_a_24gb_4090() -> None:
    needed = physics.required_bytes(int(40 * GB), 0)
    assert physics.fits(needed, 24 * GIB) is False
    # Capacity, not speed: the ceiling itself would be fine.
    assert num(physics.ceiling_tok_s(40 * GB, 1008)) > 20


def test_70b_bf16_takes_80_ms_per_token_on_a_5090() -> None:
    assert close(physics.time_per_token_s(140 * GB, 1792), 0.080)
    assert close(physics.time_per_token_s(140 * GB, 1800), 0.080)


def test_fp16_8b_is_three_times_slower_than_q4_k_m() -> None:
    q4 = facts(4.9 * GB)
    f16 = physics.requantize(q4, "F16")
    assert f16 is not None
    assert close(f16.weights_bytes, 16 * GB)  # "reads ~16 GB/token"
    ratio = num(physics.ceiling_tok_s(q4.bytes_per_token, 1008)) / num(
        physics.ceiling_tok_s(f16.bytes_per_token, 1008)
    )
    assert 2.9 < ratio < 3.4


# --------------------------------------------------------------------------- §2 offload cliff


def test_split_example_80_20_gives_about_50_tok_s() -> None:
    split = physics.split_ceiling_tok_s(4.9 * GB, 0.8, 1008, 60)
    assert close(split, 50)
    full = physics.split_ceiling_tok_s(4.9 * GB, 1.0, 1008, 60)
    assert close(full, 205)
    assert num(split) < num(full) / 3.5  # a quarter of GPU speed, not 80 % of it


def test_split_needs_ram_bandwidth_only_when_something_is_in_ram() -> None:
    assert physics.split_ceiling_tok_s(4.9 * GB, 1.0, 1008, None) == pytest.approx(1008 * GB / (4.9 * GB))
    assert physics.split_ceiling_tok_s(4.9 * GB, 0.5, 1008, None) is None


def test_decode_time_sums_over_devices() -> None:
    seconds = physics.decode_time_s([(3.92 * GB, 1008), (0.98 * GB, 60), (0, None)])
    assert seconds == pytest.approx(3.92 / 1008 + 0.98 / 60)
    assert physics.decode_time_s([(1 * GB, None)]) is None
    assert physics.decode_time_s([(1 * GB, 0)]) is None


def test_unknown_inputs_give_none() -> None:
    assert physics.ceiling_tok_s(4.9 * GB, None) is None
    assert physics.ceiling_tok_s(None, 1008) is None
    assert physics.ceiling_tok_s(0, 1008) is None
    assert physics.realistic_band(None) is None


# --------------------------------------------------------------------------- §3 KV cache


def test_llama_31_8b_kv_is_128_kib_per_token() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    assert kv is not None
    assert physics.kv_bytes_per_token(kv) == 128 * KIB
    assert physics.kv_cache_bytes(kv, 4096) == 512 * MIB
    assert physics.kv_cache_bytes(kv, 65536) == 8 * GIB
    assert physics.kv_cache_bytes(kv, 4096, "q8_0") == pytest.approx(512 * MIB * 34 / 64)
    assert physics.kv_cache_bytes(None, 4096) == 0
    with pytest.raises(ValueError, match="unknown KV cache type"):
        physics.kv_cache_bytes(kv, 4096, "bogus")


def test_kv_growth_slows_decode() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    model = facts(4.9 * GB, kv)
    empty = physics.ceiling_at_context_tok_s(model, 0, 1008)
    deep = physics.ceiling_at_context_tok_s(model, 65536, 1008)
    assert close(empty, 205)
    # 4.9 GB + 8.6 GB of KV per token at 64k: well under half the empty-context ceiling.
    assert deep == pytest.approx(1008 * GB / (4.9 * GB + 8 * GIB))
    assert num(deep) < num(empty) / 2


def test_swa_layers_are_capped_at_their_window() -> None:
    kv = KvLayout(full_elems_per_token=1000, swa_elems_per_token=5000, sliding_window=512)
    assert physics.kv_cache_bytes(kv, 256) == (1000 + 5000) * 256 * 2
    at_window = physics.kv_cache_bytes(kv, 512)
    deep = physics.kv_cache_bytes(kv, 8192)
    assert deep - at_window == 1000 * (8192 - 512) * 2  # only full layers keep growing
    no_window = dataclasses.replace(kv, sliding_window=None)
    assert physics.kv_cache_bytes(no_window, 8192) == 6000 * 8192 * 2


def test_kv_split_follows_the_gpu_fraction() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    model = facts(4.9 * GB, kv)
    kv_bytes = physics.kv_cache_bytes(kv, 8192)
    rate = physics.ceiling_at_context_tok_s(model, 8192, 1008, gpu_fraction=0.8, ram_bandwidth_gbps=60)
    total = 4.9 * GB + kv_bytes
    expected = 1 / (0.8 * total / (1008 * GB) + 0.2 * total / (60 * GB))
    assert rate == pytest.approx(expected, rel=1e-6)


def test_ceiling_curve_falls_with_context() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    curve = physics.ceiling_curve(facts(4.9 * GB, kv), 1008, 65536, points=9)
    assert len(curve) == 9
    assert curve[0] == (0, pytest.approx(1008 / 4.9))
    assert curve[-1][0] == 65536
    rates = [r for _, r in curve]
    assert rates == sorted(rates, reverse=True)
    assert physics.ceiling_curve(facts(4.9 * GB, kv), None, 65536) == []


# --------------------------------------------------------------------------- MoE


def test_moe_reads_active_bytes_only() -> None:
    # Mixtral 8x7B-like: 46B total, ~12.9B active, both at Q4_K_M.
    total = physics.requantize(facts(46.7e9 * 4.89 / 8), "Q4_K_M")
    assert total is not None
    moe = dataclasses.replace(total, bytes_per_token=int(12.9e9 * 4.89 / 8))
    dense_rate = physics.ceiling_tok_s(total.bytes_per_token, 1008)
    moe_rate = physics.ceiling_tok_s(moe.bytes_per_token, 1008)
    assert num(moe_rate) / num(dense_rate) == pytest.approx(46.7 / 12.9, rel=1e-3)
    # Capacity still counts every expert.
    assert physics.required_bytes(moe.weights_bytes, 0) > 28 * GB


# --------------------------------------------------------------------------- band and capacity


def test_realistic_band() -> None:
    assert physics.REALISTIC_BAND == (0.60, 0.75)
    band = physics.realistic_band(205.0)
    assert band is not None
    low, high = band
    assert low == pytest.approx(123.0)
    assert high == pytest.approx(153.75)
    # The observed 120–150 tok/s on a 4090 sits in the band.
    assert low <= 150 and high >= 120


def test_capacity_check_and_overhead() -> None:
    overhead = physics.runtime_overhead_bytes(4.9 * GB)
    assert overhead == int(GIB / 2 + 0.02 * 4.9 * GB)
    needed = physics.required_bytes(int(4.9 * GB), 512 * MIB)
    assert needed == int(4.9 * GB) + 512 * MIB + overhead
    assert physics.fits(needed, 8 * GIB) is True
    assert physics.fits(needed, int(6 * GB)) is False
    assert physics.fits(needed, None) is None


def test_auto_gpu_fraction() -> None:
    weights, kv = int(40 * GB), int(1 * GB)
    capacity = 24 * GIB
    fraction = physics.auto_gpu_fraction(weights, kv, capacity)
    assert fraction is not None and 0.5 < fraction < 0.65
    # At that fraction the GPU part plus overhead fills the GPU exactly.
    used = fraction * (weights + kv) + physics.runtime_overhead_bytes(fraction * weights)
    assert used == pytest.approx(capacity, rel=1e-9)
    assert physics.auto_gpu_fraction(int(4.9 * GB), kv, capacity) == 1.0
    assert physics.auto_gpu_fraction(weights, kv, 100 * MIB) == 0.0
    assert physics.auto_gpu_fraction(weights, kv, None) is None


def test_max_context_that_fits() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    weights = int(4.9 * GB)
    capacity = 8 * GIB
    best = physics.max_context_that_fits(weights, kv, capacity)
    assert best is not None and 10_000 < best < 30_000
    assert physics.fits(physics.required_bytes(weights, physics.kv_cache_bytes(kv, best)), capacity)
    assert not physics.fits(physics.required_bytes(weights, physics.kv_cache_bytes(kv, best + 1)), capacity)
    # q8_0 KV nearly doubles the context that fits.
    q8 = physics.max_context_that_fits(weights, kv, capacity, "q8_0")
    assert q8 is not None and 1.8 < q8 / best < 1.9
    assert physics.max_context_that_fits(weights, kv, capacity, max_tokens=4096) == 4096
    assert physics.max_context_that_fits(int(40 * GB), kv, capacity) == 0
    assert physics.max_context_that_fits(weights, kv, None) is None


# --------------------------------------------------------------------------- requantize


def test_requantize_scales_by_effective_bpw() -> None:
    kv = kv_layout_from_metadata(LLAMA_31_8B_META)
    q4 = dataclasses.replace(facts(4.9 * GB, kv), exact=True, source="gguf")
    q8 = physics.requantize(q4, "Q8_0")
    assert q8 is not None
    assert q8.weights_bytes == round(4.9 * GB * 8.5 / 4.89)
    assert q8.bytes_per_token == q8.weights_bytes
    assert q8.quantization == "Q8_0"
    assert q8.kv == kv
    assert q8.exact is False
    assert physics.requantize(q4, "q4_k_m") is q4
    assert physics.requantize(q4, "nonsense") is None


def test_requantize_falls_back_to_measured_bpw() -> None:
    unknown_quant = ModelFacts(
        weights_bytes=int(4 * GB),
        bytes_per_token=int(4 * GB),
        exact=True,
        source="t",
        parameter_count=8_000_000_000,
    )
    q8 = physics.requantize(unknown_quant, "Q8_0")
    assert q8 is not None
    assert q8.weights_bytes == pytest.approx(8e9 * 8.5 / 8, rel=1e-9)  # measured 4.0 bpw → 8.5
    nothing_known = ModelFacts(weights_bytes=int(4 * GB), bytes_per_token=int(4 * GB), exact=True, source="t")
    assert physics.requantize(nothing_known, "Q8_0") is None
