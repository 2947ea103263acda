"""What llm-tray says about an Ollama whose silent prompt truncation it cannot see (#20).

An Ollama with no recording proxy in front and no readable log shows no cut at all: `/api/ps` has no
per-request counts. So each of its models carries one note, as information (no alert: no cut was
seen): the size that Ollama version cuts a prompt to, its context, and why the log cannot be read —
in the probe's reading (`ModelReading.unseen_cuts_reason`), the snapshot's `ModelStatus`, `status`'s
text and `status --json` (`unseen_cuts_reason`, `unseen_cuts_note`), and back from a remote machine's
document. With the log readable, or a proxy in front, there is no note.

The fake is `FakeOllama` (v0.32.15, the rules of v0.30.11+: a prompt over num_ctx − (num_ctx − 4) // 2
tokens is cut, 2,050 at num_ctx 4096); its `/api/ps` says the context each model is loaded with.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_servers import FakeOllama
from tests.support.proxy import running_proxy
from trayapp.config.settings import EndpointConfig, MonitorConfig, Settings
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.jsonview import snapshot_json
from trayapp.core.model import ModelStatus, ServerReading, Snapshot
from trayapp.core.remote_snapshot import server_from_json
from trayapp.core.text import format_snapshot, unseen_cuts_note
from trayapp.services.monitor import Monitor
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.http import make_client
from trayapp.sources.ollama_log import ENV_VAR
from trayapp.sources.servers.ollama import REMOTE_LOG_REASON, OllamaProbe

MODEL = "qwen3:30b"
PROFILE = HardwareProfile(ram_bandwidth_gbps=30.0)


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        fake.load(MODEL, context_length=4096)
        yield fake


def reading_of(probe: OllamaProbe) -> ServerReading:
    reading = probe.poll(time.monotonic())
    assert reading.status == "ok", reading.reason
    return reading


def snapshot_of(ollama: FakeOllama, ollama_log: str, inbox: RecordInbox | None = None) -> Snapshot:
    """Two ticks of the real monitor (the log reader starts at the first) watching the fake only."""
    monitor = Monitor(
        Settings(monitor=MonitorConfig(discover=False, ollama_log=ollama_log)),
        extra_endpoints=[EndpointConfig(url=ollama.url, kind="ollama")],
        discover=False,
        record=False,
        measure_ram=False,
        profile=PROFILE,
        proxy_inbox=inbox,
    )
    try:
        monitor.tick(budget_s=2.5)
        return monitor.tick(budget_s=2.5)
    finally:
        monitor.close()


def the_model(snapshot: Snapshot) -> ModelStatus:
    ((model,),) = [s.models for s in snapshot.servers]
    return model


def json_model(snapshot: Snapshot) -> dict[str, Any]:
    ((model,),) = [s["models"] for s in snapshot_json(snapshot)["servers"]]
    assert isinstance(model, dict)
    return model


def test_an_unreadable_log_without_a_proxy_says_what_goes_unseen(ollama: FakeOllama, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "server.log"
    snapshot = snapshot_of(ollama, str(missing))
    reason = f"Ollama's log {missing} does not exist"
    note = (
        "prompts over 2,050 tokens are cut silently (num_ctx 4096); "
        f"llm-tray sees cuts through its proxy or Ollama's log ({reason})"
    )
    model = the_model(snapshot)
    assert model.unseen_cuts_reason == reason
    assert unseen_cuts_note(snapshot.servers[0], model) == note
    # status: once, under the model's line; no alert (no cut was seen)
    text = format_snapshot(snapshot)
    assert text.count(note) == 1 and f"      note: {note}" in text.splitlines()
    assert snapshot.alerts == ()
    # status --json, and back from a remote machine's document
    doc = json_model(snapshot)
    assert (doc["unseen_cuts_reason"], doc["unseen_cuts_note"]) == (reason, note)
    (server_doc,) = snapshot_json(snapshot)["servers"]
    remote = server_from_json(server_doc)
    assert remote.models[0].unseen_cuts_reason == reason
    assert unseen_cuts_note(remote, remote.models[0]) == note


def test_reading_the_log_off_is_the_reason(ollama: FakeOllama) -> None:
    doc = json_model(snapshot_of(ollama, "off"))
    assert doc["unseen_cuts_reason"] == "reading Ollama's log is off"
    assert doc["unseen_cuts_note"].endswith("through its proxy or Ollama's log (reading Ollama's log is off)")


def test_a_readable_log_is_no_note(ollama: FakeOllama, tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    log_path.write_text("")
    snapshot = snapshot_of(ollama, str(log_path))
    assert the_model(snapshot).unseen_cuts_reason is None
    doc = json_model(snapshot)
    assert (doc["unseen_cuts_reason"], doc["unseen_cuts_note"]) == (None, None)
    assert "note:" not in format_snapshot(snapshot)


def test_a_proxy_in_front_is_no_note(ollama: FakeOllama, tmp_path: Path) -> None:
    """The probe still says the log cannot be read; the proxy sees the cuts, so the model has no note."""
    missing = str(tmp_path / "nowhere.log")
    probe = OllamaProbe(ollama.url, find_children=lambda: [], ollama_log=missing)
    try:
        (read,) = reading_of(probe).models
        assert read.unseen_cuts_reason is not None and "does not exist" in read.unseen_cuts_reason
    finally:
        probe.close()
    inbox = RecordInbox([ollama.url])
    with running_proxy(ollama.url, "ollama", inbox=inbox):
        snapshot = snapshot_of(ollama, missing, inbox)
    assert the_model(snapshot).unseen_cuts_reason is None
    assert json_model(snapshot)["unseen_cuts_note"] is None
    assert "note:" not in format_snapshot(snapshot)


def test_an_ollama_on_another_machine(ollama: FakeOllama) -> None:
    client = make_client(ollama.url)
    remote = OllamaProbe("http://192.0.2.10:11434", client=client, find_children=lambda: [])
    try:
        (model,) = reading_of(remote).models
    finally:
        remote.close()
        client.close()
    assert model.unseen_cuts_reason == REMOTE_LOG_REASON
    assert REMOTE_LOG_REASON == "Ollama runs on another machine, so its log is out of reach"


def test_the_size_is_what_that_version_keeps(ollama: FakeOllama) -> None:
    """Before v0.30 the runner kept num_ctx tokens; v0.30.0–v0.30.10 num_ctx − 1; v0.30.11+ about half."""
    snapshot = snapshot_of(ollama, "off")
    server, model = snapshot.servers[0], the_model(snapshot)
    for version, size in (("0.29.3", "4,096"), ("0.30.5", "4,095"), ("0.30.11", "2,050"), (None, "2,050")):
        note = unseen_cuts_note(replace(server, version=version), model)
        assert note is not None and note.startswith(
            f"prompts over {size} tokens are cut silently (num_ctx 4096)"
        )


def test_a_model_ollama_refuses_rather_than_cuts_has_no_note(ollama: FakeOllama) -> None:
    """deepseek2 runs without context shift: a too-long prompt gets HTTP 400, which the client sees."""
    ollama.load("deepseek-v2:16b", context_length=4096, details={"family": "deepseek2"})
    probe = OllamaProbe(ollama.url, find_children=lambda: [], ollama_log="off")
    try:
        models = {m.name: m for m in reading_of(probe).models}
    finally:
        probe.close()
    assert models["deepseek-v2:16b"].unseen_cuts_reason is None
    assert models[MODEL].unseen_cuts_reason == "reading Ollama's log is off"


def test_a_bug_reading_the_log_is_the_reason(ollama: FakeOllama) -> None:
    class Broken:
        reason: str | None = None
        where = "nowhere"

        def poll(self) -> list[Any]:
            raise KeyError("log-reader bug")

    probe = OllamaProbe(ollama.url, find_children=lambda: [], log_reader=lambda: Broken())  # type: ignore[arg-type,return-value]
    try:
        (model,) = reading_of(probe).models
    finally:
        probe.close()
    assert model.unseen_cuts_reason is not None and model.unseen_cuts_reason.startswith("internal error")
