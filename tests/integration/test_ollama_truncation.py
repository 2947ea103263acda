"""Silent prompt truncation (#20): the Ollama probe reads the warnings a (fake) Ollama writes to its log.

The fake (tests/support/fake_servers.py `FakeOllama`) cuts prompts as ollama/ollama v0.30.11+ does
and appends its `truncating input prompt` line to a real log file in the test's tmp dir; the fake's
tokenizer is one token per word, so every count below is worked by hand from Ollama's rules:
a prompt longer than num_ctx-1 tokens keeps `keep` = num_keep (4, +1 BOS) plus its tail, to
`limit` = num_ctx - max((num_ctx - keep) // 2, 1) tokens, which is what `prompt_eval_count` reports;
`/v1/chat/completions` cannot ask for a num_ctx, so the model runs at Ollama's default (4096 here).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.paths import FIXTURES_DIR
from trayapp.config.settings import EndpointConfig, MonitorConfig, Settings
from trayapp.core.model import FinishedRequest, ServerReading
from trayapp.services.monitor import Monitor
from trayapp.sources.discovery import make_probe
from trayapp.sources.http import make_client
from trayapp.sources.ollama_log import ENV_VAR
from trayapp.sources.servers.ollama import OllamaProbe

WAIT_S = 10.0


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """Ollama's log, with history written before the probe starts (the fixture's six warnings)."""
    path = tmp_path / "server.log"
    shutil.copyfile(FIXTURES_DIR / "ollama" / "server_log_truncation.log", path)
    return path


@pytest.fixture
def ollama(log_path: Path) -> Iterator[FakeOllama]:
    with FakeOllama(log_path=log_path) as fake:
        yield fake


@pytest.fixture
def probe(ollama: FakeOllama, log_path: Path) -> Iterator[OllamaProbe]:
    probe = OllamaProbe(ollama.url, find_children=lambda: [], ollama_log=str(log_path))
    yield probe
    probe.close()


def words(n: int) -> str:
    return " ".join(["lorem"] * n)


def post(fake: FakeOllama, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(fake.url + path, json=body, timeout=WAIT_S)


def records(probe: OllamaProbe) -> tuple[FinishedRequest, ...]:
    """The next poll that reports finished requests (polling until one does)."""

    def step() -> tuple[FinishedRequest, ...]:
        reading = probe.poll(time.monotonic())
        assert reading.status == "ok", reading.reason
        return reading.finished

    found: tuple[FinishedRequest, ...] = wait_until(step, WAIT_S)
    return found


def test_a_too_long_api_chat_prompt_is_reported_with_its_sizes(
    ollama: FakeOllama, probe: OllamaProbe
) -> None:
    ollama.load("qwen3:30b")  # at 32768; qwen3 adds no BOS token
    assert probe.poll(0.0).finished == ()  # starts at the log's end: the history is not reported
    assert probe.log_where is not None and probe.log_where.endswith("server.log") and probe.log_reason is None

    before = time.time()
    answer = post(
        ollama,
        "/api/chat",
        {
            "model": "qwen3:30b",
            "messages": [{"role": "user", "content": words(6000)}],
            "options": {"num_ctx": 4096},
            "stream": False,
        },
    )
    after = time.time()
    # HTTP 200 and no word of the cut: 4 + the last 2046 of 6000 tokens (4096 - 4092 // 2 = 2050)
    assert answer.status_code == 200
    assert answer.json()["prompt_eval_count"] == 2050 and answer.json()["done_reason"] == "stop"

    (record,) = records(probe)
    assert record.model == "qwen3:30b"
    assert record.source == "ollama-log"
    assert record.prompt_tokens_sent == 6000 and record.prompt_sent_exact is True
    assert record.prompt_tokens == 2050  # what the model read, = prompt_eval_count
    assert record.context_limit_tokens == 4096  # the reload at num_ctx 4096, as /api/ps now says
    assert before - 0.002 <= record.finished_wall_s <= after + 0.002  # the line's time (ms)
    assert probe.poll(1.0).finished == ()  # reported once


def test_the_openai_endpoint_ignores_num_ctx(ollama: FakeOllama, probe: OllamaProbe) -> None:
    ollama.load("qwen3:30b")
    probe.poll(0.0)
    messages = [{"role": "system", "content": words(10)}, {"role": "user", "content": words(5000)}]

    # Native: num_ctx 32768 is honoured, 5010 tokens fit, nothing is cut.
    native = post(
        ollama,
        "/api/chat",
        {"model": "qwen3:30b", "messages": messages, "options": {"num_ctx": 32768}, "stream": False},
    )
    assert native.json()["prompt_eval_count"] == 5010

    # OpenAI-compatible: the same ask, every way a client tries it, is dropped; the model reloads at the
    # default 4096 and the prompt is cut to 2050 (HTTP 200, usage says 2050).
    openai = post(
        ollama,
        "/v1/chat/completions",
        {"model": "qwen3:30b", "messages": messages, "options": {"num_ctx": 32768}, "num_ctx": 32768},
    )
    assert openai.status_code == 200
    assert openai.json()["usage"]["prompt_tokens"] == 2050
    assert openai.json()["choices"][0]["finish_reason"] == "stop"

    (record,) = records(probe)
    assert (record.model, record.context_limit_tokens) == ("qwen3:30b", 4096)
    assert (record.prompt_tokens_sent, record.prompt_tokens) == (5010, 2050)


def test_the_model_is_the_one_whose_context_fits(ollama: FakeOllama, probe: OllamaProbe) -> None:
    ollama.load("qwen3:30b")  # 32768
    ollama.load("llama3.1:8b")  # 8192
    ollama.shows["llama3.1:8b"]["model_info"]["tokenizer.ggml.add_bos_token"] = True
    probe.poll(0.0)
    answer = post(
        ollama,
        "/api/generate",
        {"model": "llama3.1:8b", "prompt": words(9000), "options": {"num_ctx": 8192}, "stream": False},
    )
    # 9000 words + BOS = 9001 tokens; keep 4 + BOS = 5; 8192 - 8187 // 2 = 4099
    assert answer.json()["prompt_eval_count"] == 4099

    (record,) = records(probe)
    # 4099 stands for num_ctx 8193 or 8192 (both cut to 4099 with keep 5): llama3.1's 8192, not qwen3's
    assert (record.model, record.context_limit_tokens) == ("llama3.1:8b", 8192)
    assert (record.prompt_tokens_sent, record.prompt_tokens) == (9001, 4099)


def test_streamed_answers_and_a_length_stop(ollama: FakeOllama, probe: OllamaProbe) -> None:
    ollama.load("qwen3:30b")
    probe.poll(0.0)
    streamed = post(
        ollama,
        "/api/chat",
        {
            "model": "qwen3:30b",
            "messages": [{"role": "user", "content": words(4096)}],
            "options": {"num_ctx": 4096, "num_predict": 3},
        },
    )
    lines = [line for line in streamed.text.splitlines() if line]
    assert len(lines) == 4  # three tokens, then the final object
    final = json.loads(lines[-1])
    # 4096 tokens > 4095: cut to 2050; num_predict 3 < 8 answer tokens: "length"
    assert (final["prompt_eval_count"], final["eval_count"], final["done_reason"]) == (2050, 3, "length")
    (record,) = records(probe)
    assert (record.prompt_tokens_sent, record.prompt_tokens) == (4096, 2050)


def test_a_chat_that_fits_once_old_messages_are_left_out_leaves_no_trace(
    ollama: FakeOllama, probe: OllamaProbe, log_path: Path
) -> None:
    """Ollama drops whole older messages first (server/prompt.go chatPrompt) and logs that at DEBUG only:
    the log cannot show it, so neither can the probe (only a proxy counting the prompt can)."""
    ollama.load("qwen3:30b")
    probe.poll(0.0)
    size = log_path.stat().st_size
    messages = [
        {"role": "system", "content": words(10)},
        {"role": "user", "content": words(3000)},
        {"role": "assistant", "content": words(3000)},
        {"role": "user", "content": words(100)},
    ]
    answer = post(
        ollama,
        "/api/chat",
        {"model": "qwen3:30b", "messages": messages, "options": {"num_ctx": 4096}, "stream": False},
    )
    # 6110 > 4096; without the first user message: 10 + 3000 + 100 = 3110 fits (and 3110 <= 4095: no cut)
    assert answer.json()["prompt_eval_count"] == 3110
    wait_until(lambda: log_path.stat().st_size > size, WAIT_S)  # the request's [GIN] line is there
    assert probe.poll(1.0).finished == ()


def test_context_shift_off_is_refused_not_cut(ollama: FakeOllama, probe: OllamaProbe, log_path: Path) -> None:
    ollama.load("qwen3:30b")
    probe.poll(0.0)
    size = log_path.stat().st_size
    answer = post(
        ollama,
        "/api/generate",
        {
            "model": "qwen3:30b",
            "prompt": words(5000),
            "options": {"num_ctx": 4096},
            "shift": False,
            "stream": False,
        },
    )
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(
        "the prompt is longer than the context length currently available"
    )
    with open(log_path, "rb") as f:
        f.seek(size)
        assert b"truncating input prompt" not in f.read()
    assert probe.poll(1.0).finished == ()


def test_off_reads_nothing(ollama: FakeOllama, log_path: Path) -> None:
    probe = OllamaProbe(ollama.url, find_children=lambda: [], ollama_log="off")
    try:
        ollama.load("qwen3:30b")
        probe.poll(0.0)
        post(ollama, "/api/generate", {"model": "qwen3:30b", "prompt": words(5000), "stream": False})
        assert probe.poll(1.0).finished == ()
        assert probe.log_reason == "reading Ollama's log is off"
    finally:
        probe.close()


def test_a_server_on_another_machine_gets_no_log_reader(ollama: FakeOllama) -> None:
    def no_reader() -> Any:
        raise AssertionError("a log reader for a remote Ollama")

    client = make_client(ollama.url)
    remote = OllamaProbe(
        "http://192.0.2.10:11434", client=client, find_children=lambda: [], log_reader=no_reader
    )
    try:
        reading: ServerReading = remote.poll(0.0)
        assert reading.status == "ok" and reading.finished == ()
        assert remote.log_where is None and remote.log_reason is None
    finally:
        remote.close()
        client.close()


def test_a_missing_log_says_so_and_costs_one_stat(ollama: FakeOllama, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "server.log"
    probe = OllamaProbe(ollama.url, find_children=lambda: [], ollama_log=str(missing))
    try:
        assert probe.poll(0.0).finished == ()
        assert probe.log_reason == f"Ollama's log {missing} does not exist"
    finally:
        probe.close()


def test_the_monitor_passes_the_setting_to_ollama_probes(ollama: FakeOllama, log_path: Path) -> None:
    made = make_probe("ollama", ollama.url, ollama_log="off")
    assert isinstance(made, OllamaProbe)
    made.close()
    settings = Settings(monitor=MonitorConfig(discover=False, ollama_log=str(log_path)))
    monitor = Monitor(
        settings,
        extra_endpoints=[EndpointConfig(url=ollama.url, kind="ollama")],
        discover=False,
        record=False,
        measure_ram=False,
    )
    try:
        ollama.load("qwen3:30b")
        monitor.tick(budget_s=2.5)  # the reader starts at the log's end
        post(
            ollama,
            "/api/chat",
            {
                "model": "qwen3:30b",
                "messages": [{"role": "user", "content": words(6000)}],
                "options": {"num_ctx": 4096},
                "stream": False,
            },
        )

        def truncated() -> Any:
            found = [r for r in monitor.tick(budget_s=2.5).requests if r.source == "ollama-log"]
            return found or None

        (request,) = wait_until(truncated, WAIT_S)
        assert (request.model, request.server_kind, request.server) == ("qwen3:30b", "ollama", ollama.url)
        assert (request.prompt_tokens_sent, request.prompt_tokens, request.context_limit_tokens) == (
            6000,
            2050,
            4096,
        )
        assert request.prompt_sent_exact is True
    finally:
        monitor.close()


def test_a_bug_reading_the_log_costs_only_the_log(
    ollama: FakeOllama, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        reason: str | None = None
        where = "nowhere"

        def poll(self) -> list[Any]:
            raise KeyError("log-reader bug")

    probe = OllamaProbe(ollama.url, find_children=lambda: [], log_reader=lambda: Broken())  # type: ignore[arg-type,return-value]
    try:
        readings = [probe.poll(time.monotonic()) for _ in range(3)]
    finally:
        probe.close()
    assert all(r.status == "ok" for r in readings), readings[-1].reason
    assert all(r.finished == () for r in readings)
    assert sum("reading its log" in r.getMessage() for r in caplog.records) == 1  # logged once
