"""glibc's allocator, where it is the C library (Linux): what the long-running processes ask of it.

Elsewhere (macOS, Windows, musl) every call here does nothing and says so (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from typing import Any

# glibc serves a malloc this big or bigger from its own mmap, returned to the OS on free. Left to
# itself glibc raises the threshold to the largest block freed so far (up to 32 MiB), after which
# 15 MB request bodies come from the heap and stay in the RSS: ten at once grew the proxy by 72–116
# MiB, varying with the timing of frees (the bound, 112, broken 1 in 4 beside a busy loop); with it
# fixed, 65–95 MiB in 8 of 8 (tests/integration/test_proxy_memory.py).
MMAP_THRESHOLD_BYTES = 256 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


@cache
def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - musl and others have no mallopt/malloc_trim
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def return_big_buffers_to_the_os() -> bool:
    """Fixes glibc's mmap threshold (see MMAP_THRESHOLD_BYTES); False where libc is not glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def release_free_memory() -> bool:
    """Hands the pages glibc holds free (start-up's garbage, in every thread's arena) back to the OS;
    True when some were. A few milliseconds for a tray's heap."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))
