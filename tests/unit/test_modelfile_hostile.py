"""A crafted GGUF is refused quickly (#25): parsing is linear in the file's size and bounded.

Deeply nested metadata arrays were a `RecursionError` (not a `ModelFileError`), and sizing tensors of
a type the table does not know was quadratic (a 1.1 MB file took 14 s of CPU). Each test builds the
file byte by byte and measures the parse."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from trayapp.sources.modelfile import ModelFileError, read_gguf_header

_U32, _U64, _ARRAY, _STRING = "<I", "<Q", 9, 8


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(_U64, len(raw)) + raw


def _gguf(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors


def _nested_arrays(depth: int) -> bytes:
    """One key whose value is an array holding an array holding … `depth` levels down."""
    head = struct.pack(_U32, _ARRAY) + struct.pack(_U32, _ARRAY) + struct.pack(_U64, 1)
    inner = struct.pack(_U32, _ARRAY) + struct.pack(_U64, 1)  # element type, count
    last = struct.pack(_U32, 4) + struct.pack(_U64, 0)  # an empty u32 array
    return _string("evil.nest") + head + inner * (depth - 2) + last


def test_deeply_nested_arrays_are_a_model_file_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "nest.gguf"
    path.write_bytes(_gguf(_nested_arrays(100_000), 1))
    started = time.perf_counter()
    with pytest.raises(ModelFileError, match="nested"):
        read_gguf_header(path)
    assert time.perf_counter() - started < 1.0


def test_shallow_nested_arrays_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    path.write_bytes(
        _gguf(
            _nested_arrays(3)
            + _string("general.architecture")
            + struct.pack(_U32, _STRING)
            + _string("llama"),
            2,
        )
    )
    header = read_gguf_header(path)
    assert header.metadata["general.architecture"] == "llama"


def test_many_nested_empty_arrays_are_bounded(tmp_path: Path) -> None:
    """An array of 300k empty arrays (3.6 MB): refused or skipped in time linear in the file, never held."""
    count = 300_000
    value = struct.pack(_U32, _ARRAY) + struct.pack(_U32, _ARRAY) + struct.pack(_U64, count)
    value += (struct.pack(_U32, 4) + struct.pack(_U64, 0)) * count
    path = tmp_path / "wide.gguf"
    path.write_bytes(_gguf(_string("evil.wide") + value, 1))
    started = time.perf_counter()
    try:
        header = read_gguf_header(path)
    except ModelFileError:
        pass
    else:
        assert "evil.wide" not in header.metadata  # nested arrays are skipped, not kept
    assert time.perf_counter() - started < 3.0


def test_tensor_sizing_is_linear(tmp_path: Path) -> None:
    """40k tensors of a type the table does not know (~1.1 MB): sized from the gaps between offsets
    in well under a second (it was quadratic: 14 s)."""
    n = 40_000
    tensors = b"".join(
        _string(f"t{i}")
        + struct.pack(_U32, 1)
        + struct.pack(_U64, 4)
        + struct.pack(_U32, 200)
        + struct.pack(_U64, 32 * i)
        for i in range(n)
    )
    path = tmp_path / "tensors.gguf"
    path.write_bytes(_gguf(b"", 0, tensors, n))
    assert path.stat().st_size > 1_000_000
    started = time.perf_counter()
    header = read_gguf_header(path)
    elapsed = time.perf_counter() - started
    assert len(header.tensors) == n
    assert [t.n_bytes for t in header.tensors[:3]] == [32, 32, 32]
    assert elapsed < 1.5, f"{elapsed:.2f} s for {n} tensors"


def test_a_huge_tensor_count_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "count.gguf"
    path.write_bytes(_gguf(b"", 0, b"", 1 << 40))
    started = time.perf_counter()
    with pytest.raises(ModelFileError):
        read_gguf_header(path)
    assert time.perf_counter() - started < 0.5


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_or_a_folder_named_like_a_model_is_refused_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match="not a regular file"):
        read_gguf_header(fifo)
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    with pytest.raises(ModelFileError):
        read_gguf_header(folder)
