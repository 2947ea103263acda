"""The fake streaming upstreams (tests/support/fake_streaming.py) are faithful: framing, defaults, faults.

Expected figures are hand arithmetic from the knobs; shapes are compared with tests/fixtures/.
Every wait is bounded (httpx timeouts, socket timeouts, Event.wait, asyncio.wait_for).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_streaming import Capture, FakeStreamingUpstream

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORDS = ("alpha", "bravo", "charlie")
TIMEOUT = httpx.Timeout(5.0)


def fast(kind: str = "ollama", **knobs: Any) -> FakeStreamingUpstream:
    defaults: dict[str, Any] = {"tokens": 5, "prefill_delay_s": 0.05, "token_delay_s": 0.01}
    return FakeStreamingUpstream(kind, text_words=WORDS, **(defaults | knobs))  # type: ignore[arg-type]


def stream(url: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[tuple[float, bytes]]]:
    """POST and collect the body as it arrives: (arrival time, bytes) per read."""
    pieces: list[tuple[float, bytes]] = []
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as response:
        for piece in response.iter_raw():
            pieces.append((time.monotonic(), piece))
        return response.headers, pieces


def dechunk(wire: bytes) -> list[bytes]:
    """The chunks of a complete chunked body (a second, independent parser)."""
    chunks: list[bytes] = []
    pos = 0
    while True:
        eol = wire.index(b"\r\n", pos)
        size = int(wire[pos:eol], 16)
        if size == 0:
            assert wire[eol:] == b"\r\n\r\n"
            return chunks
        chunks.append(wire[eol + 2 : eol + 2 + size])
        assert wire[eol + 2 + size : eol + 4 + size] == b"\r\n"
        pos = eol + 4 + size


def sse_events(body: bytes) -> list[str]:
    assert body.endswith(b"\n\n")
    events = body.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def only(up: FakeStreamingUpstream) -> Capture:
    return up.wait_for_captures(1, timeout_s=5.0)[0]


def test_ollama_chat_streams_ndjson_by_default_token_by_token() -> None:
    with fast(prompt_tokens=1416) as up:
        headers, pieces = stream(up.url + "/api/chat", {"model": "qwen3:30b", "messages": []})  # no `stream`
        cap = only(up)
    body = b"".join(p for _, p in pieces)
    assert headers["content-type"] == "application/x-ndjson"
    assert headers["transfer-encoding"] == "chunked"
    lines = body.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 5 + 1 + 1
    objs = [json.loads(line) for line in lines[:-1]]
    assert "".join(o["message"]["content"] for o in objs) == "alpha bravo charlie alpha bravo"
    assert [o["done"] for o in objs] == [False] * 5 + [True]
    final = objs[-1]
    fixture_final = json.loads((FIXTURES / "ollama" / "chat_stream.ndjson").read_text().splitlines()[-1])
    assert list(final) == list(fixture_final)
    # 0.05 s prefill, 5 tokens × 0.01 s, no load: in ns.
    assert final["prompt_eval_duration"] == 50_000_000
    assert final["eval_duration"] == 50_000_000
    assert final["load_duration"] == 0
    assert final["total_duration"] == 100_000_000
    assert (final["eval_count"], final["prompt_eval_count"]) == (5, 1416)
    # Token by token: one chunk per line, spread over the 5 × 0.01 s of decoding.
    assert cap.payload_writes == [line + b"\n" for line in lines[:-1]]
    assert pieces[-1][0] - pieces[0][0] >= 0.04
    # line i (the final one is the sixth) leaves no earlier than i × 0.01 s after pacing starts; on a busy
    # host any write can be late, so the span between two writes alone proves nothing (46.8 ms seen)
    paced_from = cap.tokens_paced_from
    assert len(cap.write_times) == 6 and paced_from is not None
    assert all(at - paced_from >= i * 0.01 for i, at in enumerate(cap.write_times)), cap.write_times
    assert cap.first_token_at is not None and cap.first_token_at - cap.started_at >= 0.05
    # The capture is what httpx received, and its wire bytes are the chunks as framed.
    assert cap.response_body == body
    assert dechunk(bytes(cap.response_body_wire)) == cap.payload_writes
    assert cap.completed and not cap.died and not cap.client_disconnected and cap.tokens_sent == 5


def test_ollama_stream_false_is_one_object_with_content_length() -> None:
    with fast(load_delay_s=0.02) as up:
        response = httpx.post(
            up.url + "/api/generate", json={"prompt": "x", "stream": False}, timeout=TIMEOUT
        )
        cap = only(up)
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert int(response.headers["content-length"]) == len(response.content)
    obj = response.json()
    assert list(obj) == list(json.loads((FIXTURES / "ollama" / "generate_final.json").read_text()))
    assert obj["response"] == "alpha bravo charlie alpha bravo" and obj["done"] is True
    assert len(obj["context"]) == 26 + 5
    assert obj["load_duration"] == 20_000_000 and obj["total_duration"] == 120_000_000
    assert cap.response_body == response.content and not cap.streamed


def test_raw_wire_bytes_equal_the_capture() -> None:
    with fast("vllm") as up, socket.create_connection(("127.0.0.1", int(up.url.rsplit(":", 1)[1]))) as sock:
        body = b'{"model":"m","stream":true}'
        sock.settimeout(5.0)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        received = b""
        while data := sock.recv(65536):
            received += data
        cap = only(up)
    assert received == cap.wire_bytes
    head, _, wire_body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\ntransfer-encoding: chunked" in head
    assert b"".join(dechunk(wire_body)) == cap.response_body
    assert cap.request_body == body and cap.method == "POST" and cap.path == "/v1/chat/completions"


@pytest.mark.parametrize("include_usage", [False, True])
def test_openai_sse_role_content_finish_usage_done(include_usage: bool) -> None:
    request: dict[str, Any] = {"model": "Qwen/Qwen3-8B", "messages": [], "stream": True}
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    with fast("vllm", prompt_tokens=1538, cached_prompt_tokens=1421) as up:
        headers, pieces = stream(up.url + "/v1/chat/completions", request)
        cap = only(up)
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["transfer-encoding"] == "chunked"
    events = sse_events(b"".join(p for _, p in pieces))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    expected = ["alpha", " bravo", " charlie", " alpha", " bravo"]
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:6]] == expected
    assert chunks[6]["choices"][0]["finish_reason"] == "stop" and chunks[6]["choices"][0]["delta"] == {}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    if include_usage:
        assert len(chunks) == 8 and chunks[7]["choices"] == []
        assert chunks[7]["usage"] == {
            "prompt_tokens": 1538,
            "completion_tokens": 5,
            "total_tokens": 1543,
            "prompt_tokens_details": {"cached_tokens": 1421},
        }
    else:
        assert len(chunks) == 7 and not any("usage" in c for c in chunks)
    assert cap.response_body == b"".join(p for _, p in pieces)


def test_openai_non_stream_has_usage() -> None:
    with fast("vllm") as up:
        response = httpx.post(up.url + "/v1/chat/completions", json={"messages": []}, timeout=TIMEOUT)
    obj = response.json()
    assert obj["object"] == "chat.completion"
    assert obj["choices"][0]["message"]["content"] == "alpha bravo charlie alpha bravo"
    assert obj["usage"] == {"prompt_tokens": 26, "completion_tokens": 5, "total_tokens": 31}


@pytest.mark.parametrize("streamed", [False, True])
def test_lmstudio_v0_stats(streamed: bool) -> None:
    with fast("lmstudio", tokens=10, token_delay_s=0.02, prompt_tokens=24) as up:
        url = up.url + "/api/v0/chat/completions"
        if streamed:
            _, pieces = stream(url, {"messages": [], "stream": True})
            chunks = [json.loads(e) for e in sse_events(b"".join(p for _, p in pieces))[:-1]]
            obj = chunks[-1]
            assert obj["choices"][0]["finish_reason"] == "stop"
            assert all("stats" not in c for c in chunks[:-1])
        else:
            obj = httpx.post(url, json={"messages": []}, timeout=TIMEOUT).json()
            fixture = json.loads((FIXTURES / "lmstudio" / "api_v0_chat_completion_plain.json").read_text())
            assert set(obj) == set(fixture)
    # 10 tokens × 0.02 s = 0.2 s → 50 tok/s; TTFT = the 0.05 s prefill.
    assert obj["stats"] == {
        "tokens_per_second": 50.0,
        "time_to_first_token": 0.05,
        "generation_time": 0.2,
        "stop_reason": "eosFound",
    }
    assert obj["usage"] == {"prompt_tokens": 24, "completion_tokens": 10, "total_tokens": 34}


@pytest.mark.parametrize("streamed", [False, True])
def test_lmstudio_v1_chat_events_and_stats(streamed: bool) -> None:
    with fast("lmstudio", tokens=4, token_delay_s=0.02, prefill_delay_s=0.1, prompt_tokens=27) as up:
        url = up.url + "/api/v1/chat"
        if streamed:
            _, pieces = stream(url, {"model": "qwen/qwen3-30b-a3b", "input": "x", "stream": True})
            body = b"".join(p for _, p in pieces).decode()
            assert body.endswith("\n\n")
            events = [e.split("\n") for e in body.split("\n\n")[:-1]]
            names = [e[0].removeprefix("event: ") for e in events]
            datas = [json.loads(e[1].removeprefix("data: ")) for e in events]
            assert names == [
                *("chat.start", "prompt_processing.start", "prompt_processing.progress"),
                *("prompt_processing.progress", "prompt_processing.end", "message.start"),
                *["message.delta"] * 4,
                *("message.end", "chat.end"),
            ]
            assert [d["type"] for d in datas] == names
            assert [d["progress"] for d in datas[2:4]] == [0.5, 1.0]
            assert "".join(d["content"] for d in datas[6:10]) == "alpha bravo charlie alpha"
            # The progress events come during the prefill, the first delta after it.
            cap = only(up)
            assert cap.first_token_at is not None and cap.first_token_at - cap.started_at >= 0.1
            result = datas[-1]["result"]
        else:
            result = httpx.post(url, json={"input": "x"}, timeout=TIMEOUT).json()
    fixture = json.loads((FIXTURES / "lmstudio" / "api_v1_chat.json").read_text())
    assert set(result) == set(fixture) and set(result["stats"]) == set(fixture["stats"])
    assert result["output"] == [{"type": "message", "content": "alpha bravo charlie alpha"}]
    # 4 tokens × 0.02 s = 0.08 s → 50 tok/s; TTFT = the 0.1 s prefill.
    assert result["stats"]["tokens_per_second"] == 50.0
    assert result["stats"]["time_to_first_token_seconds"] == 0.1
    assert (result["stats"]["input_tokens"], result["stats"]["total_output_tokens"]) == (27, 4)


def test_split_lines_cross_reads_and_reassemble() -> None:
    with fast(split_lines=True) as up:
        _, pieces = stream(up.url + "/api/chat", {"messages": []})
        cap = only(up)
    body = b"".join(p for _, p in pieces)
    lines = body.split(b"\n")[:-1]
    assert len(lines) == 6 and json.loads(lines[-1])["eval_count"] == 5
    assert len(cap.payload_writes) == 12
    assert not any(w.endswith(b"\n") for w in cap.payload_writes[0::2])
    assert any(not p.endswith(b"\n") for _, p in pieces)  # the client saw a line cut between reads
    assert cap.response_body == body


@pytest.mark.parametrize(("kind", "path"), [("ollama", "/api/chat"), ("vllm", "/v1/chat/completions")])
def test_die_mid_stream_closes_without_the_final_chunk(kind: str, path: str) -> None:
    pieces: list[bytes] = []
    with fast(kind, die_after_tokens=3) as up:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", up.url + path, json={"stream": True}, timeout=TIMEOUT) as response,
        ):
            pieces.extend(response.iter_raw())
        cap = only(up)
    body = b"".join(pieces)
    assert cap.response_body == body and cap.died and not cap.completed and cap.tokens_sent == 3
    assert not cap.response_body_wire.endswith(b"0\r\n\r\n")
    if kind == "ollama":
        assert [json.loads(line)["done"] for line in body.split(b"\n")[:-1]] == [False] * 3
    else:
        assert b"[DONE]" not in body and b'"finish_reason":"stop"' not in body
        assert len(sse_events(body)) == 1 + 3


def test_client_disconnect_mid_stream_is_seen_within_1_s() -> None:
    with fast("vllm", tokens=500, token_delay_s=0.02) as up:
        with httpx.stream(
            "POST", up.url + "/v1/chat/completions", json={"stream": True}, timeout=TIMEOUT
        ) as r:
            for piece in r.iter_raw():
                if b'"content":"alpha"' in piece:
                    break
        closed_at = time.monotonic()
        cap = only(up)
    assert cap.client_disconnected and cap.disconnect_stage == "streaming"
    assert cap.disconnected_at is not None and cap.disconnected_at - closed_at < 1.0
    assert not cap.completed and cap.tokens_sent < 500


@pytest.mark.parametrize(
    ("knobs", "stage"),
    [({"prefill_delay_s": 5.0}, "before_first_token"), ({"hang_before_headers_s": 5.0}, "before_headers")],
)
def test_client_disconnect_before_the_first_byte(knobs: dict[str, Any], stage: str) -> None:
    with fast(**knobs) as up, socket.create_connection(("127.0.0.1", int(up.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        deadline = time.monotonic() + 5.0
        while not up.captures and time.monotonic() < deadline:
            time.sleep(0.01)
        sock.close()
        closed_at = time.monotonic()
        cap = only(up)
    assert cap.client_disconnected and cap.disconnect_stage == stage
    assert cap.disconnected_at is not None and cap.disconnected_at - closed_at < 1.0
    assert cap.response_head == b"" and cap.first_byte_at is None


def test_error_status_and_body() -> None:
    with fast("ollama", error_status=500) as up:
        response = httpx.post(up.url + "/api/chat", json={"messages": []}, timeout=TIMEOUT)
    assert response.status_code == 500
    assert response.json() == {"error": "model runner has unexpectedly stopped"}


def test_chunked_upload_and_keep_alive() -> None:
    with fast("vllm", tokens=2) as up, httpx.Client(timeout=TIMEOUT) as client:
        parts = [b'{"messages": [], ', b'"stream": false}']
        first = client.post(up.url + "/v1/chat/completions", content=iter(parts))
        second = client.post(up.url + "/v1/completions", json={"prompt": "x"})
        caps = up.wait_for_captures(2)
    assert caps[0].request_body == b"".join(parts)
    assert ("Transfer-Encoding", "chunked") in caps[0].request_headers
    assert first.json()["choices"][0]["message"]["content"] == "alpha bravo"
    assert second.json()["choices"][0]["text"] == "alpha bravo"


def test_50_concurrent_streams_all_intact() -> None:
    n_streams = 50

    async def one(client: httpx.AsyncClient, url: str, i: int) -> tuple[int, bytes]:
        body = {"messages": [{"role": "user", "content": f"request {i}"}]}
        async with client.stream("POST", url + "/api/chat", json=body) as response:
            return i, b"".join([piece async for piece in response.aiter_raw()])

    async def all_of_them(url: str) -> list[tuple[int, bytes]]:
        limits = httpx.Limits(max_connections=n_streams + 10)
        async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
            jobs = asyncio.gather(*(one(client, url, i) for i in range(n_streams)))
            return await asyncio.wait_for(jobs, timeout=15.0)

    with fast(tokens=10, prefill_delay_s=0.8) as up:
        results = asyncio.run(all_of_them(up.url))
        caps = up.wait_for_captures(n_streams)
    by_request = {json.loads(c.request_body)["messages"][0]["content"]: c for c in caps}
    for i, body in results:
        cap = by_request[f"request {i}"]
        assert cap.completed and cap.response_body == body
        lines = body.split(b"\n")[:-1]
        assert len(lines) == 11 and json.loads(lines[-1])["eval_count"] == 10
    # All 50 were in flight at once: every request arrived before any first token went out.
    first_token = min(c.first_token_at for c in caps if c.first_token_at is not None)
    assert max(c.started_at for c in caps) < first_token
