"""Model facts from GGUF metadata and tensor lists (trayapp.core.modelfacts)."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import FIXTURES_DIR
from trayapp.core.modelfacts import (
    MOE_EXPERT_SHARE_FALLBACK,
    TensorInfo,
    facts_from_gguf,
    facts_from_metadata_estimate,
    facts_from_params,
    kv_layout_from_metadata,
    moe_active_share,
)

F32, F16, Q8_0, Q4_K, Q6_K = 0, 1, 8, 12, 14
FIXTURES = FIXTURES_DIR


def dense_meta(**extra: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "general.architecture": "llama",
        "general.file_type": 15,
        "llama.block_count": 2,
        "llama.embedding_length": 256,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.context_length": 8192,
    }
    meta.update(extra)
    return meta


def dense_tensors(with_output: bool) -> list[TensorInfo]:
    tensors = [
        TensorInfo.of("token_embd.weight", Q8_0, (256, 1000)),
        TensorInfo.of("output_norm.weight", F32, (256,)),
    ]
    if with_output:
        tensors.append(TensorInfo.of("output.weight", Q6_K, (256, 1000)))
    for il in range(2):
        tensors += [
            TensorInfo.of(f"blk.{il}.attn_q.weight", Q4_K, (256, 256)),
            TensorInfo.of(f"blk.{il}.attn_k.weight", Q4_K, (256, 128)),
            TensorInfo.of(f"blk.{il}.attn_v.weight", Q6_K, (256, 128)),
            TensorInfo.of(f"blk.{il}.ffn_up.weight", Q4_K, (256, 1024)),
            TensorInfo.of(f"blk.{il}.ffn_down.weight", Q6_K, (1024, 256)),
            TensorInfo.of(f"blk.{il}.attn_norm.weight", F32, (256,)),
        ]
    return tensors


def test_tensor_info_bytes() -> None:
    t = TensorInfo.of("token_embd.weight", Q8_0, (256, 1000))
    assert t.n_bytes == 256 * 1000 // 32 * 34
    assert t.n_elements == 256_000


def test_dense_untied_reads_one_embedding_row() -> None:
    tensors = dense_tensors(with_output=True)
    facts = facts_from_gguf(dense_meta(), tensors)
    assert facts is not None
    embd = tensors[0].n_bytes
    total = sum(t.n_bytes for t in tensors)
    assert facts.weights_bytes == total
    assert facts.bytes_per_token == round(total - embd + embd / 1000)
    assert facts.tied_embeddings is False
    assert facts.exact is True
    assert facts.source == "gguf"
    assert facts.quantization == "Q4_K_M"
    assert facts.architecture == "llama"
    assert facts.parameter_count == sum(t.n_elements for t in tensors)
    assert facts.context_train == 8192
    assert facts.expert_count is None


def test_tied_embeddings_are_read_whole() -> None:
    tensors = dense_tensors(with_output=False)
    facts = facts_from_gguf(dense_meta(), tensors)
    assert facts is not None
    assert facts.tied_embeddings is True
    assert facts.bytes_per_token == facts.weights_bytes == sum(t.n_bytes for t in tensors)


def test_per_layer_token_embd_is_a_row_lookup() -> None:
    tensors = [
        *dense_tensors(with_output=True),
        TensorInfo.of("per_layer_token_embd.weight", Q8_0, (512, 1000)),
    ]
    facts = facts_from_gguf(dense_meta(), tensors)
    baseline = facts_from_gguf(dense_meta(), dense_tensors(with_output=True))
    assert facts is not None and baseline is not None
    assert facts.bytes_per_token - baseline.bytes_per_token == pytest.approx(
        tensors[-1].n_bytes / 1000, abs=1
    )


def moe_meta() -> dict[str, object]:
    return {
        "general.architecture": "qwen3moe",
        "general.file_type": 15,
        "qwen3moe.block_count": 1,
        "qwen3moe.embedding_length": 256,
        "qwen3moe.attention.head_count": 4,
        "qwen3moe.attention.head_count_kv": 2,
        "qwen3moe.attention.key_length": 64,
        "qwen3moe.attention.value_length": 64,
        "qwen3moe.expert_count": 8,
        "qwen3moe.expert_used_count": 2,
    }


def test_moe_scales_routed_experts_only() -> None:
    experts = [
        TensorInfo.of("blk.0.ffn_gate_exps.weight", Q4_K, (256, 512, 8)),
        TensorInfo.of("blk.0.ffn_up_exps.weight", Q4_K, (256, 512, 8)),
        TensorInfo.of("blk.0.ffn_down_exps.weight", Q6_K, (512, 256, 8)),
        TensorInfo.of("blk.0.ffn_up_chexps.weight", Q4_K, (256, 256, 8)),
    ]
    full = [
        TensorInfo.of("blk.0.ffn_gate_inp.weight", F32, (256, 8)),  # router
        TensorInfo.of("blk.0.ffn_up_shexp.weight", Q4_K, (256, 512)),  # shared expert
        TensorInfo.of("blk.0.ffn_gate_inp_shexp.weight", F32, (256,)),
        TensorInfo.of("blk.0.attn_q.weight", Q4_K, (256, 256)),
        TensorInfo.of("output.weight", Q6_K, (256, 1000)),
    ]
    embd = TensorInfo.of("token_embd.weight", Q4_K, (256, 1000))
    facts = facts_from_gguf(moe_meta(), [embd, *experts, *full])
    assert facts is not None
    expected = embd.n_bytes / 1000 + sum(t.n_bytes for t in experts) * 2 / 8 + sum(t.n_bytes for t in full)
    assert facts.bytes_per_token == round(expected)
    assert facts.weights_bytes == embd.n_bytes + sum(t.n_bytes for t in experts + full)
    assert facts.expert_count == 8 and facts.expert_used_count == 2
    expert_elems = sum(t.n_elements for t in experts)
    assert facts.parameter_count is not None and facts.active_parameter_count is not None
    assert facts.parameter_count - facts.active_parameter_count == round(expert_elems * 6 / 8)


def test_head_count_kv_array_with_recurrent_layers() -> None:
    meta = {
        "general.architecture": "lfm2",
        "lfm2.block_count": 4,
        "lfm2.embedding_length": 2048,
        "lfm2.attention.head_count": 32,
        "lfm2.attention.head_count_kv": [0, 8, 0, 8],
    }
    kv = kv_layout_from_metadata(meta)
    assert kv is not None
    # key/value length default to 2048 / 32 = 64; two attention layers × 8 heads × (64 + 64).
    assert kv.full_elems_per_token == 2 * 8 * 128
    assert kv.swa_elems_per_token == 0
    assert kv.sliding_window is None
    assert kv.n_layers == 4


def test_missing_head_count_kv_means_mha_and_truncated_arrays_fall_back() -> None:
    meta = dense_meta()
    del meta["llama.attention.head_count_kv"]
    kv = kv_layout_from_metadata(meta)
    assert kv is not None and kv.full_elems_per_token == 2 * 4 * (64 + 64)
    # Ollama prints long arrays as []: use head_count rather than failing.
    meta["llama.attention.head_count_kv"] = []
    assert kv_layout_from_metadata(meta) == kv
    assert kv_layout_from_metadata({"general.architecture": "llama"}) is None
    assert kv_layout_from_metadata({}) is None


def gemma3_meta(**extra: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.attention.sliding_window": 512,
    }
    meta.update(extra)
    return meta


def test_gemma3_default_swa_pattern_is_five_local_one_global() -> None:
    kv = kv_layout_from_metadata(gemma3_meta())
    assert kv is not None
    # Layers 5, 11, 17 are global (il % 6 == 5); the other 15 slide over 512 tokens.
    assert kv.full_elems_per_token == 3 * 512
    assert kv.swa_elems_per_token == 15 * 512
    assert kv.sliding_window == 512


def test_explicit_swa_pattern_wins() -> None:
    period = kv_layout_from_metadata(gemma3_meta(**{"gemma3.attention.sliding_window_pattern": 2}))
    assert period is not None and period.full_elems_per_token == 9 * 512
    flags = [il % 3 != 0 for il in range(18)]  # bool array, True = SWA
    by_layer = kv_layout_from_metadata(gemma3_meta(**{"gemma3.attention.sliding_window_pattern": flags}))
    assert by_layer is not None
    assert by_layer.full_elems_per_token == 6 * 512 and by_layer.swa_elems_per_token == 12 * 512


@pytest.mark.parametrize(("arch", "period"), [("gemma2", 2), ("gpt-oss", 2), ("cohere2", 4), ("gemma3n", 5)])
def test_per_arch_swa_defaults(arch: str, period: int) -> None:
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": 24,
        f"{arch}.attention.head_count": 8,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 64,
        f"{arch}.attention.value_length": 64,
        f"{arch}.attention.sliding_window": 128,
    }
    kv = kv_layout_from_metadata(meta)
    assert kv is not None
    n_full = sum(1 for il in range(24) if il % period == period - 1)
    assert kv.full_elems_per_token == n_full * 2 * 128
    assert kv.swa_elems_per_token == (24 - n_full) * 2 * 128


def test_no_window_or_unknown_arch_counts_every_layer_as_full() -> None:
    no_window = gemma3_meta()
    del no_window["gemma3.attention.sliding_window"]
    kv = kv_layout_from_metadata(no_window)
    assert kv is not None and kv.full_elems_per_token == 18 * 512 and kv.sliding_window is None
    phi3 = {
        "general.architecture": "phi3",
        "phi3.block_count": 2,
        "phi3.embedding_length": 256,
        "phi3.attention.head_count": 4,
        "phi3.attention.sliding_window": 2048,
    }
    kv = kv_layout_from_metadata(phi3)
    assert kv is not None and kv.swa_elems_per_token == 0


def test_shared_kv_layers_and_mla() -> None:
    shared = kv_layout_from_metadata(gemma3_meta(**{"gemma3.attention.shared_kv_layers": 6}))
    assert shared is not None
    assert shared.full_elems_per_token + shared.swa_elems_per_token == 12 * 512
    mla = {
        "general.architecture": "deepseek2",
        "deepseek2.block_count": 3,
        "deepseek2.attention.head_count": 128,
        "deepseek2.attention.head_count_kv": 128,
        "deepseek2.attention.kv_lora_rank": 512,
        "deepseek2.rope.dimension_count": 64,
    }
    kv = kv_layout_from_metadata(mla)
    assert kv is not None and kv.full_elems_per_token == 3 * 576


def test_gguf_facts_without_tensor_list_are_estimated() -> None:
    meta = dense_meta(**{"general.parameter_count": 8_000_000_000})
    facts = facts_from_gguf(meta, None)
    assert facts is not None
    assert facts.exact is False
    assert facts.weights_bytes == round(8e9 * 4.89 / 8)


# --------------------------------------------------------------------------- estimates


def test_estimate_dense_from_parameter_count() -> None:
    show = json.loads((FIXTURES / "ollama" / "api_show.json").read_text())
    facts = facts_from_metadata_estimate(show["model_info"], None, show["details"]["quantization_level"])
    assert facts is not None
    assert facts.exact is False
    assert facts.parameter_count == 8030261312
    assert facts.weights_bytes == pytest.approx(4.91e9, rel=0.01)  # 8.03 B × 4.89 bpw ÷ 8
    assert facts.bytes_per_token == facts.weights_bytes
    assert facts.kv is not None and facts.kv.full_elems_per_token * 2 == 128 * 1024
    assert facts.context_train == 131072


def test_estimate_moe_active_share_from_dimensions() -> None:
    show = json.loads((FIXTURES / "ollama" / "api_show_moe.json").read_text())
    facts = facts_from_metadata_estimate(show["model_info"], None, "Q4_K_M", size_bytes=18_556_701_111)
    assert facts is not None
    assert facts.weights_bytes == 18_556_701_111
    # Qwen3-30B-A3B: about 3.3 B of 30.5 B parameters are active.
    assert facts.active_parameter_count == pytest.approx(3.3e9, rel=0.05)
    assert facts.bytes_per_token == pytest.approx(18_556_701_111 * 3.35 / 30.53, rel=0.02)
    assert facts.expert_count == 128 and facts.expert_used_count == 8


def test_moe_active_share_mixtral_and_fallbacks() -> None:
    mixtral = {
        "general.architecture": "llama",
        "llama.block_count": 32,
        "llama.embedding_length": 4096,
        "llama.feed_forward_length": 14336,
        "llama.expert_count": 8,
        "llama.expert_used_count": 2,
    }
    share = moe_active_share(mixtral, 46_702_792_704)
    assert share is not None and share * 46.7e9 == pytest.approx(12.9e9, rel=0.03)
    labelled = {"general.architecture": "x", "x.expert_count": 128, "x.expert_used_count": 8}
    labelled["general.size_label"] = "30B-A3B"
    assert moe_active_share(labelled, 30_000_000_000) == pytest.approx(0.1)
    del labelled["general.size_label"]
    fallback = moe_active_share(labelled, 30_000_000_000)
    assert fallback == pytest.approx(1 - MOE_EXPERT_SHARE_FALLBACK + MOE_EXPERT_SHARE_FALLBACK * 8 / 128)
    assert moe_active_share(dense_meta(), 8_000_000_000) is None


def test_estimate_explicit_active_count_and_nothing_known() -> None:
    facts = facts_from_metadata_estimate({}, 30_000_000_000, "Q4_K_M", active_parameter_count=3_000_000_000)
    assert facts is not None
    assert facts.bytes_per_token == round(facts.weights_bytes * 0.1)
    assert facts.kv is None
    assert facts_from_metadata_estimate({}, None, "Q4_K_M") is None
    assert facts_from_metadata_estimate({}, 8_000_000_000, None) is None
    # The llama-server /v1/models "ftype" spelling works too.
    ls = facts_from_metadata_estimate({}, 268_098_176, "Q4_K - Medium", size_bytes=246_587_904)
    assert ls is not None and ls.quantization == "Q4_K_M" and ls.weights_bytes == 246_587_904


def test_facts_from_params() -> None:
    facts = facts_from_params(8, None, "Q4_K_M", None)
    assert facts.weights_bytes == round(8e9 * 4.89 / 8)
    assert facts.bytes_per_token == facts.weights_bytes
    assert facts.exact is False and facts.source == "given"
    given = facts_from_params(None, None, None, 4.9)
    assert given.weights_bytes == 4_900_000_000
    moe = facts_from_params(30, 3, "Q4_K_M", None)
    assert moe.bytes_per_token == round(moe.weights_bytes * 0.1)
    assert moe.active_parameter_count == 3_000_000_000
    with pytest.raises(ValueError, match="quantization"):
        facts_from_params(8, None, None, None)
    with pytest.raises(ValueError, match="weights size"):
        facts_from_params(None, None, None, None)
    with pytest.raises(ValueError, match="unknown quantization"):
        facts_from_params(8, None, "Q9_Z", None)
    with pytest.raises(ValueError, match="active"):
        facts_from_params(8, 9, "Q4_K_M", None)
