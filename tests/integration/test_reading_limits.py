"""Reading other processes within limits (#25, docs/security.md "Reading other processes").

Hostile answers from a fake remote agent and a fake llama-server on loopback: 400 MB from an agent,
a gzip bomb, 7 MB of tiny JSON objects, deeply nested JSON. Each is a clear status and reason
("larger than", "compressed", "answer too large", "answer too deeply nested"), never a traceback,
and the poll's memory stays far below what the answer would cost (tracemalloc's peak).
"""

from __future__ import annotations

import gzip
import logging
import time
import tracemalloc
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_http import FakeServer, Reply, file_reply, oversized
from tests.support.memory_keyring import MemoryKeyring
from trayapp.config.agents import AgentConfig
from trayapp.core.json_limits import MAX_JSON_DEPTH, MAX_JSON_VALUES, json_problem
from trayapp.sources.http import FetchError, load_json
from trayapp.sources.remote_agent import RemoteAgent
from trayapp.sources.servers.llamacpp import LlamaCppProbe

MB = 1024 * 1024
TINY_OBJECTS = b"[" + b"{}," * (7 * MB // 3) + b"{}]"  # 7 MB, ~2.4 million objects
DEEP = b"[" * 100_000 + b"]" * 100_000


def _peak_mb(action: Callable[[], Any]) -> tuple[Any, float]:
    tracemalloc.start()
    try:
        result = action()
        return result, tracemalloc.get_traced_memory()[1] / MB
    finally:
        tracemalloc.stop()


def _poll_agent(url: str) -> Any:
    agent = RemoteAgent(AgentConfig(url, "box"))
    try:
        return agent.poll()
    finally:
        agent.close()


def test_an_agent_answering_400_mb_is_refused_after_8_mib(memory_keyring: MemoryKeyring) -> None:
    with FakeServer({"/v1/snapshot": oversized(400 * MB)}) as fake:
        started = time.monotonic()
        result, peak_mb = _peak_mb(lambda: _poll_agent(fake.url))
    assert result.machine.status == "error"
    assert "larger than 8192 KiB" in (result.machine.reason or "")
    assert peak_mb < 40  # the body stops at the cap (8 MiB + a chunk), never 400 MB
    assert time.monotonic() - started < 10


def _gzip_bomb(body: bytes) -> Callable[[BaseHTTPRequestHandler, FakeServer], None]:
    def write(handler: BaseHTTPRequestHandler, server: FakeServer) -> None:
        _send_gzip(handler, body)

    return write


def _send_gzip(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Encoding", "gzip")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_compressed_answer_is_refused_unread(memory_keyring: MemoryKeyring) -> None:
    bomb = gzip.compress(b" " * (200 * MB), compresslevel=9)  # ~200 KB on the wire, 200 MB inflated
    with FakeServer({"/v1/snapshot": _gzip_bomb(bomb)}) as fake:
        result, peak_mb = _peak_mb(lambda: _poll_agent(fake.url))
        (_, _, headers) = fake.requests[0]
    assert {k.lower(): v for k, v in headers.items()}["accept-encoding"] == "identity"
    assert result.machine.status == "error"
    assert "compressed answer (gzip)" in (result.machine.reason or "")
    assert peak_mb < 20


@pytest.mark.parametrize(
    ("body", "words"),
    [(TINY_OBJECTS, "answer too large"), (DEEP, "answer too deeply nested")],
    ids=["7MB-of-tiny-objects", "nested-100000-deep"],
)
def test_an_agent_answering_hostile_json_is_an_error_not_a_traceback(
    memory_keyring: MemoryKeyring, caplog: pytest.LogCaptureFixture, body: bytes, words: str
) -> None:
    with FakeServer({"/v1/snapshot": Reply(200, body)}) as fake, caplog.at_level(logging.WARNING):
        result, peak_mb = _peak_mb(lambda: _poll_agent(fake.url))
    assert result.machine.status == "error"
    assert words in (result.machine.reason or "")
    assert "internal error" not in (result.machine.reason or "")
    assert not [r for r in caplog.records if r.exc_info]  # no traceback logged
    assert peak_mb < 60  # json.loads of the 7 MB would take ~200 MB


@pytest.mark.parametrize(
    ("body", "words"),
    [(TINY_OBJECTS, "answer too large"), (DEEP, "answer too deeply nested")],
    ids=["7MB-of-tiny-objects", "nested-100000-deep"],
)
def test_a_polled_server_answering_hostile_json_every_poll(
    fixtures_dir: Path, caplog: pytest.LogCaptureFixture, body: bytes, words: str
) -> None:
    captured = fixtures_dir / "llama-server" / "captured"
    routes = {
        "/health": file_reply(captured / "health.json"),
        "/props": Reply(200, body),
        "/slots": file_reply(captured / "slots_busy.json"),
        "/v1/models": file_reply(captured / "v1_models.json"),
    }
    with FakeServer(routes) as fake, caplog.at_level(logging.WARNING):
        probe = LlamaCppProbe(fake.url)
        try:
            for tick in range(3):
                reading, peak_mb = _peak_mb(lambda tick=tick: probe.poll(float(tick)))
                assert reading.status == "error"
                assert reading.reason is not None and words in reading.reason and "/props" in reading.reason
                assert peak_mb < 60
        finally:
            probe.close()
    assert not [r for r in caplog.records if r.exc_info]


def test_json_limits_on_the_text() -> None:
    assert json_problem('{"a": [1, {"b": "[[[[{{{{"}], "c": "\\"]]]"}') is None  # brackets in strings
    assert json_problem("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is None
    deeper = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert json_problem(deeper) == f"answer too deeply nested (JSON over {MAX_JSON_DEPTH} levels)"
    assert (
        json_problem("[" + "1," * MAX_JSON_VALUES + "1]")
        == f"answer too large (over {MAX_JSON_VALUES} JSON values)"
    )
    assert json_problem('["' + "x," * 1_000_000 + '"]') is None  # one string: one value
    with pytest.raises(FetchError, match="answer too deeply nested"):
        load_json(DEEP.decode())
    with pytest.raises(FetchError, match="invalid JSON"):
        load_json("[}")
    # linear: 8 MB of the worst shapes in well under a second each
    for text in ("[" * (4 * MB) + "]" * (4 * MB), "[" + "{}," * (3 * MB) + "{}]", '"' + "x" * (8 * MB) + '"'):
        started = time.perf_counter()
        json_problem(text)
        assert time.perf_counter() - started < 1.0
