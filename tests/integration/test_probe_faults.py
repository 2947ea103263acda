"""LlamaCppProbe against fake HTTP servers on 127.0.0.1: faults, and its polling policy.

Every fault must come back as a clear status + reason, quickly, and never as an exception.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.fake_http import (
    FakeServer,
    Reply,
    file_reply,
    hang,
    json_reply,
    oversized,
    text_reply,
    truncated,
    write_reply,
)
from tests.support.fake_servers import wait_until
from tests.support.llama import free_port
from trayapp.core.model import ModelFacts, ServerReading
from trayapp.sources.facts_loader import STILL_READING, ModelFactsLoader
from trayapp.sources.http import MAX_BODY_BYTES
from trayapp.sources.servers import llamacpp
from trayapp.sources.servers.llamacpp import (
    API_KEY_REJECTED,
    API_KEY_REQUIRED,
    HEALTH_MAX_BYTES,
    LlamaCppProbe,
)

HEALTH_OK = json_reply({"status": "ok"})
LOADING = json_reply({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503)
UNAUTHORIZED = json_reply(
    {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}, 401
)


@pytest.fixture
def captured(fixtures_dir: Path) -> Path:
    return fixtures_dir / "llama-server" / "captured"


def llama_routes(captured: Path, props: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fake llama-server answering with the real captures."""
    props_reply = json_reply(props) if props is not None else file_reply(captured / "props.json")
    return {
        "/health": file_reply(captured / "health.json"),
        "/props": props_reply,
        "/slots": file_reply(captured / "slots_busy.json"),
        "/metrics": file_reply(
            captured / "metrics_after.txt", headers={"Process-Start-Time-Unix": "1796028000"}
        ),
        "/v1/models": file_reply(captured / "v1_models.json"),
    }


def captured_props(captured: Path, **changes: Any) -> dict[str, Any]:
    props: dict[str, Any] = json.loads((captured / "props.json").read_text())
    props.update(changes)
    return props


@pytest.fixture
def fake(captured: Path) -> Iterator[FakeServer]:
    with FakeServer(llama_routes(captured)) as server:
        yield server


def poll_once(url: str, **kwargs: Any) -> ServerReading:
    probe = LlamaCppProbe(url, **kwargs)
    try:
        return probe.poll(0.0)
    finally:
        probe.close()


# --------------------------------------------------------------------------- a healthy fake


def test_reads_everything_from_a_healthy_server(fake: FakeServer) -> None:
    reading = poll_once(fake.url)
    assert reading.status == "ok" and reading.reason is None
    assert reading.kind == "llamacpp" and reading.url == fake.url
    assert reading.version == "b0-unknown"
    (model,) = reading.models
    assert model.name == "gemma-3-270m-q4_k_m.gguf"
    assert model.model_path == "/models/gemma-3-270m-q4_k_m.gguf"
    assert model.context_length == 8192 and model.quantization == "Q4_K_M"
    assert model.weights_bytes == 246587904 and model.parameter_count == 268098176
    assert len(model.slots) == 4 and model.slots[3].n_decoded == 115 and model.busy is True
    assert model.counters is not None and model.counters.tokens_predicted_total == 300
    assert model.counters.process_start_s == 1796028000.0
    assert reading.elapsed_s is not None and reading.elapsed_s < 2.0


def test_url_is_kept_as_given(fake: FakeServer) -> None:
    url = fake.url + "/"
    assert poll_once(url).url == url


def _connections_to(port: int) -> list[Any]:
    """This process's TCP connections to 127.0.0.1:`port` that are still open on our side."""
    return [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status != psutil.CONN_CLOSE
    ]


def test_a_probe_closed_while_it_polls_ends_the_poll_and_keeps_no_connection(captured: Path) -> None:
    """The monitor closes probes while their poll threads may still run (shutdown, a kind change): the
    poll ends as usual and what it opened after the close is closed too, nothing leaks."""
    answer_health = threading.Event()

    def gated_health(handler: Any, server: FakeServer) -> None:
        answer_health.wait(10.0)
        write_reply(handler, file_reply(captured / "health.json"))

    with FakeServer({**llama_routes(captured), "/health": gated_health}) as fake:
        probe = LlamaCppProbe(fake.url)
        readings: list[ServerReading] = []
        poller = threading.Thread(target=lambda: readings.append(probe.poll(0.0)))
        poller.start()
        wait_until(lambda: fake.count("GET", "/health") == 1)  # the poll waits on its first answer
        probe.close()
        answer_health.set()
        poller.join(10.0)
        assert not poller.is_alive()
        (reading,) = readings
        assert reading.status == "ok" and fake.count("GET", "/slots") == 1  # it went on after the close
        assert _connections_to(fake.port) == []


