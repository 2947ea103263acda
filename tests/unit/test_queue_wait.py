"""Queue wait (#22): the proxy's figure by hand, and the server's live count of waiting requests on
every surface (tooltip, `status`, JSON, Prometheus)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from tests.support import snapshots as s
from trayapp.core.glance import GlanceTracker
from trayapp.core.jsonview import snapshot_json
from trayapp.core.remote_snapshot import snapshot_from_json
from trayapp.core.text import model_line
from trayapp.services.proxy.recorder_parse import queue_wait_s
from trayapp.sinks.metrics import MetricsState


def test_queue_wait_is_the_proxys_time_less_the_servers_own() -> None:
    # streaming: first text 5.0 s after arrival, the server read the prompt in 250 ms → waited 4.75 s
    streamed = queue_wait_s({"prompt_ms": 250.0}, streaming=True, ttft_s=5.0, elapsed_s=None)
    assert streamed == pytest.approx(4.75)
    # not streaming: 10 s in all, 500 ms prompt + 3000 ms decode by the server → waited 6.5 s
    timings = {"prompt_ms": 500.0, "predicted_ms": 3000.0}
    assert queue_wait_s(timings, streaming=False, ttft_s=None, elapsed_s=10.0) == pytest.approx(6.5)
    # the hop can make the difference negative by a hair: never below 0
    assert queue_wait_s({"prompt_ms": 300.0}, streaming=True, ttft_s=0.299, elapsed_s=None) == 0.0
    assert queue_wait_s({}, streaming=True, ttft_s=1.0, elapsed_s=None) is None


def test_requests_waiting_for_a_slot_show_everywhere() -> None:
    waiting = s.model("llama3.1:8b", "decoding", 40.0, queued_requests=2)
    snapshot = s.snap(1.0, s.server(waiting))
    assert "queued 2" in GlanceTracker().update(snapshot).tooltip
    assert "~40 tok/s · queued 2" in model_line(waiting)
    document = snapshot_json(snapshot)
    assert document["servers"][0]["models"][0]["queued_requests"] == 2
    assert snapshot_from_json(document).servers[0].models[0].queued_requests == 2
    state = MetricsState()
    state.observe(snapshot)
    exposed = generate_latest(state.registry).decode()
    assert 'llm_tray_queued_requests{kind="llamacpp",model="llama3.1:8b"' in exposed
    idle = s.model("llama3.1:8b", "decoding", 40.0)
    assert "queued" not in GlanceTracker().update(s.snap(1.0, s.server(idle))).tooltip


def test_each_proxied_requests_wait_is_a_histogram() -> None:
    state = MetricsState()
    record = s.request(40.0, 2.0)
    state.observe(s.snap(2.0, s.server(s.model()), requests=(replace(record, queue_wait_s=4.2),)))
    text = generate_latest(state.registry).decode()
    assert "llm_tray_request_queue_wait_seconds_sum" in text
    line = next(x for x in text.splitlines() if x.startswith("llm_tray_request_queue_wait_seconds_sum"))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(4.2)


def test_the_icon_marks_a_queue_and_the_tooltip_says_how_long_it_has_been_seen() -> None:
    tracker = GlanceTracker()
    busy = s.model("llama3.1:8b", "decoding", 40.0, queued_requests=1)
    first = tracker.update(s.snap(10.0, s.server(busy)))
    assert first.queued and "queued 1" in first.tooltip and "waiting" not in first.tooltip  # just seen
    later = tracker.update(s.snap(15.0, s.server(busy)))
    assert "queued 1 · waiting ≥5 s" in later.tooltip_lines[1]  # seen waiting for 5 s of the monitor's clock
    done = tracker.update(s.snap(16.0, s.server(s.model("llama3.1:8b", "decoding", 40.0))))
    assert not done.queued and "queued" not in done.tooltip
    again = tracker.update(s.snap(17.0, s.server(busy)))
    assert "waiting" not in again.tooltip  # a new queue starts its own count
