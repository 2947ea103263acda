"""Start-up's objects are left out of later collections, and the young generation is collected less
often (sources/malloc.py): no full pass over a tray's heap under a stream (issue #26)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from trayapp.sources.malloc import YOUNG_COLLECTION_ALLOCATIONS, settle_the_heap


@pytest.fixture
def gc_as_it_was() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("gc_as_it_was")
def test_objects_made_before_are_frozen_and_young_passes_come_less_often() -> None:
    gc.set_threshold(700, 10, 10)  # CPython 3.11's default
    made_before: list[object] = [[]]  # a container: tracked by the collector
    assert any(o is made_before for o in gc.get_objects())
    settle_the_heap()
    assert not any(o is made_before for o in gc.get_objects())  # frozen: in no generation a pass reads
    assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, 10, 10)
    made_after: list[object] = [[]]
    assert any(o is made_after for o in gc.get_objects(generation=0))
    # a cycle made after start-up is still collected
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


@pytest.mark.usefixtures("gc_as_it_was")
def test_a_higher_threshold_set_by_the_user_is_kept() -> None:
    gc.set_threshold(50_000, 20, 20)
    settle_the_heap()
    assert gc.get_threshold() == (50_000, 20, 20)
