"""LmStudioProbe against a fake LM Studio 0.4.x (REST v1 + v0) and a fake `lms` CLI on PATH.

The fakes (tests/support/fake_servers.py) follow fixtures/lmstudio: REST per
lmstudio-ai/docs, `lms ps --json` and `lms log stream --json` per lmstudio-ai/lms
and lmstudio-js `DiagnosticsLogEvent` / `LLMPredictionStats`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.fake_servers import FakeLms, FakeLmStudio, fixture_json, fixture_text, wait_until
from trayapp.core.model import FinishedRequest, ServerReading
from trayapp.sources.http import make_client
from trayapp.sources.servers.lmstudio import LMS_REASON, NO_LMS_REASON, LmStudioProbe

LOG_LINES = fixture_text("lmstudio/lms_log_stream.ndjson").splitlines()
PROMPT_TEXT = json.loads(LOG_LINES[0])["data"]["input"]
COMPLETION_TEXT = json.loads(LOG_LINES[1])["data"]["output"]


def output_line(timestamp_ms: int, predicted: int) -> str:
    event = json.loads(LOG_LINES[1])
    event["timestamp"] = timestamp_ms
    event["data"]["stats"]["predictedTokensCount"] = predicted
    return json.dumps(event)


@pytest.fixture
def lmstudio() -> Iterator[FakeLmStudio]:
    with FakeLmStudio() as fake:
        yield fake


@pytest.fixture
def fake_lms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeLms:
    lms = FakeLms(tmp_path)
    monkeypatch.setenv("PATH", f"{lms.bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lms


def collect_finished(probe: LmStudioProbe, want: int, timeout_s: float = 15.0) -> list[FinishedRequest]:
    got: list[FinishedRequest] = []
    clock = [100.0]

    def enough() -> bool:
        clock[0] += 1
        got.extend(probe.poll(clock[0]).finished)
        return len(got) >= want

    wait_until(enough, timeout_s=timeout_s, interval_s=0.05)
    return got


def test_models_follow_loads_and_unloads_without_lms(
    lmstudio: FakeLmStudio, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `lms` anywhere
    monkeypatch.setenv("HOME", str(tmp_path))
    probe = LmStudioProbe(lmstudio.url)
    try:
        assert probe.lms is None
        reading = probe.poll(0.0)
        assert reading.status == "ok"
        [qwen] = reading.models
        assert qwen.name == "qwen/qwen3-30b-a3b"
        assert qwen.context_length == 16384
        assert qwen.live_rate_reason == NO_LMS_REASON
        assert qwen.facts is not None and qwen.facts.active_parameter_count == 3_000_000_000
        assert reading.finished == ()

        lmstudio.load("meta-llama-3.1-8b-instruct", context_length=8192)
        names = {m.name: m.context_length for m in probe.poll(1.0).models}
        assert names == {"qwen/qwen3-30b-a3b": 16384, "meta-llama-3.1-8b-instruct": 8192}

        lmstudio.load("qwen/qwen3-30b-a3b", context_length=32768)  # reloaded with a larger context
        lmstudio.unload("meta-llama-3.1-8b-instruct")
        [qwen] = probe.poll(2.0).models
        assert qwen.context_length == 32768

        lmstudio.unload("qwen/qwen3-30b-a3b")
        assert probe.poll(3.0).models == ()
    finally:
        probe.close()


def test_falls_back_to_v0_on_older_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with FakeLmStudio(v1=False) as old:
        probe = LmStudioProbe(old.url)
        try:
            [qwen] = probe.poll(0.0).models
            assert qwen.name == "qwen3-30b-a3b"  # v0's id: no publisher prefix
            assert qwen.context_length == 16384
            probe.poll(1.0)
            assert old.count("GET", "/api/v1/models") == 1  # not asked again once v0 is known
            assert old.count("GET", "/api/v0/models") == 2
        finally:
            probe.close()


def test_fake_v0_list_is_the_fixture() -> None:
    """The fake's v0 LLM entries, derived from its v1 models, are those of api_v0_models.json."""
    want = {e["id"]: e for e in fixture_json("lmstudio/api_v0_models.json")["data"]}
    with FakeLmStudio(v1=False) as old, make_client(old.url) as client:
        got = [e for e in client.get(old.url + "/api/v0/models").json()["data"] if e["type"] == "llm"]
    assert {e["id"] for e in got} == {"qwen3-30b-a3b", "meta-llama-3.1-8b-instruct"}
    for entry in got:
        assert entry == want[entry["id"]]


def test_v0_models_merge_with_lms_ps(fake_lms: FakeLms) -> None:
    """A pre-0.4 build (REST v0) with `lms`: `lms ps` still says which model is busy and where its file is."""
    fake_lms.set_ps(fixture_json("lmstudio/lms_ps.json"))  # qwen/qwen3-30b-a3b is generating
    with FakeLmStudio(v1=False) as old:
        probe = LmStudioProbe(old.url, ps_interval_s=0.05)
        try:
            probe.poll(0.0)  # starts the `lms` readers
            wait_until(lambda: probe.lms is not None and probe.lms.latest_ps(), timeout_s=10)
            [qwen] = probe.poll(1.0).models
            assert qwen.name == "qwen3-30b-a3b"
            assert qwen.busy is True
            assert qwen.model_path == "qwen/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"
        finally:
            probe.close()


def test_api_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with FakeLmStudio(api_key="sk-lm-secret") as locked:
        without = LmStudioProbe(locked.url)
        with_key = LmStudioProbe(locked.url, api_key="sk-lm-secret")
        try:
            denied = without.poll(0.0)
            assert denied.status == "unauthorized"
            assert "sk-lm-secret" not in repr(denied)
            assert with_key.poll(0.0).status == "ok"
        finally:
            without.close()
            with_key.close()


