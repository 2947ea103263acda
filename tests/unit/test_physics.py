"""Decode physics (trayapp.core.physics): the worked examples of DOMAIN.md §1–3.

Every expected value is a literal worked out by hand from DOMAIN.md (its worked examples are
golden values) and reference/hardware.md §5, with the arithmetic beside it; physics is imported
only as the code under test. GB = 10^9 B, GiB = 2^30 B, bandwidths in GB/s.
"""

from __future__ import annotations

import dataclasses

import pytest

from trayapp.core import physics
from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.modelfacts import kv_layout_from_metadata

GB = 1e9  # units for inputs only: 4.9 * GB is "4.9 GB"
GIB = 1024**3
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


# Llama-3.1-8B (hardware.md §5.3): 32 layers × 8 KV heads × (128 + 128) = 65_536 KV elements per
# token; at 2 B (f16) that is 131_072 B = 128 KiB per token.
KV_8B = KvLayout(full_elems_per_token=65_536, n_layers=32)

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
        (1008, 4.9, 205),  # RTX 4090, 8B Q4_K_M: 1008 / 4.9 = 205.7
        (546, 18, 30),  # M4 Max, 31B Q4: 546 / 18 = 30.3
        (1792, 5, 350),  # RTX 5090, 8B Q4: 1792 / 5 = 358.4 ("≈ 350", within 3 %)
        (614, 40, 15),  # M5 Max, 70B Q4: 614 / 40 = 15.35
    ],
)
def test_worked_ceilings(bandwidth_gbps: float, weights_gb: float, expected_tok_s: float) -> None:
    assert close(physics.ceiling_tok_s(weights_gb * GB, bandwidth_gbps), expected_tok_s)


def test_70b_q4_does_not_fit_a_24gb_4090() -> None:
    needed = physics.required_bytes(int(40 * GB), 0)
    # 40e9 of weights + the runtime overhead (0.5 GiB + 2 % of the weights, see
    # test_capacity_check_and_overhead) = 40_000_000_000 + 536_870_912 + 800_000_000.
    assert needed == 41_336_870_912
    assert physics.fits(needed, 24 * GIB) is False  # 41.3 GB > 25_769_803_776 B
    # Capacity, not speed: the ceiling itself would be fine (1008 / 40 = 25.2 tok/s).
    assert physics.ceiling_tok_s(40 * GB, 1008) == pytest.approx(25.2)


def test_70b_bf16_takes_80_ms_per_token_on_a_5090() -> None:
    assert close(physics.time_per_token_s(140 * GB, 1792), 0.080)  # 140 / 1792 = 78.1 ms
    assert close(physics.time_per_token_s(140 * GB, 1800), 0.080)  # 140 / 1800 = 77.8 ms


def test_fp16_8b_is_three_times_slower_than_q4_k_m() -> None:
    q4 = facts(4.9 * GB)
    f16 = physics.requantize(q4, "F16")
    assert f16 is not None
    # "reads ~16 GB/token": 4.9e9 × 16 / 4.89 (F16 vs Q4_K_M bpw, hardware.md §5.1) = 16_032_719_836 B.
    assert close(f16.weights_bytes, 16 * GB)
    assert f16.weights_bytes == 16_032_719_836
    ratio = num(physics.ceiling_tok_s(q4.bytes_per_token, 1008)) / num(
        physics.ceiling_tok_s(f16.bytes_per_token, 1008)
    )
    assert 2.9 < ratio < 3.4  # "~3× faster": 16 / 4.89 = 3.27


# --------------------------------------------------------------------------- §2 offload cliff


def test_split_example_80_20_gives_about_50_tok_s() -> None:
    # DOMAIN.md §2: 0.8 × 4.9 / 1008 = 3.89 ms + 0.2 × 4.9 / 60 = 16.33 ms → 20.2 ms → 49.5 tok/s.
    split = physics.split_ceiling_tok_s(4.9 * GB, 0.8, 1008, 60)
    assert close(split, 50)
    assert split == pytest.approx(49.45, rel=1e-3)
    full = physics.split_ceiling_tok_s(4.9 * GB, 1.0, 1008, 60)
    assert close(full, 205)  # 1008 / 4.9 = 205.7
    assert num(split) < num(full) / 3.5  # a quarter of GPU speed, not 80 % of it


