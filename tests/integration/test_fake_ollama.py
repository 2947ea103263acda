"""OllamaProbe against a fake Ollama v0.32.15 on 127.0.0.1 whose state changes over time.

The fake (tests/support/fake_servers.py) serves `/api/version`, `/api/ps`,
`/api/tags` and `POST /api/show` shaped like fixtures/ollama. A fake child
`/slots` server stands in for Ollama's llama-server child here; the real child
is exercised in test_ollama_child.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_servers import FakeLlamaSlots, FakeOllama, fixture_json
from tests.support.llama import monitor_for, tick_until
from trayapp.config import paths
from trayapp.config.settings import Settings
from trayapp.core.model import ModelReading, ServerReading
from trayapp.core.placement import weights_bytes
from trayapp.core.thresholds import Thresholds
from trayapp.sinks.store import Store
from trayapp.sources.http import make_client
from trayapp.sources.processes import ChildServer
from trayapp.sources.servers.ollama import NO_CHILD_REASON, OllamaProbe

QWEN_BLOB = "/usr/share/ollama/.ollama/models/blobs/sha256-" + (
    "f9edf649d7abdd6cb3d8918af1e0f1ff471e07d3b24926ceaa0be6da8b59258f"
)


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def probe(ollama: FakeOllama) -> Iterator[OllamaProbe]:
    probe = OllamaProbe(ollama.url, find_children=lambda: [])
    yield probe
    probe.close()


def by_name(reading: ServerReading) -> dict[str, ModelReading]:
    return {m.name: m for m in reading.models}


def test_follows_loads_context_growth_and_unloads(ollama: FakeOllama, probe: OllamaProbe) -> None:
    first = probe.poll(0.0)
    assert first.status == "ok"
    assert first.version == "0.32.15"
    assert first.models == ()
    assert first.elapsed_s is not None and first.elapsed_s >= 0

    ollama.load("llama3.1:8b")
    llama = by_name(probe.poll(1.0))["llama3.1:8b"]
    assert llama.vram_bytes == llama.size_bytes == 6294446080
    assert llama.facts is not None and llama.facts.source == "ollama-show"
    # size on disk from /api/tags, through the facts (weights are decided in one place: placement)
    assert llama.facts.weights_bytes == 4920753328 and weights_bytes(llama) == 4920753328
    assert llama.live_rate_reason == NO_CHILD_REASON

    ollama.load("qwen3:30b")
    models = by_name(probe.poll(2.0))
    assert set(models) == {"llama3.1:8b", "qwen3:30b"}
    qwen = models["qwen3:30b"]
    assert (qwen.size_bytes, qwen.vram_bytes, qwen.context_length) == (22187335680, 10649920512, 32768)
    assert qwen.facts is not None and qwen.facts.expert_count == 128

    # num_ctx 32k -> 64k: 48 layers × 4 KV heads × 256 × 2 B = 98,304 B/token more KV.
    grown = 22187335680 + 32768 * 98304
    ollama.set_context("qwen3:30b", 65536, size=grown, size_vram=8552185856)
    qwen = by_name(probe.poll(3.0))["qwen3:30b"]
    assert qwen.context_length == 65536
    assert qwen.size_bytes == grown
    assert qwen.vram_bytes == 8552185856  # less of it fits on the GPU now

    ollama.unload("llama3.1:8b")
    assert set(by_name(probe.poll(4.0))) == {"qwen3:30b"}
    ollama.unload("qwen3:30b")
    assert probe.poll(5.0).models == ()

    # /api/show once per model (name + digest), however many polls.
    assert ollama.count("POST", "/api/show") == 2


def test_show_is_asked_again_for_a_new_digest(ollama: FakeOllama, probe: OllamaProbe) -> None:
    ollama.load("llama3.1:8b")
    probe.poll(0.0)
    probe.poll(1.0)
    assert ollama.count("POST", "/api/show") == 1
    ollama.load("llama3.1:8b", digest="0" * 64)  # `ollama pull` replaced it
    probe.poll(2.0)
    assert ollama.count("POST", "/api/show") == 2


def test_show_failure_is_retried_later_and_loses_nothing(ollama: FakeOllama, probe: OllamaProbe) -> None:
    ollama.load("llama3.1:8b")
    ollama.overrides["/api/show"] = (500, {"error": "boom"})
    reading = probe.poll(0.0)
    assert reading.status == "ok"
    [llama] = reading.models
    assert llama.size_bytes == 6294446080 and llama.facts is None
    probe.poll(1.0)
    assert ollama.count("POST", "/api/show") == 1  # not hammered
    del ollama.overrides["/api/show"]
    [llama] = probe.poll(100.0).models  # after the retry delay
    assert llama.facts is not None


def test_child_slots_are_attached_to_the_matching_model(ollama: FakeOllama) -> None:
    """Two children: the one whose `--model` blob is qwen's (per /api/show FROM) gives qwen its slots."""
    busy = fixture_json("llama-server/captured/slots_busy.json")
    idle = fixture_json("llama-server/captured/slots_fresh.json")
    with FakeLlamaSlots(busy) as qwen_child, FakeLlamaSlots(idle) as llama_child:
        children = [
            ChildServer(
                pid=4242, port=llama_child.port, model_path="/o/blobs/sha256-" + "1" * 64, parent_pid=7
            ),
            ChildServer(pid=4343, port=qwen_child.port, model_path=QWEN_BLOB, parent_pid=7),
        ]
        probe = OllamaProbe(ollama.url, find_children=lambda: children)
        try:
            ollama.load("qwen3:30b")
            ollama.load("llama3.1:8b")
            reading = probe.poll(0.0)
            qwen, llama = by_name(reading)["qwen3:30b"], by_name(reading)["llama3.1:8b"]
            assert qwen.server_pid == 4343
            assert qwen.model_path == QWEN_BLOB
            assert qwen.live_rate_reason is None
            busy_slots = [s for s in qwen.slots if s.is_processing]
            assert len(busy_slots) == 1 and busy_slots[0].context_tokens == 125
            # llama's blob digest matches no child, and with two models there is no guessing.
            assert llama.slots == () and llama.live_rate_reason == NO_CHILD_REASON
            assert reading.pid == 7  # the ollama parent

            # The child dies: the model stays, with an honest reason.
            qwen_child.overrides["/slots"] = (503, fixture_json("llama-server/loading_503.json"))
            qwen = by_name(probe.poll(1.0))["qwen3:30b"]
            assert qwen.slots == ()
            assert qwen.live_rate_reason is not None and "pid 4343" in qwen.live_rate_reason
        finally:
            probe.close()


