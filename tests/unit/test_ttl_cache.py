"""The one TTL cache, driven by a hand clock."""

from __future__ import annotations

from trayapp.core.ttl_cache import TtlCache


class Counter:
    """A computation that answers how many times it ran."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.calls


def test_an_answer_serves_until_its_ttl_is_over() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl_s=60.0, max_entries=10)
    compute = Counter()
    assert cache.get_or_compute("a", 1000.0, compute) == 1
    assert cache.get_or_compute("a", 1000.0, compute) == 1
    assert cache.get_or_compute("a", 1059.9, compute) == 1  # 59.9 s old: fresh
    assert cache.get_or_compute("a", 1060.0, compute) == 2  # 60 s old: stale, computed again
    assert cache.get_or_compute("a", 1119.0, compute) == 2  # fresh again, from 1060
    assert compute.calls == 2


def test_a_clock_that_went_back_sees_the_answer_stale() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl_s=60.0, max_entries=10)
    compute = Counter()
    cache.get_or_compute("a", 1000.0, compute)
    assert cache.get_or_compute("a", 999.0, compute) == 2


def test_keys_are_apart_and_none_is_a_value() -> None:
    cache: TtlCache[str, int | None] = TtlCache(ttl_s=60.0, max_entries=10)
    compute = Counter()
    assert cache.get_or_compute("nothing", 0.0, lambda: None) is None
    assert cache.get_or_compute("nothing", 1.0, compute) is None  # the cached None, not recomputed
    assert cache.get_or_compute("b", 1.0, compute) == 1
    assert compute.calls == 1


def test_past_max_entries_it_starts_again_empty() -> None:
    cache: TtlCache[int, int] = TtlCache(ttl_s=60.0, max_entries=3)
    for key in range(3):
        cache.get_or_compute(key, 0.0, lambda: 0)
    assert len(cache) == 3
    compute = Counter()
    assert cache.get_or_compute(3, 0.0, compute) == 1  # the fourth key empties the cache first
    assert len(cache) == 1
    assert cache.get_or_compute(0, 0.0, compute) == 2  # key 0 was dropped


def test_clear() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl_s=60.0, max_entries=10)
    compute = Counter()
    cache.get_or_compute("a", 0.0, compute)
    cache.clear()
    assert cache.get_or_compute("a", 1.0, compute) == 2