def test_split_needs_ram_bandwidth_only_when_something_is_in_ram() -> None:
    # 1008 / 4.9 = 205.714 tok/s; nothing in RAM, so RAM's bandwidth is not needed.
    assert physics.split_ceiling_tok_s(4.9 * GB, 1.0, 1008, None) == pytest.approx(205.714, rel=1e-5)
    assert physics.split_ceiling_tok_s(4.9 * GB, 0.5, 1008, None) is None


def test_decode_time_sums_over_devices() -> None:
    seconds = physics.decode_time_s([(3.92 * GB, 1008), (0.98 * GB, 60), (0, None)])
    # 3.92 / 1008 = 0.003889 s + 0.98 / 60 = 0.016333 s = 0.020222 s; the empty device is skipped.
    assert seconds == pytest.approx(0.0202222, rel=1e-5)
    assert physics.decode_time_s([(1 * GB, None)]) is None
    assert physics.decode_time_s([(1 * GB, 0)]) is None


def test_unknown_inputs_give_none() -> None:
    assert physics.ceiling_tok_s(4.9 * GB, None) is None
    assert physics.ceiling_tok_s(None, 1008) is None
    assert physics.ceiling_tok_s(0, 1008) is None
    assert physics.realistic_band(None) is None


# --------------------------------------------------------------------------- §3 KV cache


def test_llama_31_8b_kv_is_128_kib_per_token() -> None:
    # The GGUF metadata gives the hand-built layout (head_dim = 4096 / 32 = 128).
    assert kv_layout_from_metadata(LLAMA_31_8B_META) == KV_8B
    kv = KV_8B
    assert physics.kv_bytes_per_token(kv) == 131_072  # 65_536 elements × 2 B = 128 KiB
    assert physics.kv_cache_bytes(kv, 4096) == 536_870_912  # 4096 × 131_072 = 512 MiB (DOMAIN.md §3)
    assert physics.kv_cache_bytes(kv, 65536) == 8_589_934_592  # 65_536 × 131_072 = 8 GiB (DOMAIN.md §3)
    # q8_0: 34 B per 32 elements = 1.0625 B (hardware.md §5.3): 4096 × 65_536 × 1.0625 = 285_212_672.
    assert physics.kv_cache_bytes(kv, 4096, "q8_0") == 285_212_672
    assert physics.kv_cache_bytes(None, 4096) == 0
    with pytest.raises(ValueError, match="unknown KV cache type"):
        physics.kv_cache_bytes(kv, 4096, "bogus")


def test_kv_growth_slows_decode() -> None:
    model = facts(4.9 * GB, KV_8B)
    empty = physics.ceiling_at_context_tok_s(model, 0, 1008)
    deep = physics.ceiling_at_context_tok_s(model, 65536, 1008)
    assert close(empty, 205)
    # DOMAIN.md §3: (4.9e9 + 8_589_934_592 B of KV) read per token at 64k: 1008e9 / 13.49e9 = 74.72 tok/s,
    # 0.36 of the empty-context 205.7 (DOMAIN.md: "one half or one third deep into 64k").
    assert deep == pytest.approx(74.72, rel=1e-3)
    assert num(deep) < num(empty) / 2


def test_swa_layers_are_capped_at_their_window() -> None:
    kv = KvLayout(full_elems_per_token=1000, swa_elems_per_token=5000, sliding_window=512)
    assert physics.kv_cache_bytes(kv, 256) == 3_072_000  # (1000 + 5000) × 256 × 2 B
    at_window = physics.kv_cache_bytes(kv, 512)
    deep = physics.kv_cache_bytes(kv, 8192)
    # Only full layers keep growing: 1000 × (8192 − 512) × 2 B = 15_360_000.
    assert deep - at_window == 15_360_000
    assert deep == 21_504_000  # 1000 × 8192 × 2 + 5000 × 512 × 2 = 16_384_000 + 5_120_000
    no_window = dataclasses.replace(kv, sliding_window=None)
    assert physics.kv_cache_bytes(no_window, 8192) == 98_304_000  # 6000 × 8192 × 2


