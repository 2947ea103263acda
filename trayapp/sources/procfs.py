"""Small reads of Linux /proc and /sys files at the lowest cost: a tick reads several, and Python's
buffered `open()` costs about twice the system calls' own time (issue #26)."""

from __future__ import annotations

import os

from trayapp.config.files import read_at_most

CHUNK_BYTES = 65536


def read_bytes(path: str | os.PathLike[str], max_bytes: int = 4 * CHUNK_BYTES) -> bytes:
    """The file's bytes (at most `max_bytes`) through os.open/os.read; OSError as open() raises it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_at_most(fd, max_bytes, CHUNK_BYTES)
    finally:
        os.close(fd)
