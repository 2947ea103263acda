"""Read a GGUF file's header fast and turn it into `ModelFacts`.

`gguf.GGUFReader` decodes every metadata array, including a 262k-entry
vocabulary, and takes seconds. This module reads only what the physics needs:
the typed key/values (long arrays are skipped by seeking) and the tensor infos
(name, shape, type), from a memory map. Results are cached in memory and on
disk, keyed by (path, size, mtime).

GGUF layout (v1–v3; little-endian, or big-endian files detected by the version):
magic "GGUF", u32 version, tensor count, kv count, then kv pairs
(string key, u32 value type, value), then tensor infos (string name, u32 n_dims,
dims, u32 ggml type, u64 offset). Counts, string lengths and dims are u64 (u32 in v1).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import mmap
import os
import re
import stat
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trayapp.config.files import atomic_write_text
from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.modelfacts import TensorInfo, facts_from_gguf
from trayapp.core.quants import GGML_QUANT_SIZES, tensor_n_bytes

GGUF_MAGIC = b"GGUF"
CACHE_SCHEMA = 1  # bump when the facts computation changes, to invalidate disk caches
KEEP_ARRAY_MAX = 4096  # numeric arrays up to this length are kept (per-layer values); longer are skipped
KEEP_STRING_ARRAY_MAX = 64  # string arrays up to this length are kept (tags, languages)
_MAX_COUNT = 1 << 24  # sanity limit for tensor and kv counts
_MAX_DIMS = 8
MAX_ARRAY_NESTING = 8  # arrays of arrays deeper than this are a corrupt (or crafted) file
_DEFAULT_ALIGNMENT = 32

# GGUF value type -> struct format of one scalar.
_SCALAR_FORMATS: dict[int, str] = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING = 8
_ARRAY = 9
_SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class ModelFileError(Exception):
    """The file is not a readable GGUF model (missing, not GGUF, truncated, corrupt)."""


@dataclass(frozen=True)
class GgufHeader:
    """What the fast reader extracts from one GGUF file."""

    version: int
    metadata: Mapping[str, object]
    tensors: tuple[TensorInfo, ...]
    array_lengths: Mapping[str, int] = field(default_factory=dict)  # every array's length, kept or not
    alignment: int = _DEFAULT_ALIGNMENT
    data_offset: int = 0


class _Cursor:
    """Sequential reads from a buffer with bounds checks that raise ModelFileError."""

    def __init__(self, buf: mmap.mmap | bytes, endian: str, long_fmt: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.endian = endian
        self.long = struct.Struct(endian + long_fmt)  # counts and string lengths
        self.u32 = struct.Struct(endian + "I")

    def unpack(self, st: struct.Struct) -> int:
        """An integer field (a count, a length, a type id)."""
        return int(self.scalar(st))

    def scalar(self, st: struct.Struct) -> int | float | bool:
        """One scalar of the format `st` (an integer, a float or a bool)."""
        if self.pos + st.size > self.size:
            raise ModelFileError(f"truncated GGUF header at byte {self.pos}")
        value: int | float | bool = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return value

    def count(self) -> int:
        return self.unpack(self.long)

    def string(self) -> str:
        length = self.count()
        end = self.pos + length
        if end > self.size:
            raise ModelFileError(f"truncated GGUF string at byte {self.pos}")
        text = bytes(self.buf[self.pos : end]).decode("utf-8", errors="replace")
        self.pos = end
        return text

    def skip(self, n_bytes: int) -> None:
        if self.pos + n_bytes > self.size:
            raise ModelFileError(f"truncated GGUF header at byte {self.pos}")
        self.pos += n_bytes

    def skip_strings(self, count: int) -> None:
        length_st, buf, pos, size = self.long, self.buf, self.pos, self.size
        step = length_st.size
        unpack = length_st.unpack_from
        for _ in range(count):
            if pos + step > size:
                raise ModelFileError("truncated GGUF string array")
            pos += step + unpack(buf, pos)[0]
        if pos > size:
            raise ModelFileError("truncated GGUF string array")
        self.pos = pos


def _read_value(cur: _Cursor, vtype: int, key: str, lengths: dict[str, int]) -> object:
    """Read one typed value; long arrays are skipped and returned as None."""
    if vtype in _SCALAR_FORMATS:
        return cur.scalar(struct.Struct(cur.endian + _SCALAR_FORMATS[vtype]))
    if vtype == _STRING:
        return cur.string()
    if vtype != _ARRAY:
        raise ModelFileError(f"unknown GGUF value type {vtype} for key {key!r}")
    elem_type = cur.unpack(cur.u32)
    count = cur.count()
    lengths[key] = count
    if elem_type in _SCALAR_FORMATS:
        fmt = struct.Struct(f"{cur.endian}{_SCALAR_FORMATS[elem_type]}")
        if count > KEEP_ARRAY_MAX:
            cur.skip(count * fmt.size)
            return None
        n_bytes = count * fmt.size
        if cur.pos + n_bytes > cur.size:
            raise ModelFileError(f"truncated GGUF array {key!r}")
        values = list(
            struct.unpack_from(f"{cur.endian}{count}{_SCALAR_FORMATS[elem_type]}", cur.buf, cur.pos)
        )
        cur.pos += n_bytes
        return values
    if elem_type == _STRING:
        if count > KEEP_STRING_ARRAY_MAX:
            cur.skip_strings(count)
            return None
        return [cur.string() for _ in range(count)]
    if elem_type == _ARRAY:
        _skip_nested(cur, count, key)
        return None  # no fact the physics reads is an array of arrays: skipped, never held
    raise ModelFileError(f"unknown GGUF array element type {elem_type} for key {key!r}")


def _skip_nested(cur: _Cursor, count: int, key: str) -> None:
    """Skip `count` arrays (the elements of an array of arrays), without recursion.

    Every element read moves the cursor by at least 12 bytes (its type and count), so the walk is
    linear in the file's size; nesting deeper than MAX_ARRAY_NESTING is refused."""
    pending = [count]  # per open level: how many arrays are left to read at that level
    while pending:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        elem_type = cur.unpack(cur.u32)
        n = cur.count()
        if elem_type in _SCALAR_FORMATS:
            cur.skip(n * struct.calcsize(_SCALAR_FORMATS[elem_type]))
        elif elem_type == _STRING:
            cur.skip_strings(n)
        elif elem_type == _ARRAY:
            if len(pending) >= MAX_ARRAY_NESTING:
                raise ModelFileError(f"GGUF arrays nested more than {MAX_ARRAY_NESTING} deep in {key!r}")
            pending.append(n)
        else:
            raise ModelFileError(f"unknown GGUF array element type {elem_type} in {key!r}")