def test_polling_policy(fake: FakeServer) -> None:
    """/slots every poll; /props and /v1/models cached; /metrics at most every metrics_interval_s."""
    probe = LlamaCppProbe(fake.url, metrics_interval_s=10.0, props_refresh_s=30.0)
    try:
        counters_seen = [probe.poll(float(t)).models[0].counters is not None for t in range(12)]
    finally:
        probe.close()
    paths = fake.paths_requested()
    assert paths.count("/health") == 12 and paths.count("/slots") == 12
    assert paths.count("/props") == 1 and paths.count("/v1/models") == 1
    assert paths.count("/metrics") == 2  # t=0 and t=10
    assert counters_seen == [True] + [False] * 9 + [True, False]


def test_props_refreshed_after_interval(fake: FakeServer) -> None:
    probe = LlamaCppProbe(fake.url, props_refresh_s=30.0)
    try:
        probe.poll(0.0)
        probe.poll(29.0)
        probe.poll(30.0)
    finally:
        probe.close()
    assert fake.paths_requested().count("/props") == 2


def test_sleeping_server_is_not_woken(fake: FakeServer, captured: Path) -> None:
    fake.routes["/props"] = json_reply(captured_props(captured, is_sleeping=True))
    probe = LlamaCppProbe(fake.url)
    try:
        readings = [probe.poll(float(t)) for t in range(3)]
    finally:
        probe.close()
    paths = fake.paths_requested()
    assert "/slots" not in paths  # /slots would wake it and reload the model
    assert paths.count("/props") == 3  # re-read every poll to see it wake up
    model = readings[-1].models[0]
    assert readings[-1].status == "ok" and not model.loaded
    assert model.live_rate_reason is not None and "asleep" in model.live_rate_reason


def test_no_slots_and_no_metrics_endpoints(fake: FakeServer, captured: Path) -> None:
    fake.routes["/props"] = json_reply(captured_props(captured, endpoint_slots=False, endpoint_metrics=False))
    reading = poll_once(fake.url)
    assert "/slots" not in fake.paths_requested() and "/metrics" not in fake.paths_requested()
    model = reading.models[0]
    assert model.slots == () and model.counters is None
    assert model.live_rate_reason is not None and "--no-slots" in model.live_rate_reason


def test_metrics_501_is_not_retried(fake: FakeServer) -> None:
    fake.routes["/metrics"] = json_reply(
        {"error": {"code": 501, "message": "This server does not support metrics endpoint.", "type": "x"}},
        501,
    )
    probe = LlamaCppProbe(fake.url, metrics_interval_s=1.0)
    try:
        readings = [probe.poll(float(t)) for t in range(4)]
    finally:
        probe.close()
    assert fake.paths_requested().count("/metrics") == 1
    assert all(r.status == "ok" for r in readings)


def test_restart_with_another_model_refreshes_props_at_once(fake: FakeServer, captured: Path) -> None:
    probe = LlamaCppProbe(fake.url, props_refresh_s=1000.0)
    try:
        assert probe.poll(0.0).models[0].context_length == 8192
        fake.routes["/health"] = LOADING
        loading = probe.poll(1.0)
        assert loading.status == "loading" and loading.models == ()
        fake.routes["/health"] = HEALTH_OK
        fake.routes["/props"] = json_reply(
            captured_props(
                captured,
                model_path="/models/other.gguf",
                model_alias="other",
                default_generation_settings={"n_ctx": 4096, "params": {}},
            )
        )
        after = probe.poll(2.0)
    finally:
        probe.close()
    model = after.models[0]
    assert after.status == "ok" and model.name == "other" and model.context_length == 4096
    assert fake.paths_requested().count("/props") == 2
    assert fake.paths_requested().count("/v1/models") == 2  # a new load: meta looked up again


# --------------------------------------------------------------------------- model facts


def _facts() -> ModelFacts:
    return ModelFacts(weights_bytes=246587904, bytes_per_token=200_000_000, exact=True, source="test")


def poll_until_facts_known(probe: LlamaCppProbe, timeout_s: float = 10.0) -> list[ServerReading]:
    """Poll until the background read of the model file is over (facts, or why not)."""
    readings: list[ServerReading] = []

    def read_done() -> bool:
        readings.append(probe.poll(float(len(readings))))
        return probe.facts_reason != STILL_READING

    wait_until(read_done, timeout_s=timeout_s)
    return readings