def test_lms_log_stream_records_arrive_and_text_is_dropped(lmstudio: FakeLmStudio, fake_lms: FakeLms) -> None:
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.2)
    try:
        assert probe.lms is not None and probe.lms.lms_path == str(fake_lms.path)
        first = probe.poll(0.0)
        assert first.status == "ok"
        assert first.models[0].live_rate_reason == LMS_REASON

        fake_lms.emit(*LOG_LINES)  # an input event (prompt) and an output event (completion + stats)
        [record] = collect_finished(probe, 1)
        assert record.model == "qwen/qwen3-30b-a3b"
        assert record.decode_tokens == 241
        assert record.decode_tok_s == pytest.approx(71.342, abs=1e-3)
        assert record.ttft_s == pytest.approx(0.184)
        assert record.draft_tokens == 228 and record.draft_accepted == 157
        assert record.source == "lms-log"

        [call] = fake_lms.stream_calls()
        assert call["args"] == ["log", "stream", "--source", "model", "--filter", "output", "--json"]

        everything = repr(record) + repr(vars(probe)) + repr(vars(probe.lms))
        assert PROMPT_TEXT not in everything and "Why is the sky blue" not in everything
        assert COMPLETION_TEXT not in everything and "skylight" not in everything
    finally:
        probe.close()


def test_lms_stream_restarts_and_stops_on_close(lmstudio: FakeLmStudio, fake_lms: FakeLms) -> None:
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.2, lms_backoff_s=0.05)
    try:
        probe.poll(0.0)
        fake_lms.emit(output_line(1790771900000, 10))
        assert [r.decode_tokens for r in collect_finished(probe, 1)] == [10]

        fake_lms.exit_stream()  # `lms` dies (LM Studio quit, update, ...)
        wait_until(lambda: len(fake_lms.stream_calls()) >= 2, timeout_s=10)
        fake_lms.emit(output_line(1790771901000, 20), output_line(1790771902000, 30))
        records = collect_finished(probe, 2)
        assert [r.decode_tokens for r in records] == [20, 30]
        assert [r.finished_wall_s for r in records] == [1790771901.0, 1790771902.0]
        assert probe.lms is not None and probe.lms.stream_starts >= 2
        pid = wait_until(lambda: probe.lms.stream_pid if probe.lms else None, timeout_s=10)
    finally:
        probe.close()
    assert not psutil.pid_exists(pid)  # close() ended (and reaped) the reader


def test_lms_ps_marks_busy_models(lmstudio: FakeLmStudio, fake_lms: FakeLms) -> None:
    ps = fixture_json("lmstudio/lms_ps.json")
    fake_lms.set_ps(ps)
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.1)
    try:
        clock = [0.0]

        def busy_state() -> bool | None:
            clock[0] += 1.0
            [qwen] = probe.poll(clock[0]).models
            return qwen.busy

        assert wait_until(lambda: busy_state() is True, timeout_s=10)
        [qwen] = probe.poll(clock[0]).models
        assert qwen.model_path == "qwen/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"

        ps[0]["status"] = "idle"
        fake_lms.set_ps(ps)
        assert wait_until(lambda: busy_state() is False, timeout_s=10) is True
        assert any(c["args"] == ["ps", "--json"] for c in fake_lms.calls())
    finally:
        probe.close()


def test_records_survive_a_rest_outage(lmstudio: FakeLmStudio, fake_lms: FakeLms) -> None:
    """LM Studio's REST port fails, but `lms` still reports a finished prediction: it is not lost."""
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.2)
    try:
        assert probe.poll(0.0).status == "ok"  # starts the `lms` readers
        lmstudio.overrides["/api/v1/models"] = (500, {"error": "internal"})
        fake_lms.emit(output_line(1790771903000, 42))
        got: list[ServerReading] = []

        def arrived() -> bool:
            got.append(probe.poll(1.0 + len(got)))
            return any(r.finished for r in got)

        wait_until(arrived, timeout_s=15, interval_s=0.05)
        assert got[-1].status == "error"
        assert [r.decode_tokens for r in got[-1].finished] == [42]
    finally:
        probe.close()


def test_lms_is_not_started_while_lm_studio_is_down(fake_lms: FakeLms) -> None:
    """`lms` can launch LM Studio: the probe never runs it while the server does not answer."""
    with FakeLmStudio() as fake:
        url = fake.url
    probe = LmStudioProbe(url, ps_interval_s=0.05)
    try:
        for t in range(5):
            assert probe.poll(float(t)).status == "unreachable"
        assert fake_lms.calls() == []
    finally:
        probe.close()


def test_the_selected_runtime_is_the_servers_build(lmstudio: FakeLmStudio, fake_lms: FakeLms) -> None:
    """#22: the engine LM Studio runs models with (`lms runtime ls`, the ✓ row) is the reading's
    version, kept with each session as its build; an `lms` without the command leaves it unknown."""
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.05)
    try:
        probe.poll(0.0)
        wait_until(lambda: probe.lms is not None and probe.lms.latest_ps() is not None, timeout_s=10)
        assert probe.poll(1.0).version is None
    finally:
        probe.close()
    fake_lms.set_runtime(fixture_text("lmstudio/lms_runtime_ls.txt"))
    probe = LmStudioProbe(lmstudio.url, ps_interval_s=0.05)
    try:
        probe.poll(0.0)
        wait_until(lambda: probe.lms is not None and probe.lms.latest_runtime(), timeout_s=10)
        assert probe.poll(1.0).version == "llama.cpp-linux-x86_64-avx2@1.52.0"
    finally:
        probe.close()
    assert any(c["args"] == ["runtime", "ls"] for c in fake_lms.calls())
