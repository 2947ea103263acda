"""Build `ModelFacts` from GGUF metadata and tensor infos (exact) or from API metadata (estimated).

Bytes read per decoded token (batch 1, reference/hardware.md §5.2):

* every tensor once, except row lookups: `token_embd` (unless tied: with no
  `output.weight` the embedding doubles as the LM head and is read whole),
  `per_layer_token_embd`, `position_embd` and `token_types` read one row;
* MoE expert tensors (`*_exps*`, `*_chexps*`) count expert_used / expert_count;
  shared experts, the router, attention and dense blocks count fully.

The KV layout (§5.3) comes from `{arch}.block_count`, `attention.head_count_kv`
(scalar or per-layer, 0 = no KV in that layer), key/value lengths and the
sliding-window settings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.quants import EFFECTIVE_BPW, file_type_name, normalize_quant_name, tensor_n_bytes
from trayapp.core.units import GB

# llama.cpp's per-architecture SWA period when the GGUF has no sliding_window_pattern:
# layer il is SWA iff il % n < n - 1 (src/llama-model.cpp, set_swa_pattern).
SWA_PATTERN_DEFAULTS: dict[str, int] = {
    "gemma2": 2,
    "gpt-oss": 2,
    "cohere2": 4,
    "olmo2": 4,
    "exaone4": 4,
    "llama4": 4,
    "gemma3n": 5,
    "gemma3": 6,
    "gemma-embedding": 6,
}
# Windows llama.cpp hard-codes when the GGUF carries none (llama4's chunked attention).
SWA_WINDOW_DEFAULTS: dict[str, int] = {"llama4": 8192}
# Architectures whose sliding_window key llama.cpp ignores.
SWA_DISABLED: frozenset[str] = frozenset({"phi3"})

# Row-lookup tensors: decoding one token reads one row of these.
_LOOKUP_TENSORS = (
    "token_embd.weight",
    "per_layer_token_embd.weight",
    "position_embd.weight",
    "token_types.weight",
)
# Share of an MoE model's parameters assumed to sit in routed experts when the
# dimensions needed to compute it are missing (typical of Mixtral/Qwen3-MoE/gpt-oss).
MOE_EXPERT_SHARE_FALLBACK = 0.9


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: `shape` in GGUF order (ne0 first), `n_bytes` as stored."""

    name: str
    type_id: int
    shape: tuple[int, ...]
    n_bytes: int

    @classmethod
    def of(cls, name: str, type_id: int, shape: Sequence[int]) -> TensorInfo:
        """Build from name, GGML type id and shape, computing the stored bytes."""
        dims = tuple(int(d) for d in shape)
        return cls(name=name, type_id=type_id, shape=dims, n_bytes=tensor_n_bytes(type_id, dims))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


# --------------------------------------------------------------------------- metadata helpers


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None


def _meta_int(metadata: Mapping[str, object], key: str) -> int | None:
    return _int(metadata.get(key))


def _per_layer(value: object, n_layer: int) -> list[int] | None:
    """A scalar or per-layer array as one int per layer; None when missing or unusable."""
    if isinstance(value, (list, tuple)):
        items = [_int(v) for v in value]
        if len(items) != n_layer or any(v is None for v in items):
            return None  # e.g. Ollama's non-verbose /api/show prints long arrays as []
        return [int(v) for v in items if v is not None]
    scalar = _int(value)
    return None if scalar is None else [scalar] * n_layer


def _swa_layers(metadata: Mapping[str, object], arch: str, n_layer: int) -> list[bool]:
    """Which layers use the sliding window (all False when the model has none)."""
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)) and len(pattern) == n_layer:
        return [bool(p) for p in pattern]
    period = _int(pattern)
    if period is None:
        period = SWA_PATTERN_DEFAULTS.get(arch)
    if period is None:
        return [False] * n_layer  # unknown architecture: count every layer as full (conservative)
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]


