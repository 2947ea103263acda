"""`llm-tray bench` against fake Ollama and LM Studio servers (no binary of either can run here) (#13).

One loopback server per fake: its generation routes are `FakeStreamingUpstream`'s (token by token,
each server's framing and final statistics), and its monitoring routes (`/api/version`, `/api/ps`,
`/api/show`; `/api/v1/models`, `/api/v0/models`) are answered by `FakeOllama` / `FakeLmStudio`, so
bench finds the server and model exactly as `status` does. Expected numbers are the streaming fake's
hand arithmetic (see its docstring): 20 tokens 0.02 s apart after a 0.2 s prefill of 26 prompt tokens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.cli import run_cli
from tests.support.fake_servers import FakeHttpServer, FakeLmStudio, FakeOllama
from tests.support.fake_streaming import FakeStreamingUpstream

MONITORING_POSTS = frozenset({"/api/show"})  # Ollama's model details: a POST, but not a generation


@dataclass
class FakeServerWithModels(FakeStreamingUpstream):
    """The streaming fake, with its monitoring routes answered by a fixture-shaped fake."""

    meta: FakeHttpServer | None = None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        path = urlsplit(handler.path).path
        if self.meta is None or (handler.command == "POST" and path not in MONITORING_POSTS):
            super()._serve(handler)
            return
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        body = json.loads(raw) if raw else None
        status, payload = self.meta.route(handler.command, path, body, dict(handler.headers.items()))
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def ollama() -> Iterator[FakeServerWithModels]:
    meta = FakeOllama()
    meta.load("qwen3:30b")
    try:
        with FakeServerWithModels("ollama", meta=meta) as fake:
            yield fake
    finally:
        meta.close()


@pytest.fixture
def lmstudio() -> Iterator[FakeServerWithModels]:
    meta = FakeLmStudio()
    meta.load("qwen/qwen3-30b-a3b", context_length=16384)
    try:
        with FakeServerWithModels("lmstudio", meta=meta) as fake:
            yield fake
    finally:
        meta.close()


def bench_args(kind: str, url: str, *more: str) -> list[str]:
    return ["bench", "--endpoint", f"{kind}={url}", "--no-discover", "--tokens", "20", "--depths", "0", *more]


def bench_json(kind: str, url: str, *more: str) -> dict[str, Any]:
    result = run_cli(*bench_args(kind, url, "--runs", "2", "--warmup", "1", "--json", *more), timeout_s=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def generations(fake: FakeStreamingUpstream, path: str) -> list[dict[str, Any]]:
    return [json.loads(c.request_body) for c in fake.captures if c.path == path]


def test_ollama_ns_durations_and_the_cached_prompt_caveat(ollama: FakeServerWithModels) -> None:
    data = bench_json("ollama", ollama.url)
    assert data["server"]["kind"] == "ollama" and data["server"]["version"] == "0.32.15"
    assert data["model"] == "qwen3:30b"
    runs = data["runs"]
    assert [(r["kind"], r["warmup"]) for r in runs] == [
        ("decode", True), ("decode", False), ("decode", False),
        ("prompt", True), ("prompt", False), ("prompt", False),
    ]  # fmt: skip
    for r in runs:
        # eval_count 20 over eval_duration 20 × 0.02 s = 400,000,000 ns: 50 tok/s, from the nanoseconds
        assert r["server_decode_tok_s"] == pytest.approx(50.0, abs=0.001)
        assert r["decode_tokens"] == 20 and r["decode_exact"] is True
        # Ollama's count includes cached tokens and says nothing of them: 26 / 0.2 s is an upper bound
        assert r["prompt_tokens"] == 26 and r["cached_tokens"] is None
        assert r["prompt_tok_s"] == pytest.approx(130.0, abs=0.001) and r["prompt_rate_upper_bound"] is True
        assert r["ttft_s"] >= 0.2  # bench's own clock: the 0.2 s prefill comes first
    assert data["decode_tok_s"] == pytest.approx(50.0, abs=0.001)
    assert data["decode_spread"] == {"tok_s": 0.0, "cv": 0.0}
    assert data["prompt_tok_s"] == pytest.approx(130.0, abs=0.001) and data["prompt_rate_upper_bound"] is True
    decode = [r for r in runs if r["kind"] == "decode"]
    for r in decode:  # 19 gaps of 0.02 s between the 20 tokens: ~50 tok/s on bench's clock
        assert r["streamed_tokens"] == 20
        assert r["stream_decode_tok_s"] == pytest.approx(50.0, rel=0.2)

    bodies = generations(ollama, "/api/generate")
    assert len(bodies) == 6
    assert all(b["stream"] is True and b["model"] == "qwen3:30b" for b in bodies)
    assert [b["options"]["num_predict"] for b in bodies] == [20, 20, 20, 2, 2, 2]
    assert len({b["prompt"] for b in bodies}) == 6, "prompts repeat: a prefix cache could serve them"
    assert len({b["prompt"][:24] for b in bodies}) == 6, "the unique part must come first"


def test_ollama_text_output_names_the_upper_bound(ollama: FakeServerWithModels) -> None:
    result = run_cli(*bench_args("ollama", ollama.url, "--runs", "1", "--warmup", "0"), timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert "qwen3:30b" in result.stdout and "Ollama 0.32.15" in result.stdout
    assert "decode     50 tok/s (median of 1, server timings" in result.stdout
    assert "upper bound: the server counts cached tokens" in result.stdout
    assert "Zanzibar" not in result.stdout + result.stderr  # no generated text, ever


def test_lmstudio_stats_parsed(lmstudio: FakeServerWithModels) -> None:
    data = bench_json("lmstudio", lmstudio.url)
    assert data["server"]["kind"] == "lmstudio"
    runs = data["runs"]
    assert len(runs) == 6
    for r in runs:
        # stats.tokens_per_second = 20 tokens / generation_time 0.4 s
        assert r["server_decode_tok_s"] == pytest.approx(50.0, abs=0.001)
        assert r["decode_tokens"] == 20 and r["prompt_tokens"] == 26
        # no prompt time in the stats: 26 tokens over bench's own TTFT (≥ the 0.2 s prefill)
        assert 26 / 0.5 < r["prompt_tok_s"] <= 130.0
    assert data["decode_tok_s"] == pytest.approx(50.0, abs=0.001) and data["decode_exact"] is True
    bodies = generations(lmstudio, "/api/v0/chat/completions")
    assert len(bodies) == 6 and all(b["stream"] is True for b in bodies)
    assert [b["max_tokens"] for b in bodies] == [20, 20, 20, 2, 2, 2]
    assert len({b["messages"][0]["content"] for b in bodies}) == 6


def test_unknown_model_is_a_clear_error(ollama: FakeServerWithModels) -> None:
    result = run_cli(*bench_args("ollama", ollama.url, "--model", "llama9:400b"), timeout_s=60)
    assert result.returncode == 1
    assert "unknown model 'llama9:400b' (the server lists: qwen3:30b)" in result.stderr
    assert not generations(ollama, "/api/generate")


def test_no_model_loaded_is_a_clear_error(ollama: FakeServerWithModels) -> None:
    assert isinstance(ollama.meta, FakeOllama)
    ollama.meta.unload("qwen3:30b")
    result = run_cli(*bench_args("ollama", ollama.url), timeout_s=60)
    assert result.returncode == 1
    assert "no model loaded on" in result.stderr


def test_ctrl_c_stops_cleanly_and_keeps_finished_runs(ollama: FakeServerWithModels) -> None:
    ollama.token_delay_s = 0.05  # 1 s a run: time to interrupt mid-bench
    command = [sys.executable, "-m", "trayapp", *bench_args("ollama", ollama.url, "--runs", "5", "--json")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        # A fourth request begun: bench has recorded the third run (2 warm-ups + 1 measured) by then.
        while sum(c.path == "/api/generate" for c in ollama.captures) < 4:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "bench never began its fourth run"
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    data = json.loads(out)
    assert data["interrupted"] is True
    measured = [r for r in data["runs"] if not r["warmup"]]
    assert len(measured) >= 1 and data["runs"][0]["warmup"] is True
    assert data["decode_tok_s"] == pytest.approx(20 / (20 * 0.05), abs=0.001)  # 20 tokens over 1 s
    assert len(data["runs"]) < 2 + 5 + 1 + 5  # stopped before the end
