"""glibc's allocator, where it is the C library (Linux), and Python's cycle collector: what the
long-running processes ask of them.

Elsewhere (macOS, Windows, musl) every glibc call here does nothing and says so (False).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
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


# Python's cycle collector runs its young generation every 700 container allocations (3.11) and,
# now and then, a full pass over every object: the proxy's loop thread at 50 streams starting
# together ran 55 young passes of ~0.1 ms, 5 middle ones of ~0.6 ms and one full pass of 13–18 ms
# over 8 rounds (bench/proxy_overhead.py, gc.callbacks), the full one the whole of one round's p99.
# A request's objects go with their references; the few cycles wait for a pass 10,000 allocations
# on (a few MB at most).
YOUNG_COLLECTION_ALLOCATIONS = 10_000


def settle_the_heap() -> None:
    """Once start-up is done: every object made so far (modules, classes, settings, Qt's wrappers) is
    left out of all later collections (they live as long as the process), and the young generation is
    collected every YOUNG_COLLECTION_ALLOCATIONS allocations, not 700. No pass stands between a
    request and its answer for more than a fraction of a millisecond; a full one is over the few
    objects made since."""
    gc.collect()  # start-up's own garbage, not kept for ever
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_COLLECTION_ALLOCATIONS), middle, old)
