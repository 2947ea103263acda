"""Small reads of Linux /proc and /sys files at the lowest cost: a tick reads several, and Python's
buffered `open()` costs about twice the system calls' own time (issue #26)."""

from __future__ import annotations

import os

CHUNK_BYTES = 65536


def read_bytes(path: str | os.PathLike[str], max_bytes: int = 4 * CHUNK_BYTES) -> bytes:
    """The file's bytes (at most `max_bytes`) through os.open/os.read; OSError as open() raises it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < max_bytes:
            chunk = os.read(fd, min(CHUNK_BYTES, max_bytes - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)
