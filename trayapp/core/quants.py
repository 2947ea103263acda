"""Quantization tables: tensor block sizes, GGUF file types, effective bits per weight.

Pure data plus a few lookups, so the physics never needs the `gguf` package.
Sources: `gguf.constants` (GGML_QUANT_SIZES, LlamaFileType; gguf 0.19.0) and the
whole-file averages for Llama-3.1-8B from llama.cpp's `tools/quantize/README.md`
(see reference/hardware.md §5.1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, get_args

# GGML tensor type id -> (name, elements per block, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# Tensor type id -> (elements per block, bytes per block), like gguf.constants.GGML_QUANT_SIZES.
GGML_QUANT_SIZES: dict[int, tuple[int, int]] = {tid: (blk, nb) for tid, (_, blk, nb) in GGML_TYPES.items()}

# Tensor type name ("Q4_K", as Ollama's /api/show lists tensors) -> id.
GGML_TYPE_IDS: dict[str, int] = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}

# LlamaFileType (`general.file_type`) id -> canonical file-type name.
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
}
FILE_TYPE_GUESSED_FLAG = 1024  # llama.cpp ORs this into general.file_type when it guessed the type

# Whole-file bits per weight (weights bytes × 8 ÷ parameters), embedding and output included.
# Measured on Llama-3.1-8B (llama.cpp tools/quantize/README.md) unless marked otherwise.
EFFECTIVE_BPW: dict[str, float] = {
    "IQ1_S": 2.00,
    "IQ1_M": 2.15,
    "IQ2_XXS": 2.38,
    "IQ2_XS": 2.59,
    "IQ2_S": 2.74,
    "IQ2_M": 2.93,
    "Q2_K_S": 2.97,
    "Q2_K": 3.16,
    "IQ3_XXS": 3.25,
    "IQ3_XS": 3.50,
    "IQ3_S": 3.66,
    "IQ3_M": 3.76,
    "Q3_K_S": 3.64,
    # Q3_K_M is not in that table: estimated between Q3_K_S (3.64) and Q3_K_L (4.30).
    "Q3_K_M": 3.90,
    "Q3_K_L": 4.30,
    "IQ4_XS": 4.46,
    "IQ4_NL": 4.68,
    "Q4_K_S": 4.67,
    "Q4_K_M": 4.89,
    "Q5_K_S": 5.57,
    "Q5_K_M": 5.70,
    "Q6_K": 6.56,
    "Q8_0": 8.50,
    "F16": 16.00,
    "BF16": 16.00,
    "F32": 32.00,
    # Estimates (not in the table): block bits plus a little for the Q6_K output layer.
    "Q4_0": 4.60,
    "Q4_1": 5.05,
    "Q5_0": 5.55,
    "Q5_1": 6.05,
    "TQ1_0": 1.69,
    "TQ2_0": 2.06,
    "Q1_0": 1.13,
    "NVFP4": 4.50,
    # gpt-oss style: experts MXFP4 (4.25), attention/embeddings at higher precision. Estimate.
    "MXFP4_MOE": 4.60,
    # MLX affine quantization, group size 64 with fp16 scale + bias: bits + 0.5. Estimates.
    "MLX_3BIT": 3.50,
    "MLX_4BIT": 4.50,
    "MLX_6BIT": 6.50,
    "MLX_8BIT": 8.50,
}

# The KV-cache element types (llama.cpp's --cache-type-k/-v), the one list: settings, the CLI's
# --kv-type and the physics read it from here.
KvType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]
KV_TYPES: tuple[KvType, ...] = get_args(KvType)

# The types Ollama's OLLAMA_KV_CACHE_TYPE takes (its docs/faq): a fix offers no other there.
OLLAMA_KV_TYPES: tuple[KvType, ...] = ("f16", "q8_0", "q4_0")

# KV-cache bytes per element by cache type.
KV_BYTES_PER_ELEMENT: dict[KvType, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}

# The ladder a "what if" table walks, smallest first.
COMMON_QUANTS: tuple[str, ...] = ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")

# Quality notes per level (DOMAIN.md §9, from the seeds).
QUANT_NOTES: dict[str, str] = {
    "Q2_K": "heavy loss; last resort to make a model fit",
    "Q3_K_M": "clear loss; coding hallucinations rise",
    "Q4_K_M": "noticeable loss; the practical sweet spot",
    "Q5_K_M": "slight loss",
    "Q6_K": "very slight loss",
    "Q8_0": "barely visible loss",
    "F16": "no loss (reference)",
    "BF16": "no loss (reference)",
}

# llama.cpp's llama_model_ftype_name() words ("Q4_K - Medium") -> our suffixes.
_SIZE_WORDS = {"small": "_S", "medium": "_M", "large": "_L"}
_CANONICAL = {name.upper(): name for name in [*FILE_TYPES.values(), *EFFECTIVE_BPW]}


def file_type_name(file_type: int | None) -> str | None:
    """Canonical name for a `general.file_type` id (ignoring the 'guessed' flag), or None."""
    if file_type is None:
        return None
    return FILE_TYPES.get(int(file_type) & ~FILE_TYPE_GUESSED_FLAG)


def tensor_type_name(type_id: int) -> str | None:
    """Name of a GGML tensor type id ("Q4_K"), or None when unknown."""
    entry = GGML_TYPES.get(type_id)
    return entry[0] if entry else None


def tensor_n_bytes(type_id: int, shape: Sequence[int]) -> int:
    """Bytes of a tensor of `shape` (GGUF order, ne0 first) stored as `type_id`.

    Raises ValueError for an unknown type id.
    """
    if type_id not in GGML_QUANT_SIZES:
        raise ValueError(f"unknown GGML tensor type id {type_id}")
    block_elems, block_bytes = GGML_QUANT_SIZES[type_id]
    n_elements = math.prod(int(d) for d in shape)
    return n_elements // block_elems * block_bytes


def normalize_quant_name(name: str | None, bits_per_weight: float | None = None) -> str | None:
    """Map the spellings servers use to one canonical file-type name.

    Handles llama-server `/props` `model_ftype` ("Q4_K - Medium", "IQ3_S mix - 3.66 bpw",
    "MXFP4 MoE", "... (guessed)"), Ollama `quantization_level` ("Q4_K_M", "F16"), lower
    case ("q4_k_m"), bare tensor types ("Q4_K" -> "Q4_K_M", "Q5_K" -> "Q5_K_M", "Q3_K" ->
    "Q3_K_M") and LM Studio MLX names ("4bit"). With no usable name, `bits_per_weight`
    (LM Studio's nominal bits: 2..8, 16) picks the nearest common level. Unknown -> None.
    """
    if name:
        text = name.strip().replace("(guessed)", "").strip()
        low = text.lower()
        if low.startswith("all f32"):
            return "F32"
        if low.startswith("iq3_s mix"):
            return "IQ3_M"
        if low.startswith("mxfp4"):
            return "MXFP4_MOE"
        mlx = re.fullmatch(r"(?:mlx[-_ ]?)?(?:int)?([2-8])[-_ ]?bits?", low)
        if mlx:
            return _CANONICAL.get(f"MLX_{mlx.group(1)}BIT")
        base, _, rest = low.partition(" - ")
        base = base.strip().replace("-", "_").upper()
        size = _SIZE_WORDS.get(rest.strip().split(" ")[0]) if rest else None
        if size and base in ("Q3_K", "Q4_K", "Q5_K", "Q2_K"):
            # "Q2_K - Medium" is plain Q2_K (no Q2_K_M file type exists).
            candidate = base if base == "Q2_K" and size == "_M" else base + size
            if candidate in _CANONICAL:
                return _CANONICAL[candidate]
        if base in ("Q3_K", "Q4_K", "Q5_K"):
            return base + "_M"
        if base in _CANONICAL:
            return _CANONICAL[base]
        if base in ("FP16", "HALF"):
            return "F16"
        if base in ("Q8", "Q4", "Q5", "Q6", "Q3", "Q2"):
            return {"Q8": "Q8_0", "Q6": "Q6_K", "Q5": "Q5_K_M", "Q4": "Q4_K_M", "Q3": "Q3_K_M", "Q2": "Q2_K"}[
                base
            ]
    if bits_per_weight is not None and bits_per_weight > 0:
        nominal = {2: "Q2_K", 3: "Q3_K_M", 4: "Q4_K_M", 5: "Q5_K_M", 6: "Q6_K", 8: "Q8_0", 16: "F16"}
        nearest = min(nominal, key=lambda bits: abs(bits - bits_per_weight))
        return nominal[nearest]
    return None


def effective_bpw(quant: str | None) -> float | None:
    """Whole-file bits per weight for a (possibly non-canonical) quant name, or None."""
    canonical = normalize_quant_name(quant)
    return EFFECTIVE_BPW.get(canonical) if canonical else None


def kv_is_full_precision(kv_type: str) -> bool:
    """A 16- or 32-bit KV cache (f32, f16, bf16): a q8_0 cache would about halve its bytes per token."""
    key = kv_type.strip().lower()
    return key in KV_TYPES and KV_BYTES_PER_ELEMENT[key] >= 2.0


def kv_bytes_per_element(kv_type: str) -> float:
    """Bytes per KV-cache element for a llama.cpp cache type; ValueError when unknown."""
    key = kv_type.strip().lower()
    if key not in KV_TYPES:
        raise ValueError(f"unknown KV cache type {kv_type!r} (known: {', '.join(KV_TYPES)})")
    return KV_BYTES_PER_ELEMENT[key]


def quant_note(quant: str | None) -> str | None:
    """Short quality note for a quant level (DOMAIN.md §9), or None."""
    canonical = normalize_quant_name(quant)
    if canonical is None:
        return None
    if canonical in QUANT_NOTES:
        return QUANT_NOTES[canonical]
    bpw = EFFECTIVE_BPW.get(canonical)
    if bpw is None:
        return None
    if bpw < 3.5:
        return "heavy loss"
    if bpw < 4.4:
        return "clear loss; coding hallucinations rise"
    if bpw < 5.3:
        return "noticeable loss"
    if bpw < 8.0:
        return "slight loss"
    return "barely visible loss"
