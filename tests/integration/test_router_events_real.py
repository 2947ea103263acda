"""A real llama-server router followed through `GET /models/sse` (issue #22).

The router (`--models-max 1 --sleep-idle-seconds 3`, two names for the test GGUF) is watched by the
real `LlamaRouterProbe`; a separate client loads `alpha`, lets it sleep and wakes it. The states are
checked against the router's own `GET /models` (asked by the test, never by the probe), and the
probe's own counter shows it read `/models` only once, when the stream connected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.fake_http import FakeServer, file_reply, json_reply
from tests.support.llama import generate
from tests.support.llama_router import Router
from trayapp.core.model import FinishedRequest, ModelReading, ServerReading
from trayapp.sources.servers.llamacpp_router import LOAD_SOURCE, LlamaRouterProbe

pytestmark = pytest.mark.llamacpp

POLL_S = 0.25
SLEEP_IDLE_S = 3


@pytest.fixture
def sleepy_router(llama_binary: Path, model_path: Path, tmp_path: Path) -> Iterator[Router]:
    server = Router(llama_binary, model_path, tmp_path)
    server.command += ["--sleep-idle-seconds", str(SLEEP_IDLE_S)]
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Watch:
    """Polls the probe every POLL_S until a condition on its reading holds; keeps every reading."""

    def __init__(self, probe: LlamaRouterProbe) -> None:
        self.probe = probe
        self.readings: list[ServerReading] = []

    def until(self, condition: Callable[[ServerReading], bool], limit_s: float, what: str) -> ServerReading:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            reading = self.probe.poll(time.monotonic())
            self.readings.append(reading)
            if condition(reading):
                return reading
            time.sleep(POLL_S)
        raise AssertionError(
            f"not within {limit_s:g} s: {what}; last: {self.readings[-1] if self.readings else None}"
        )

    def loads(self) -> list[FinishedRequest]:
        return [f for r in self.readings for f in r.finished if f.source == LOAD_SOURCE]


def alpha(reading: ServerReading) -> ModelReading:
    return next(m for m in reading.models if m.name == "alpha")


def test_loads_and_sleeps_seen_from_the_event_stream(sleepy_router: Router) -> None:
    """A load, a sleep and a wake of `alpha` are followed from /models/sse: the probe reads
    `/models` once (the stream sends no initial state) and never again while the stream runs; the
    router still puts the child to sleep (the stream keeps nothing awake); each load's time comes
    from its events. About 15-30 s."""
    router = sleepy_router
    probe = LlamaRouterProbe(router.url)
    watch = Watch(probe)
    try:
        watch.until(
            lambda r: probe.stream_state == "connected" and probe.models_reads >= 1, 10.0, "stream up"
        )
        watch.until(lambda r: r.status == "ok", 5.0, "a reading from the events")
        reads_at_start = probe.models_reads
        assert router.states() == {"alpha": "unloaded", "beta": "unloaded"}

        started = time.monotonic()
        answer = generate(router.url, "Hello", 4, model="alpha")
        asked_s = time.monotonic() - started
        assert answer["tokens_predicted"] == 4
        loaded = watch.until(lambda r: alpha(r).loaded, 10.0, "alpha loaded")
        assert alpha(loaded).weights_bytes == 246_587_904  # from the `loaded` event's info.meta
        (first_load,) = watch.loads()
        assert first_load.load_s is not None and 0.0 < first_load.load_s < asked_s

        asleep = watch.until(lambda r: alpha(r).sleeping, SLEEP_IDLE_S + 30.0, "alpha asleep")
        assert router.states()["alpha"] == "sleeping"
        assert "asleep" in (alpha(asleep).live_rate_reason or "")

        started = time.monotonic()
        generate(router.url, "Hello", 4, model="alpha")
        woke_s = time.monotonic() - started
        watch.until(lambda r: alpha(r).loaded and not alpha(r).sleeping, 10.0, "alpha awake")
        assert router.states()["alpha"] == "loaded"
        _first, wake = watch.loads()
        assert wake.load_s is not None and 0.0 < wake.load_s < woke_s

        assert probe.stream_state == "connected"
        assert probe.models_reads == reads_at_start, "GET /models was polled while the stream ran"
        assert all(r.status == "ok" for r in watch.readings), [r.reason for r in watch.readings]
    finally:
        probe.close()


def test_an_older_build_without_the_stream_is_polled(fixtures_dir: Path) -> None:
    """A router that answers 404 on /models/sse (builds before it) is polled: `/models` every time."""
    captured = fixtures_dir / "llama-server" / "captured"
    routes = {
        "/health": json_reply({"status": "ok"}),
        "/models": file_reply(captured / "router_models_unloaded.json"),
    }
    with FakeServer(routes) as server:
        probe = LlamaRouterProbe(server.url)
        try:
            deadline = time.monotonic() + 10.0
            while probe.stream_state != "unavailable" and time.monotonic() < deadline:
                assert probe.poll(time.monotonic()).status == "ok"
                time.sleep(0.05)
            assert probe.stream_state == "unavailable"
            before = server.count("GET", "/models")
            for _ in range(3):
                reading = probe.poll(time.monotonic())
                assert reading.status == "ok" and all(not m.loaded for m in reading.models)
            assert server.count("GET", "/models") == before + 3
            assert server.count("GET", "/models/sse") == 1
        finally:
            probe.close()