def test_kv_split_follows_the_gpu_fraction() -> None:
    model = facts(4.9 * GB, KV_8B)
    rate = physics.ceiling_at_context_tok_s(model, 8192, 1008, gpu_fraction=0.8, ram_bandwidth_gbps=60)
    # Bytes per token: 4.9e9 + 8192 × 131_072 (1_073_741_824) = 5_973_741_824, split 80/20:
    # 1 / (0.8 × 5.9737 / 1008 + 0.2 × 5.9737 / 60) = 1 / (0.0047411 + 0.0199125 s) = 40.562 tok/s.
    assert rate == pytest.approx(40.562, rel=1e-4)


def test_ceiling_curve_falls_with_context() -> None:
    curve = physics.ceiling_curve(facts(4.9 * GB, KV_8B), 1008, 65536, points=9)
    assert len(curve) == 9
    assert curve[0] == (0, pytest.approx(205.714, rel=1e-5))  # 1008 / 4.9
    # 32k: 1008e9 / (4.9e9 + 32768 × 131_072 = 4_294_967_296) = 1008 / 9.195 = 109.63 tok/s.
    assert curve[4] == (32768, pytest.approx(109.63, rel=1e-4))
    assert curve[-1] == (65536, pytest.approx(74.72, rel=1e-3))  # as in test_kv_growth_slows_decode
    rates = [r for _, r in curve]
    assert rates == sorted(rates, reverse=True)
    assert physics.ceiling_curve(facts(4.9 * GB, KV_8B), None, 65536) == []


# --------------------------------------------------------------------------- MoE


def test_moe_reads_active_bytes_only() -> None:
    # Mixtral 8x7B-like (DOMAIN.md §1: 46B total, ~12B active), both at Q4_K_M 4.89 bpw:
    # total 46.7e9 × 4.89 / 8 = 28_545_375_000 B; active 12.9e9 × 4.89 / 8 = 7_885_125_000 B.
    total = physics.requantize(facts(28_545_375_000), "Q4_K_M")
    assert total is not None
    moe = dataclasses.replace(total, bytes_per_token=7_885_125_000)
    dense_rate = physics.ceiling_tok_s(total.bytes_per_token, 1008)
    moe_rate = physics.ceiling_tok_s(moe.bytes_per_token, 1008)
    assert dense_rate == pytest.approx(35.31, rel=1e-3)  # 1008 / 28.545
    assert moe_rate == pytest.approx(127.84, rel=1e-3)  # 1008 / 7.885
    assert num(moe_rate) / num(dense_rate) == pytest.approx(3.620, rel=1e-3)  # 46.7 / 12.9
    # Capacity still counts every expert: 28_545_375_000 + 536_870_912 + 2 % × 28_545_375_000 (570_907_500).
    assert physics.required_bytes(moe.weights_bytes, 0) == 29_653_153_412


# --------------------------------------------------------------------------- band and capacity


def test_realistic_band() -> None:
    assert physics.REALISTIC_BAND == (0.60, 0.75)  # DOMAIN.md §1: 60–75 % of the ceiling (seed 001)
    band = physics.realistic_band(205.0)
    assert band is not None
    low, high = band
    assert low == pytest.approx(123.0)  # 0.60 × 205
    assert high == pytest.approx(153.75)  # 0.75 × 205
    # The observed 120–150 tok/s on a 4090 sits in the band.
    assert low <= 150 and high >= 120


def test_capacity_check_and_overhead() -> None:
    # The runtime overhead is a product rule (DOMAIN.md gives none; physics.py documents it as a
    # planning margin): 0.5 GiB + 2 % of the weights on the device.
    # 4.9 GB of weights: 536_870_912 + 0.02 × 4_900_000_000 (98_000_000) = 634_870_912 B.
    overhead = physics.runtime_overhead_bytes(4.9 * GB)
    assert overhead == 634_870_912
    # Weights + 512 MiB of KV (4k tokens of Llama-3.1-8B) + overhead:
    # 4_900_000_000 + 536_870_912 + 634_870_912 = 6_071_741_824 B.
    needed = physics.required_bytes(int(4.9 * GB), 512 * MIB)
    assert needed == 6_071_741_824
    assert physics.fits(needed, 8 * GIB) is True  # ≤ 8_589_934_592
    assert physics.fits(needed, int(6 * GB)) is False  # > 6_000_000_000
    assert physics.fits(needed, None) is None