def kv_layout_from_metadata(metadata: Mapping[str, object]) -> KvLayout | None:
    """KV-cache elements per token of context, split into full and sliding-window layers.

    None when the metadata lacks the architecture, block count or head counts.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return None
    n_layer = _meta_int(metadata, f"{arch}.block_count")
    if not n_layer or n_layer <= 0:
        return None
    heads = _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layer)
    kv_heads = _per_layer(metadata.get(f"{arch}.attention.head_count_kv"), n_layer) or heads
    if kv_heads is None:
        return None
    n_embd = _meta_int(metadata, f"{arch}.embedding_length")

    window = _meta_int(metadata, f"{arch}.attention.sliding_window") or SWA_WINDOW_DEFAULTS.get(arch)
    if arch in SWA_DISABLED or not window or window <= 0:
        window = None
    swa = _swa_layers(metadata, arch, n_layer) if window else [False] * n_layer

    key_len = _meta_int(metadata, f"{arch}.attention.key_length")
    value_len = _meta_int(metadata, f"{arch}.attention.value_length")
    key_len_swa = _meta_int(metadata, f"{arch}.attention.key_length_swa")
    value_len_swa = _meta_int(metadata, f"{arch}.attention.value_length_swa")
    mla_rank = _meta_int(metadata, f"{arch}.attention.kv_lora_rank")
    rope_dim = _meta_int(metadata, f"{arch}.rope.dimension_count") or 64
    shared_kv = _meta_int(metadata, f"{arch}.attention.shared_kv_layers") or 0

    full = swa_elems = 0
    for il in range(n_layer):
        if il >= n_layer - shared_kv or kv_heads[il] <= 0:
            continue  # no KV of its own: recurrent layer, or reuses an earlier layer's cache
        if mla_rank:
            # MLA (deepseek2): one compressed latent + the RoPE part per layer (approximate).
            elems = mla_rank + rope_dim
        else:
            default_len = None
            if n_embd and heads and heads[il] > 0:
                default_len = n_embd // heads[il]
            k_len = (key_len_swa if swa[il] and key_len_swa else key_len) or default_len
            v_len = (value_len_swa if swa[il] and value_len_swa else value_len) or default_len
            if k_len is None or v_len is None:
                return None
            elems = kv_heads[il] * (k_len + v_len)
        if swa[il]:
            swa_elems += elems
        else:
            full += elems
    return KvLayout(
        full_elems_per_token=full,
        swa_elems_per_token=swa_elems,
        sliding_window=window if swa_elems else None,
        n_layers=n_layer,
    )


def _is_expert_tensor(name: str) -> bool:
    return "_exps" in name or "_chexps" in name


# --------------------------------------------------------------------------- exact (GGUF)


def facts_from_gguf(
    metadata: Mapping[str, object],
    tensors: Sequence[TensorInfo] | None,
    source: str = "gguf",
) -> ModelFacts | None:
    """Exact facts from GGUF key/values and tensor infos.

    Without a tensor list this falls back to `facts_from_metadata_estimate` (None when
    not even that is possible).
    """
    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    quant = file_type_name(_meta_int(metadata, "general.file_type"))
    if not tensors:
        return facts_from_metadata_estimate(metadata, None, quant, source=f"{source} (no tensor list)")

    n_experts = _meta_int(metadata, f"{arch}.expert_count") if arch else None
    n_used = _meta_int(metadata, f"{arch}.expert_used_count") if arch else None
    moe = bool(n_experts and n_used and n_experts > 0)
    expert_share = (n_used or 0) / n_experts if moe and n_experts else 1.0

    names = {t.name for t in tensors}
    tied = "token_embd.weight" in names and "output.weight" not in names

    weights_bytes = 0
    read_bytes = 0.0
    params = 0
    active_params = 0.0
    for t in tensors:
        weights_bytes += t.n_bytes
        params += t.n_elements
        if t.name in _LOOKUP_TENSORS and not (tied and t.name == "token_embd.weight"):
            rows = math.prod(t.shape[1:]) or 1
            read_bytes += t.n_bytes / rows
            active_params += t.n_elements  # conventionally counted as active parameters
        elif moe and _is_expert_tensor(t.name):
            read_bytes += t.n_bytes * expert_share
            active_params += t.n_elements * expert_share
        else:
            read_bytes += t.n_bytes
            active_params += t.n_elements

    return ModelFacts(
        weights_bytes=weights_bytes,
        bytes_per_token=round(read_bytes),
        exact=True,
        source=source,
        architecture=arch,
        quantization=quant,
        parameter_count=params,
        active_parameter_count=round(active_params),
        expert_count=n_experts if moe else None,
        expert_used_count=n_used if moe else None,
        tied_embeddings=tied if "token_embd.weight" in names else None,
        context_train=_meta_int(metadata, f"{arch}.context_length") if arch else None,
        kv=kv_layout_from_metadata(metadata),
    )


# --------------------------------------------------------------------------- estimates


def _size_label_active(label: object) -> float | None:
    """Active parameters from a size label like "30B-A3B" (→ 3e9), else None."""
    if not isinstance(label, str):
        return None
    match = re.search(r"A(\d+(?:\.\d+)?)([BM])", label, re.IGNORECASE)
    if not match:
        return None
    scale = 1e9 if match.group(2).upper() == "B" else 1e6
    return float(match.group(1)) * scale


def moe_active_share(metadata: Mapping[str, object], parameter_count: int | None) -> float | None:
    """Estimated share of an MoE model's weights read per token (None for a dense model).

    Method, first that applies:
    1. Expert parameters = MoE layers × expert_count × 3 × embedding_length ×
       expert_feed_forward_length (gate, up, down per expert); the unused experts'
       share (1 − used/count) of those is not read. Qwen3-30B-A3B → 3.35B of 30.5B.
    2. The size label's active part ("30B-A3B" → 3B ÷ total).
    3. Assume 90 % of the weights are routed experts: 0.1 + 0.9 × used/count.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return None
    n_experts = _meta_int(metadata, f"{arch}.expert_count")
    n_used = _meta_int(metadata, f"{arch}.expert_used_count")
    if not n_experts or not n_used or n_experts <= 0:
        return None
    used = min(n_used / n_experts, 1.0)
    n_layer = _meta_int(metadata, f"{arch}.block_count")
    n_embd = _meta_int(metadata, f"{arch}.embedding_length")
    ff = _meta_int(metadata, f"{arch}.expert_feed_forward_length") or _meta_int(
        metadata, f"{arch}.feed_forward_length"
    )
    dense_lead = _meta_int(metadata, f"{arch}.leading_dense_block_count") or 0
    if parameter_count and n_layer and n_embd and ff:
        expert_params = (n_layer - dense_lead) * n_experts * 3 * n_embd * ff
        if 0 < expert_params < parameter_count:
            return (parameter_count - expert_params * (1 - used)) / parameter_count
    active = _size_label_active(metadata.get("general.size_label"))
    if active and parameter_count and active < parameter_count:
        return active / parameter_count
    return (1 - MOE_EXPERT_SHARE_FALLBACK) + MOE_EXPERT_SHARE_FALLBACK * used