def test_server_down_garbage_and_hang(ollama: FakeOllama) -> None:
    probe = OllamaProbe(ollama.url, client=make_client(ollama.url, timeout=0.5), find_children=lambda: [])
    try:
        ollama.overrides["/api/ps"] = (200, "<html>not json</html>")
        garbage = probe.poll(0.0)
        assert garbage.status == "error"
        assert garbage.reason is not None and "invalid JSON" in garbage.reason

        ollama.overrides["/api/ps"] = (200, {"unexpected": True})
        shape = probe.poll(1.0)
        assert shape.status == "error" and "/api/ps" in (shape.reason or "")

        del ollama.overrides["/api/ps"]
        ollama.delays_s["/api/ps"] = 1.5
        hung = probe.poll(2.0)
        assert hung.status == "error"
        assert "no answer" in (hung.reason or "")
        assert hung.elapsed_s is not None and hung.elapsed_s < 1.4
        ollama.delays_s.clear()
    finally:
        probe.close()

    url = ollama.url
    ollama.close()
    gone = OllamaProbe(url, find_children=lambda: [])
    try:
        down = gone.poll(3.0)
        assert down.status == "unreachable"
        assert down.models == ()
    finally:
        gone.close()


def test_a_recorder_that_stops_ends_its_sessions_and_alerts_in_the_store(ollama: FakeOllama) -> None:
    """The monitor sees Ollama up, then failing past the alert's confirmation (1 s here): `server_down`
    is raised. It stops: the store holds that alert ended at the last tick, and no session or alert
    of it reads "live" afterwards."""
    settings = Settings(thresholds=Thresholds(confirm_s=1.0))
    monitor = monitor_for(ollama.url, record=True, settings=settings, measure_ram=False)
    try:
        assert monitor.tick().servers[0].status == "ok"
        ollama.overrides["/api/ps"] = (500, {"error": "internal"})  # it stops answering
        snapshots = tick_until(
            monitor, lambda s: any(a.kind == "server_down" for a in s.alerts), limit_s=60, interval_s=0.3
        )
        last = snapshots[-1]
        (down,) = [a for a in last.alerts if a.kind == "server_down"]
        assert down.ended_wall_s is None
    finally:
        monitor.close()
    with Store(paths.store_file(), writer=False) as store:
        (stored,) = [a for a in store.alerts_between(0, 2e10) if a["alert_id"] == down.id]
        assert stored["ended_wall_s"] == last.t_wall_s
        assert all(s.ended_wall_s is not None for s in store.sessions())