def test_auto_gpu_fraction() -> None:
    weights, kv = int(40 * GB), int(1 * GB)
    capacity = 24 * GIB
    fraction = physics.auto_gpu_fraction(weights, kv, capacity)
    assert fraction is not None and 0.5 < fraction < 0.65
    # Whole layers (weights and their KV) go to the GPU until weights, KV and the overhead rule
    # (0.5 GiB + 2 % of the weights held there) fill it: f × (40e9 × 1.02 + 1e9) + 536_870_912
    # = 25_769_803_776 → f = 25_232_932_864 / 41_800_000_000 = 0.603659.
    assert fraction == pytest.approx(0.603659, rel=1e-5)
    used = fraction * 41e9 + 536_870_912 + 0.02 * fraction * 40e9
    assert used == pytest.approx(capacity, rel=1e-9)
    # 4.9 GB: 4.9e9 + 1e9 + 634_870_912 = 6_534_870_912 B ≤ 24 GiB: all of it.
    assert physics.auto_gpu_fraction(int(4.9 * GB), kv, capacity) == 1.0
    assert physics.auto_gpu_fraction(weights, kv, 100 * MIB) == 0.0
    assert physics.auto_gpu_fraction(weights, kv, None) is None


def test_max_context_that_fits() -> None:
    kv = KV_8B
    weights = int(4.9 * GB)
    capacity = 8 * GIB
    # Room for KV: 8_589_934_592 − 4_900_000_000 − overhead 634_870_912 = 3_055_063_680 B.
    # ÷ 131_072 B/token = 23_308.3 → 23_308 tokens (23_308 × 131_072 = 3_055_026_176 fits;
    # 23_309 × 131_072 = 3_055_157_248 does not).
    best = physics.max_context_that_fits(weights, kv, capacity)
    assert best is not None and 10_000 < best < 30_000
    assert best == 23_308
    # q8_0 KV nearly doubles the context that fits: 65_536 × 1.0625 = 69_632 B/token;
    # 3_055_063_680 / 69_632 = 43_874.4 → 43_874 tokens, 43_874 / 23_308 = 1.88×.
    q8 = physics.max_context_that_fits(weights, kv, capacity, "q8_0")
    assert q8 is not None and 1.8 < q8 / best < 1.9
    assert q8 == 43_874
    assert physics.max_context_that_fits(weights, kv, capacity, max_tokens=4096) == 4096
    # 40e9 + 536_870_912 + 800_000_000 > 8 GiB: not even the weights fit.
    assert physics.max_context_that_fits(int(40 * GB), kv, capacity) == 0
    assert physics.max_context_that_fits(weights, kv, None) is None


# --------------------------------------------------------------------------- requantize


def test_requantize_scales_by_effective_bpw() -> None:
    kv = KV_8B
    q4 = dataclasses.replace(facts(4.9 * GB, kv), exact=True, source="gguf")
    q8 = physics.requantize(q4, "Q8_0")
    assert q8 is not None
    # Q8_0 8.50 bpw vs Q4_K_M 4.89 bpw (hardware.md §5.1): 4.9e9 × 8.50 / 4.89 = 8_517_382_413.09.
    assert q8.weights_bytes == 8_517_382_413
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
    # Measured 4e9 × 8 / 8e9 = 4.0 bpw → 8.5 bpw: 4e9 × 8.5 / 4.0 = 8_500_000_000 B.
    assert q8.weights_bytes == 8_500_000_000
    nothing_known = ModelFacts(weights_bytes=int(4 * GB), bytes_per_token=int(4 * GB), exact=True, source="t")
    assert physics.requantize(nothing_known, "Q8_0") is None