def test_facts_loader_called_once_per_path(fake: FakeServer, captured: Path, tmp_path: Path) -> None:
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    fake.routes["/props"] = json_reply(captured_props(captured, model_path=str(model_file)))
    calls: list[str] = []

    def loader(path: str) -> ModelFacts:
        calls.append(path)
        return _facts()

    probe = LlamaCppProbe(fake.url, facts_loader=ModelFactsLoader(loader))
    try:
        poll_until_facts_known(probe)
        readings = [probe.poll(100.0 + t) for t in range(3)]
    finally:
        probe.close()
    assert calls == [str(model_file)]
    assert all(r.models[0].facts == _facts() for r in readings)
    assert probe.facts_reason is None


def test_failing_facts_loader_is_tolerated(fake: FakeServer, captured: Path, tmp_path: Path) -> None:
    model_file = tmp_path / "broken.gguf"
    model_file.write_bytes(b"nope")
    fake.routes["/props"] = json_reply(captured_props(captured, model_path=str(model_file)))
    calls: list[str] = []

    def loader(path: str) -> ModelFacts:
        calls.append(path)
        raise ValueError("not a GGUF file")

    probe = LlamaCppProbe(fake.url, facts_loader=ModelFactsLoader(loader))
    try:
        readings = poll_until_facts_known(probe) + [probe.poll(100.0 + t) for t in range(2)]
    finally:
        probe.close()
    assert len(calls) == 1
    assert all(r.status == "ok" and r.models[0].facts is None for r in readings)
    assert probe.facts_reason is not None and "not a GGUF file" in probe.facts_reason


def test_slow_facts_loader_does_not_stall_polls(fake: FakeServer, captured: Path, tmp_path: Path) -> None:
    model_file = tmp_path / "big.gguf"
    model_file.write_bytes(b"GGUF")
    fake.routes["/props"] = json_reply(captured_props(captured, model_path=str(model_file)))
    release = threading.Event()

    def loader(path: str) -> ModelFacts:
        release.wait(timeout=10.0)
        return _facts()

    probe = LlamaCppProbe(fake.url, facts_loader=ModelFactsLoader(loader))
    try:
        first = probe.poll(0.0)
        assert first.models[0].facts is None and probe.facts_reason == "still reading the model file"
        assert first.elapsed_s is not None and first.elapsed_s < 1.5
        release.set()
        facts = wait_until(lambda: probe.poll(1.0).models[0].facts, timeout_s=5.0)
    finally:
        release.set()
        probe.close()
    assert facts == _facts()


def test_a_model_file_changed_on_disk_is_read_again(tmp_path: Path) -> None:
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    calls: list[str] = []

    def loader(path: str) -> ModelFacts:
        calls.append(path)
        return _facts()

    facts = ModelFactsLoader(loader)
    assert facts.lookup(str(model_file)) == (None, STILL_READING)
    assert wait_until(lambda: facts.get(str(model_file))) == _facts()
    model_file.write_bytes(b"GGUF v2")  # another size: another version of the file
    os.utime(model_file, ns=(1_000_000_000, 1_000_000_000))
    assert facts.lookup(str(model_file)) == (None, STILL_READING)
    assert wait_until(lambda: facts.get(str(model_file))) == _facts()
    assert calls == [str(model_file)] * 2


def test_remote_model_file_gives_a_reason(fake: FakeServer) -> None:
    probe = LlamaCppProbe(fake.url, facts_loader=ModelFactsLoader(lambda path: _facts()))
    try:
        model = probe.poll(0.0).models[0]
    finally:
        probe.close()
    assert model.facts is None
    assert probe.facts_reason == "model file not readable here: /models/gemma-3-270m-q4_k_m.gguf"


# --------------------------------------------------------------------------- a bug in the probe