def facts_from_metadata_estimate(
    metadata: Mapping[str, object],
    parameter_count: int | None,
    quantization: str | None,
    size_bytes: int | None = None,
    active_parameter_count: int | None = None,
    source: str = "estimate",
) -> ModelFacts | None:
    """Estimated facts when only API metadata is known (no tensor list); `exact=False`.

    Weights = `size_bytes` (the model file) when given, else parameters × effective
    bits per weight ÷ 8 (`quants.EFFECTIVE_BPW`, e.g. Q4_K_M 4.89). Bytes per token =
    weights × active share: `active_parameter_count` ÷ parameters when given, else
    `moe_active_share` for MoE, else 1 (dense; the embedding row saving is ignored, so
    the estimate errs a few percent on the slow side). None when neither a size nor
    parameters with a known quantization are available.
    """
    params = parameter_count or _meta_int(metadata, "general.parameter_count")
    quant = normalize_quant_name(quantization) or file_type_name(_meta_int(metadata, "general.file_type"))
    bpw = EFFECTIVE_BPW.get(quant) if quant else None
    if size_bytes and size_bytes > 0:
        weights = int(size_bytes)
    elif params and bpw:
        weights = round(params * bpw / 8)
    else:
        return None

    arch = metadata.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    share = None
    if active_parameter_count and params:
        share = min(active_parameter_count / params, 1.0)
    if share is None:
        share = moe_active_share(metadata, params)
    n_experts = _meta_int(metadata, f"{arch}.expert_count") if arch else None
    n_used = _meta_int(metadata, f"{arch}.expert_used_count") if arch else None
    active = active_parameter_count
    if active is None and params and share is not None:
        active = round(params * share)
    return ModelFacts(
        weights_bytes=weights,
        bytes_per_token=round(weights * (share if share is not None else 1.0)),
        exact=False,
        source=source,
        architecture=arch,
        quantization=quant,
        parameter_count=params,
        active_parameter_count=active if active is not None else params,
        expert_count=n_experts or None,
        expert_used_count=n_used or None,
        tied_embeddings=None,
        context_train=_meta_int(metadata, f"{arch}.context_length") if arch else None,
        kv=kv_layout_from_metadata(metadata),
    )


def facts_from_params(
    params_b: float | None,
    active_params_b: float | None = None,
    quant: str | None = None,
    weights_gb: float | None = None,
) -> ModelFacts:
    """Facts from command-line numbers: billions of parameters, a quant, or a weights size in GB.

    `weights_gb` wins over params × bpw. Bytes per token scale by active ÷ total params.
    Raises ValueError with a user-facing message when the numbers do not determine a size.
    """
    canonical = normalize_quant_name(quant)
    if quant and canonical is None:
        raise ValueError(f"unknown quantization {quant!r}")
    bpw = EFFECTIVE_BPW.get(canonical) if canonical else None
    params = round(params_b * 1e9) if params_b else None
    if weights_gb is not None:
        if weights_gb <= 0:
            raise ValueError("weights size must be positive")
        weights = round(weights_gb * GB)
    elif params and bpw:
        weights = round(params * bpw / 8)
    elif params:
        raise ValueError(
            "give a quantization (e.g. Q4_K_M) or the weights size in GB with the parameter count"
        )
    else:
        raise ValueError("give the weights size in GB, or the parameter count with a quantization")
    active = round(active_params_b * 1e9) if active_params_b else None
    share = 1.0
    if active and params:
        if active > params:
            raise ValueError("active parameters cannot exceed total parameters")
        share = active / params
    return ModelFacts(
        weights_bytes=weights,
        bytes_per_token=round(weights * share),
        exact=False,
        source="given",
        quantization=canonical,
        parameter_count=params,
        active_parameter_count=active if active is not None else params,
    )
