"""A listing that hardly ever changes (thermal zones, GPU cards, CPU frequency policies), looked up
again at most every STATIC_REFRESH_S instead of every tick (issue #26)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

# How long a listing is kept: a CPU brought online, a GPU or thermal zone that appears shows at most
# this much later (one that goes away may be dropped sooner: see `Relisted.expire`).
STATIC_REFRESH_S = 60.0

T = TypeVar("T")


class Relisted(Generic[T]):
    """`lookup()`'s answer, kept for `refresh_s` of `clock` (seconds)."""

    def __init__(
        self,
        lookup: Callable[[], T],
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = STATIC_REFRESH_S,
    ) -> None:
        self._lookup = lookup
        self._clock = clock
        self._refresh_s = refresh_s
        self._kept: tuple[float, T] | None = None  # (when looked up, the answer)

    def get(self) -> T:
        """The kept listing, looked up again when older than `refresh_s` (or expired)."""
        now_s = self._clock()
        kept = self._kept
        if kept is None or now_s - kept[0] >= self._refresh_s:
            kept = self._kept = (now_s, self._lookup())
        return kept[1]

    def expire(self) -> None:
        """Look up again at the next `get()` (what was listed has gone)."""
        self._kept = None