def _parse(buf: mmap.mmap | bytes, name: str) -> GgufHeader:
    if len(buf) < 24:
        raise ModelFileError(f"{name}: too short to be a GGUF file ({len(buf)} bytes)")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ModelFileError(f"{name}: not a GGUF file (magic {bytes(buf[:4])!r})")
    version = struct.unpack_from("<I", buf, 4)[0]
    endian = "<"
    if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian number
        endian = ">"
        version = struct.unpack_from(">I", buf, 4)[0]
    if version not in (1, 2, 3):
        raise ModelFileError(f"{name}: unsupported GGUF version {version}")
    cur = _Cursor(buf, endian, "I" if version == 1 else "Q")
    cur.pos = 8
    n_tensors = cur.count()
    n_kv = cur.count()
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise ModelFileError(f"{name}: implausible GGUF counts ({n_tensors} tensors, {n_kv} keys)")

    metadata: dict[str, object] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack(cur.u32)
        value = _read_value(cur, vtype, key, lengths)
        if value is not None:
            metadata[key] = value

    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        tname = cur.string()
        n_dims = cur.unpack(cur.u32)
        if n_dims > _MAX_DIMS:
            raise ModelFileError(f"{name}: tensor {tname!r} has {n_dims} dimensions")
        dims = tuple(cur.count() for _ in range(n_dims))
        type_id = cur.unpack(cur.u32)
        offset = cur.unpack(struct.Struct(endian + "Q"))
        raw.append((tname, dims, type_id, offset))

    alignment = metadata.get("general.alignment")
    align = alignment if isinstance(alignment, int) and alignment > 0 else _DEFAULT_ALIGNMENT
    data_offset = -(-cur.pos // align) * align
    tensors = _tensor_infos(raw, data_offset, len(buf))
    return GgufHeader(
        version=version,
        metadata=metadata,
        tensors=tensors,
        array_lengths=lengths,
        alignment=align,
        data_offset=data_offset,
    )


def _tensor_infos(
    raw: list[tuple[str, tuple[int, ...], int, int]], data_offset: int, file_size: int
) -> tuple[TensorInfo, ...]:
    """Tensor infos with byte sizes from the type table (or, for a type unknown to the
    table, from the gap to the next tensor's offset)."""
    ends = sorted({offset for _, _, _, offset in raw})  # one sort, one binary search per tensor
    infos = []
    for tname, dims, type_id, offset in raw:
        if type_id in GGML_QUANT_SIZES:
            n_bytes = tensor_n_bytes(type_id, dims)
        else:
            index = bisect.bisect_right(ends, offset)
            end = data_offset + ends[index] if index < len(ends) else file_size
            n_bytes = max(end - (data_offset + offset), 0)
        infos.append(TensorInfo(name=tname, type_id=type_id, shape=dims, n_bytes=n_bytes))
    return tuple(infos)


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """Parse the header of one GGUF file (one part, for split models). Raises ModelFileError."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as fh:  # non-blocking open: a FIFO there never hangs the reader
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ModelFileError(f"{p}: not a regular file")
            size = st.st_size
            if size < 24:
                raise ModelFileError(f"{p}: too short to be a GGUF file ({size} bytes)")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, str(p))
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot read ({exc.strerror or exc})") from exc


def _split_parts(path: Path, metadata: Mapping[str, object]) -> list[Path]:
    """The other files of a split model (`-00001-of-00003.gguf`), in order; [] when not split."""
    count = metadata.get("split.count")
    if not isinstance(count, int) or count <= 1:
        return []
    match = _SPLIT_NAME.search(path.name)
    if not match:
        raise ModelFileError(f"{path}: split GGUF ({count} parts) with an unrecognised file name")
    stem = path.name[: match.start()]
    parts = [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise ModelFileError(f"{path}: split GGUF part(s) missing: {', '.join(missing)}")
    return [p for p in parts if p.resolve() != path.resolve()]


def _facts_from_file(path: Path) -> ModelFacts:
    header = read_gguf_header(path)
    tensors = list(header.tensors)
    for part in _split_parts(path, header.metadata):
        tensors.extend(read_gguf_header(part).tensors)
    if not tensors:
        raise ModelFileError(f"{path}: GGUF file has no tensors (vocabulary-only?)")
    facts = facts_from_gguf(header.metadata, tensors)
    if facts is None:  # not reachable with tensors, but keep the contract explicit
        raise ModelFileError(f"{path}: cannot compute model facts")
    return facts


# --------------------------------------------------------------------------- caching

_memory_cache: dict[tuple[str, int, int], ModelFacts] = {}
_memory_lock = threading.Lock()


def clear_memory_cache() -> None:
    """Forget facts cached in this process (the disk cache stays)."""
    with _memory_lock:
        _memory_cache.clear()


def facts_to_json(facts: ModelFacts) -> dict[str, object]:
    """A JSON-ready dict of `facts` (KvLayout nested)."""
    return dataclasses.asdict(facts)


def facts_from_json(data: Mapping[str, object]) -> ModelFacts:
    """Inverse of `facts_to_json`; raises (TypeError/ValueError) on a malformed dict."""
    values = dict(data)
    kv = values.get("kv")
    values["kv"] = KvLayout(**kv) if isinstance(kv, dict) else None
    return ModelFacts(**values)  # type: ignore[arg-type]


def _disk_cache_file(cache_dir: Path, key_path: str) -> Path:
    digest = hashlib.sha1(key_path.encode("utf-8")).hexdigest()[:20]
    return cache_dir / "modelfacts" / f"{digest}.json"


def _load_disk(cache_file: Path, key: tuple[str, int, int]) -> ModelFacts | None:
    try:
        data = json.loads(cache_file.read_text(encoding="utf-8"))
        if (
            data.get("schema") != CACHE_SCHEMA
            or data.get("path") != key[0]
            or data.get("size") != key[1]
            or data.get("mtime_ns") != key[2]
        ):
            return None
        return facts_from_json(data["facts"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # missing or unreadable cache: read the model again


def _save_disk(cache_file: Path, key: tuple[str, int, int], facts: ModelFacts) -> None:
    payload = {"schema": CACHE_SCHEMA, "path": key[0], "size": key[1], "mtime_ns": key[2]}
    payload["facts"] = facts_to_json(facts)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_file, json.dumps(payload), fsync=False)  # a lost write costs a re-read
    except OSError:
        pass  # a cache that cannot be written only costs a re-read later


def read_model_facts(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    use_disk_cache: bool = True,
) -> ModelFacts:
    """Exact `ModelFacts` of a GGUF model file (first part of a split model), cached.

    `cache_dir` defaults to `trayapp.config.paths.cache_dir()`. Raises ModelFileError for a
    missing, non-GGUF, truncated or corrupt file.
    """
    p = Path(path).expanduser()
    try:
        resolved = p.resolve()
        st = resolved.stat()
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    key = (str(resolved), st.st_size, st.st_mtime_ns)
    with _memory_lock:
        cached = _memory_cache.get(key)
    if cached is not None:
        return cached

    cache_file: Path | None = None
    if use_disk_cache:
        if cache_dir is None:
            from trayapp.config import paths

            cache_dir = paths.cache_dir()
        cache_file = _disk_cache_file(Path(cache_dir), key[0])
        facts = _load_disk(cache_file, key)
        if facts is not None:
            with _memory_lock:
                _memory_cache[key] = facts
            return facts

    facts = _facts_from_file(resolved)
    with _memory_lock:
        _memory_cache[key] = facts
    if cache_file is not None:
        _save_disk(cache_file, key, facts)
    return facts