def test_a_bug_in_a_probe_is_an_error_reading_with_its_traceback_logged_once(
    fake: FakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_parse_slots(data: Any) -> Any:
        return data[0]["no such key"]  # a KeyError, as a parser bug would raise

    monkeypatch.setattr(llamacpp, "parse_slots", broken_parse_slots)
    caplog.set_level(logging.INFO, logger="trayapp.sources.servers.common")
    probe = LlamaCppProbe(fake.url)
    try:
        readings = [probe.poll(float(t)) for t in range(3)]
    finally:
        probe.close()
    assert all(r.status == "error" for r in readings)
    assert readings[0].reason == "internal error: KeyError: 'no such key'"
    assert readings[0].elapsed_s is not None
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert len(logged) == 1  # once for three polls with the same failure
    assert logged[0].levelno == logging.ERROR and fake.url in logged[0].getMessage()
    assert "Traceback" in caplog.text and "broken_parse_slots" in caplog.text
    transitions = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert transitions == [f"llamacpp {fake.url}: None -> error (internal error: KeyError: 'no such key')"]


# --------------------------------------------------------------------------- faults


def test_connection_refused() -> None:
    reading = poll_once(f"http://127.0.0.1:{free_port()}")
    assert reading.status == "unreachable"
    assert reading.reason is not None and "refused" in reading.reason
    assert reading.models == ()


@pytest.mark.parametrize("path", ["/health", "/props"])
def test_http_500(fake: FakeServer, path: str) -> None:
    fake.routes[path] = json_reply({"error": {"code": 500, "message": "boom", "type": "server_error"}}, 500)
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason == f"HTTP 500 on {path}: boom"


def test_api_key_required(fake: FakeServer) -> None:
    for path in ("/props", "/slots", "/metrics", "/v1/models"):
        fake.routes[path] = UNAUTHORIZED
    reading = poll_once(fake.url)
    assert reading.status == "unauthorized"
    assert reading.reason == API_KEY_REQUIRED == "API key required: set one for this endpoint"


def test_api_key_rejected_and_sent_as_bearer(fake: FakeServer) -> None:
    fake.routes["/props"] = UNAUTHORIZED
    reading = poll_once(fake.url, api_key="wrong-key")
    assert reading.status == "unauthorized" and reading.reason == API_KEY_REJECTED
    headers = next(h for _, path, h in fake.requests if path == "/props")
    assert {k.lower(): v for k, v in headers.items()}["authorization"] == "Bearer wrong-key"


def test_loading(fake: FakeServer) -> None:
    fake.routes["/health"] = LOADING
    reading = poll_once(fake.url)
    assert reading.status == "loading" and reading.reason == "loading model"


@pytest.mark.parametrize("path", ["/health", "/props"])
def test_garbage_json(fake: FakeServer, path: str) -> None:
    fake.routes[path] = text_reply("<html>It works!</html>", content_type="application/json")
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason is not None and reading.reason.startswith(f"{path}: invalid JSON")


def test_garbage_slots_keeps_the_rest(fake: FakeServer) -> None:
    fake.routes["/slots"] = text_reply("[{not json")
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason is not None and reading.reason.startswith("/slots: invalid JSON")
    (model,) = reading.models  # what did answer is not lost
    assert model.context_length == 8192 and model.counters is not None


def test_props_not_an_object(fake: FakeServer) -> None:
    fake.routes["/props"] = json_reply(["a", "list"])
    reading = poll_once(fake.url)
    assert reading.status == "error" and reading.reason == "/props: unexpected payload (not a JSON object)"


def test_truncated_json(fake: FakeServer) -> None:
    fake.routes["/props"] = Reply(200, b'{"model_path": "/models/x.gguf", "total_sl')
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason is not None and reading.reason.startswith("/props: invalid JSON")


def test_connection_closed_mid_body(fake: FakeServer) -> None:
    fake.routes["/health"] = truncated(b'{"sta', declared_bytes=100)
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason is not None and "closed the connection" in reading.reason


@pytest.mark.parametrize("path", ["/health", "/slots"])
def test_hung_server_poll_returns_quickly(fake: FakeServer, path: str) -> None:
    fake.routes[path] = hang
    started = time.monotonic()
    reading = poll_once(fake.url)
    assert time.monotonic() - started < 5.0
    assert reading.status == "error"
    assert reading.reason is not None and path in reading.reason and "hung" in reading.reason


@pytest.mark.parametrize(("path", "cap"), [("/health", HEALTH_MAX_BYTES), ("/props", MAX_BODY_BYTES)])
def test_oversized_response(fake: FakeServer, path: str, cap: int) -> None:
    fake.routes[path] = oversized(cap + 512 * 1024)
    reading = poll_once(fake.url)
    assert reading.status == "error"
    assert reading.reason is not None and path in reading.reason and "larger than" in reading.reason


def test_not_a_llama_server(captured: Path) -> None:
    """An MLX-LM server on the same port: /health ok, no /props."""
    with FakeServer({"/health": json_reply({"status": "ok"}), "/v1/models": json_reply({"data": []})}) as mlx:
        reading = poll_once(mlx.url)
    assert reading.status == "error"
    assert reading.reason is not None and "HTTP 404 on /props" in reading.reason
    assert "not a llama-server?" in reading.reason


def test_unexpected_health_answer(fake: FakeServer) -> None:
    fake.routes["/health"] = json_reply({"status": "degraded"})
    reading = poll_once(fake.url)
    assert reading.status == "error" and reading.reason == "/health: unexpected answer 'degraded'"
