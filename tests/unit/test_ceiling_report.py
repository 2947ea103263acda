"""The `ceiling` report (trayapp.cli.ceiling)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trayapp.cli.ceiling import build_ceiling_report, format_ceiling_report
from trayapp.core.machine import Machine
from trayapp.core.model import ModelFacts
from trayapp.core.modelfacts import facts_from_params, kv_layout_from_metadata
from trayapp.core.quants import COMMON_QUANTS

GB = 1e9
GIB = 1024**3

RTX_4090 = Machine(
    label="NVIDIA GeForce RTX 4090",
    fast_bandwidth_gbps=1008,
    fast_capacity_bytes=24 * GIB,
    ram_bandwidth_gbps=60,
    has_gpu=True,
    gpu_bandwidths_gbps=(1008,),
    sources={"bandwidth": "nvml", "capacity": "nvml", "ram_bandwidth": "measured"},
)
M5_MAX = Machine(
    label="Apple M5 Max",
    fast_bandwidth_gbps=614,
    fast_capacity_bytes=128 * GIB,
    ram_bandwidth_gbps=614,
    has_gpu=True,
    unified_memory=True,
    sources={"bandwidth": "table", "capacity": "given"},
)
LLAMA_KV = kv_layout_from_metadata(
    {
        "general.architecture": "llama",
        "llama.block_count": 32,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.embedding_length": 4096,
    }
)


def llama_8b() -> ModelFacts:
    return ModelFacts(
        weights_bytes=int(4.9 * GB),
        bytes_per_token=int(4.9 * GB),
        exact=True,
        source="gguf",
        architecture="llama",
        quantization="Q4_K_M",
        parameter_count=8_030_261_312,
        context_train=131072,
        kv=LLAMA_KV,
    )


def test_8b_on_4090_fits_and_matches_the_worked_example() -> None:
    report = build_ceiling_report(llama_8b(), RTX_4090, context_tokens=0)
    assert report["ceiling_tok_s"] == pytest.approx(1008 / 4.9, rel=1e-6)  # ~205 tok/s
    assert report["fits"] is True
    assert report["split_ceiling_tok_s"] is None
    low, high = report["expected_tok_s"]
    assert low == pytest.approx(0.60 * 1008 / 4.9) and high == pytest.approx(0.75 * 1008 / 4.9)
    assert report["bytes_per_token"] == int(4.9 * GB)
    assert report["bandwidth_gbps"] == 1008
    assert report["exact"] is True
    assert report["machine"] == "NVIDIA GeForce RTX 4090"
    assert report["sources"] == {"bandwidth": "nvml", "capacity": "nvml", "ram_bandwidth": "measured"}
    assert report["available_bytes"] == 24 * GIB
    json.dumps(report)  # JSON-ready for --json


def test_context_adds_kv_reads_and_capacity() -> None:
    report = build_ceiling_report(llama_8b(), RTX_4090, context_tokens=4096)
    assert report["kv_bytes"] == 512 * 1024**2
    assert report["context"] == 4096
    assert report["ceiling_tok_s"] == pytest.approx(1008 * GB / (4.9 * GB + 512 * 1024**2))
    assert report["ceiling_empty_context_tok_s"] == pytest.approx(1008 / 4.9)
    assert report["required_bytes"] > report["weights_bytes"] + report["kv_bytes"]
    assert report["max_context_fits"] == 131072  # capped at the trained context
    q8 = build_ceiling_report(llama_8b(), replace(RTX_4090, kv_type="q8_0"), context_tokens=4096)
    assert q8["kv_bytes"] == pytest.approx(512 * 1024**2 * 34 / 64, abs=1)
    assert q8["kv_type"] == "q8_0"


def test_70b_q4_on_a_4090_does_not_fit_and_offloads() -> None:
    facts = facts_from_params(70, None, "Q4_K_M", 40)
    report = build_ceiling_report(facts, RTX_4090)
    assert report["fits"] is False
    fraction = report["auto_gpu_fraction"]
    assert 0.5 < fraction < 0.65
    split = report["split_ceiling_tok_s"]
    expected_split = 1 / (fraction * 40 / 1008 + (1 - fraction) * 40 / 60)
    assert split == pytest.approx(expected_split, rel=1e-6)
    assert split < 10  # the "3–10 tok/s on GPU-class hardware" tell-tale
    assert report["expected_tok_s"] == [pytest.approx(0.6 * split), pytest.approx(0.75 * split)]
    assert report["exact"] is False
    fitting = [row["quant"] for row in report["quants"] if row["fits"]]
    assert fitting == []  # 70B does not fit 24 GB at any level of the ladder
    assert any("does not fit" in note for note in report["notes"])


def test_given_gpu_fraction_is_used_directly() -> None:
    report = build_ceiling_report(llama_8b(), RTX_4090, context_tokens=0, gpu_fraction=0.8)
    assert report["ceiling_tok_s"] == pytest.approx(1 / (0.8 * 4.9 / 1008 + 0.2 * 4.9 / 60))  # ~50 tok/s
    assert report["gpu_fraction"] == 0.8
    assert report["split_ceiling_tok_s"] is None


def test_unified_memory_machine_has_no_split() -> None:
    big = facts_from_params(405, None, "Q4_K_M", None)
    report = build_ceiling_report(big, M5_MAX)
    assert report["fits"] is False
    assert report["split_ceiling_tok_s"] is None
    assert report["expected_tok_s"] is None
    seventy = build_ceiling_report(facts_from_params(70, None, None, 40), M5_MAX, context_tokens=0)
    assert seventy["ceiling_tok_s"] == pytest.approx(15.35, rel=0.01)  # M5 Max 70B Q4 ≈ 15 tok/s
    assert seventy["fits"] is True


def test_a_gpu_share_does_not_apply_to_unified_memory() -> None:
    # --gpu-fraction 0.5 on an M5 Max: one memory at 614 GB/s, so 614 ÷ 4.9 GB, never a split with
    # a (here deliberately slower) RAM bandwidth: 1 / (0.5 × 4.9 / 614 + 0.5 × 4.9 / 100) ≈ 35 tok/s
    unified = replace(M5_MAX, ram_bandwidth_gbps=100.0)
    report = build_ceiling_report(llama_8b(), unified, context_tokens=0, gpu_fraction=0.5)
    assert report["ceiling_tok_s"] == pytest.approx(614 / 4.9)
    assert report["gpu_fraction"] == 1.0
    assert any("does not apply" in note for note in report["notes"])


def test_quant_ladder() -> None:
    report = build_ceiling_report(llama_8b(), RTX_4090, context_tokens=0)
    rows = {row["quant"]: row for row in report["quants"]}
    assert list(rows) == list(COMMON_QUANTS)
    assert rows["Q4_K_M"]["current"] is True
    assert rows["Q4_K_M"]["ceiling_tok_s"] == pytest.approx(1008 / 4.9)
    assert rows["F16"]["weights_bytes"] == pytest.approx(4.9 * GB * 16 / 4.89, rel=1e-6)
    assert rows["Q4_K_M"]["ceiling_tok_s"] / rows["F16"]["ceiling_tok_s"] == pytest.approx(16 / 4.89)
    rates = [row["ceiling_tok_s"] for row in report["quants"]]
    assert rates == sorted(rates, reverse=True)
    assert "coding" in rows["Q3_K_M"]["note"]
    assert rows["F16"]["fits"] is True  # 16 GB + overhead < 24 GiB


def test_unknowns_give_none_and_notes() -> None:
    machine = Machine(
        label="unknown GPU",
        fast_bandwidth_gbps=None,
        fast_capacity_bytes=None,
        ram_bandwidth_gbps=None,
        has_gpu=True,
    )
    facts = ModelFacts(weights_bytes=int(4 * GB), bytes_per_token=int(4 * GB), exact=False, source="x")
    report = build_ceiling_report(facts, machine)
    assert report["ceiling_tok_s"] is None
    assert report["expected_tok_s"] is None
    assert report["fits"] is None
    assert report["kv_bytes"] is None
    assert report["quants"] == []
    assert len(report["notes"]) >= 3
    text = format_ceiling_report(report)
    assert "—" in text and "unknown" in text


def test_format_is_readable() -> None:
    text = format_ceiling_report(build_ceiling_report(llama_8b(), RTX_4090, context_tokens=4096))
    assert "NVIDIA GeForce RTX 4090: 1,008 GB/s (nvml)" in text
    assert "4.9 GB weights" in text
    assert "536.9 MB KV" in text
    assert "185 tok/s" in text  # 1008 GB/s ÷ (4.9 GB + 0.54 GB)
    assert "206 tok/s at empty context" in text
    assert "fits" in text
    for quant in COMMON_QUANTS:
        assert quant in text
    offloaded = format_ceiling_report(build_ceiling_report(facts_from_params(70, None, None, 40), RTX_4090))
    assert "does NOT fit" in offloaded
    assert "Offloaded" in offloaded and "on the GPU" in offloaded
