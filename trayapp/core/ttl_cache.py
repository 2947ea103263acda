"""The one TTL cache: answers kept for `ttl_s` of the caller's clock, which is passed in (pure)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values by key, each fresh for `ttl_s` after the time it was computed at (None is a value).

    An answer computed at `t` serves a question at `now_s` when `0 <= now_s - t < ttl_s`: a clock
    that went back sees it stale. Past `max_entries` keys the cache starts again empty (the keys
    are a handful a tick; a flood means the keys drift, and no old one would be asked again).
    """

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}

    def get_or_compute(self, key: K, now_s: float, compute: Callable[[], V]) -> V:
        """The fresh value of `key` at `now_s`, else `compute()`'s, kept as computed at `now_s`."""
        cached = self._entries.get(key)
        if cached is not None and 0.0 <= now_s - cached[0] < self.ttl_s:
            return cached[1]
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        value = compute()
        self._entries[key] = (now_s, value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
