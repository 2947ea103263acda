"""Quantization tables and name normalisation (trayapp.core.quants)."""

from __future__ import annotations

import gguf
import pytest

from trayapp.core import quants


def test_block_table_matches_gguf_package() -> None:
    expected = {int(t): sizes for t, sizes in gguf.constants.GGML_QUANT_SIZES.items()}
    assert expected == quants.GGML_QUANT_SIZES


def test_tensor_type_names_match_gguf_package() -> None:
    for t in gguf.constants.GGMLQuantizationType:
        if int(t) in quants.GGML_TYPES:
            assert quants.tensor_type_name(int(t)) == t.name
            assert quants.GGML_TYPE_IDS[t.name] == int(t)


def test_file_types_match_llama_file_type() -> None:
    for ft in gguf.constants.LlamaFileType:
        if ft.name == "GUESSED":
            continue
        name = ft.name.removeprefix("MOSTLY_").removeprefix("ALL_")
        assert quants.file_type_name(int(ft)) == name
    assert quants.file_type_name(15) == "Q4_K_M"
    assert quants.file_type_name(17) == "Q5_K_M"
    assert quants.file_type_name(18) == "Q6_K"
    assert quants.file_type_name(7) == "Q8_0"
    assert quants.file_type_name(1) == "F16"
    assert quants.file_type_name(32) == "BF16"
    assert quants.file_type_name(15 | 1024) == "Q4_K_M"  # "guessed" flag ignored
    assert quants.file_type_name(999) is None
    assert quants.file_type_name(None) is None


def test_tensor_n_bytes() -> None:
    assert quants.tensor_n_bytes(8, (640, 262144)) == 640 * 262144 // 32 * 34  # Q8_0
    assert quants.tensor_n_bytes(12, (4096, 4096)) == 4096 * 4096 // 256 * 144  # Q4_K
    assert quants.tensor_n_bytes(0, (640,)) == 2560  # F32
    with pytest.raises(ValueError, match="unknown GGML tensor type"):
        quants.tensor_n_bytes(31, (32,))


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Q4_K - Medium", "Q4_K_M"),  # llama-server /props model_ftype
        ("Q4_K - Small", "Q4_K_S"),
        ("Q3_K - Large", "Q3_K_L"),
        ("Q5_K - Medium", "Q5_K_M"),
        ("Q2_K - Medium", "Q2_K"),
        ("Q2_K - Small", "Q2_K_S"),
        ("Q6_K", "Q6_K"),
        ("Q8_0", "Q8_0"),
        ("IQ2_XXS - 2.0625 bpw", "IQ2_XXS"),
        ("IQ3_S mix - 3.66 bpw", "IQ3_M"),
        ("MXFP4 MoE", "MXFP4_MOE"),
        ("all F32", "F32"),
        ("Q4_K - Medium (guessed)", "Q4_K_M"),
        ("q4_K_M", "Q4_K_M"),  # Ollama tags
        ("q4_k_m", "Q4_K_M"),
        ("Q4_K_M", "Q4_K_M"),  # Ollama quantization_level / LM Studio
        ("F16", "F16"),
        ("bf16", "BF16"),
        ("Q4_K", "Q4_K_M"),
        ("4bit", "MLX_4BIT"),  # LM Studio MLX
        ("8bit", "MLX_8BIT"),
    ],
)
def test_normalize_quant_name(raw: str, canonical: str) -> None:
    assert quants.normalize_quant_name(raw) == canonical


def test_normalize_quant_name_from_bits_and_unknowns() -> None:
    assert quants.normalize_quant_name(None, bits_per_weight=4) == "Q4_K_M"
    assert quants.normalize_quant_name("", bits_per_weight=8) == "Q8_0"
    assert quants.normalize_quant_name("weird-format", bits_per_weight=16) == "F16"
    assert quants.normalize_quant_name("weird-format") is None
    assert quants.normalize_quant_name(None) is None


def test_effective_bpw_uses_whole_file_averages() -> None:
    assert quants.effective_bpw("Q4_K_M") == pytest.approx(4.89)  # not the 4.5 of a Q4_K block
    assert quants.effective_bpw("Q4_K - Medium") == pytest.approx(4.89)
    assert quants.effective_bpw("Q8_0") == pytest.approx(8.5)
    assert quants.effective_bpw("F16") == pytest.approx(16.0)
    assert 3.64 < quants.EFFECTIVE_BPW["Q3_K_M"] < 4.30  # estimated between Q3_K_S and Q3_K_L
    assert quants.effective_bpw("nonsense") is None
    # Every common level has a bpw, and the ladder is ordered by size.
    assert all(quants.effective_bpw(q) is not None for q in quants.COMMON_QUANTS)
    bpws = [quants.EFFECTIVE_BPW[q] for q in quants.COMMON_QUANTS]
    assert bpws == sorted(bpws)


def test_kv_bytes_per_element() -> None:
    assert quants.kv_bytes_per_element("f16") == 2
    assert quants.kv_bytes_per_element("F32") == 4
    assert quants.kv_bytes_per_element("q8_0") == pytest.approx(34 / 32)
    assert quants.kv_bytes_per_element("q4_0") == pytest.approx(18 / 32)
    with pytest.raises(ValueError, match="unknown KV cache type"):
        quants.kv_bytes_per_element("q3_k")


def test_quality_notes() -> None:
    assert "coding" in (quants.quant_note("Q3_K_M") or "")
    assert "sweet spot" in (quants.quant_note("q4_k_m") or "")
    assert quants.quant_note("IQ3_XXS") == "heavy loss"
    assert quants.quant_note("unknown") is None
    for q in quants.COMMON_QUANTS:
        assert quants.quant_note(q)
