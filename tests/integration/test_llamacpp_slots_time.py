"""When a llama-server reading was taken: the middle of its `/slots` request, not the tick's start.

A busy host answers `/slots` hundreds of milliseconds late; rates are tokens between two answers ÷
the time between them, so that time must be when the server read its slots. A fake llama-server
(captured b11434 answers) holds `/slots` back for 0.4 s; the reading's time must lie in that wait.
"""

from __future__ import annotations

import time
from typing import Any

from tests.support.fake_servers import FakeHttpServer, Reply, fixture_json, fixture_text
from trayapp.sources.servers.llamacpp import LlamaCppProbe

SLOTS_DELAY_S = 0.4


class SlowSlotsLlama(FakeHttpServer):
    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if path == "/health":
            return 200, fixture_json("llama-server/captured/health.json")
        if path == "/props":
            return 200, fixture_json("llama-server/captured/props.json")
        if path == "/slots":
            return 200, fixture_json("llama-server/captured/slots_busy.json")
        if path == "/metrics":
            return 200, fixture_text("llama-server/captured/metrics_after.txt")
        return 404, {"error": "not found"}


def test_the_reading_is_timed_at_its_slots_answer() -> None:
    with SlowSlotsLlama() as server:
        server.delays_s["/slots"] = SLOTS_DELAY_S
        probe = LlamaCppProbe(server.url, metrics_interval_s=0.0)
        try:
            tick_mono_s = time.monotonic()
            reading = probe.poll(tick_mono_s)
            done_mono_s = time.monotonic()
        finally:
            probe.close()
    assert reading.status == "ok" and reading.models[0].slots, reading.reason
    assert reading.t_mono_s is not None
    # the middle of a request that waited 0.4 s: at least 0.2 s after the tick, before the poll ended
    assert tick_mono_s + SLOTS_DELAY_S / 2 <= reading.t_mono_s <= done_mono_s
