"""The recording proxy against fake Ollama / vLLM / LM Studio upstreams that stream token by token.

No real Ollama, vLLM or LM Studio runs here; the fakes (tests/support/fake_streaming.py) follow the
fixtures and report durations that are hand arithmetic from their knobs, so every expected figure
below is computed from the knobs, never by the code under test.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import warnings
from typing import Any

import httpx
import pytest

from tests.support.fake_streaming import FakeStreamingUpstream
from tests.support.llama import free_port
from tests.support.proxy import running_proxy
from trayapp.services.proxy.route import Route
from trayapp.services.proxy.runner import ProxyThread

pytestmark = pytest.mark.usefixtures("each_event_loop")  # each test on uvloop and on asyncio

WORDS = ("Zanzibar", "quokka", "marmalade")
TIMEOUT = httpx.Timeout(10.0)


def fake(kind: str = "ollama", **knobs: Any) -> FakeStreamingUpstream:
    defaults: dict[str, Any] = {"tokens": 8, "prefill_delay_s": 0.05, "token_delay_s": 0.01}
    return FakeStreamingUpstream(kind, text_words=WORDS, **(defaults | knobs))  # type: ignore[arg-type]


def raw_exchange(url: str, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Send raw request bytes, read until the proxy closes (the request says Connection: close)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    received = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            received += chunk
    return received


def post_bytes(path: str, body: dict[str, Any], *extra_headers: str) -> bytes:
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            f"Content-Length: {len(data)}", "Connection: close", *extra_headers]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def test_the_proxy_runs_on_the_event_loop_asked_for(each_event_loop: str) -> None:
    with fake() as upstream, running_proxy(upstream.url, "ollama") as proxy:
        assert proxy.thread.event_loop == each_event_loop
        with httpx.Client(trust_env=False, timeout=TIMEOUT) as client:
            body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
            assert client.post(proxy.url + "/api/chat", json=body).status_code == 200
        (record,) = proxy.records.wait_for(1)
    # The fake's knobs: 8 tokens, each 0.01 s → eval_count 8, 100 tok/s from Ollama's own durations.
    assert record.http_status == 200 and record.decode_tokens == 8
    assert record.decode_tok_s == pytest.approx(100.0, rel=0.01)


@pytest.mark.parametrize("stream", [None, False])  # None: `stream` omitted, which Ollama streams
def test_the_client_gets_exactly_the_bytes_the_upstream_sent(stream: bool | None) -> None:
    body: dict[str, Any] = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}
    if stream is not None:
        body["stream"] = stream
    with fake(split_lines=True) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        received = raw_exchange(proxy.url, post_bytes("/api/chat", body))
        (capture,) = upstream.wait_for_captures(1)
    assert capture.completed and capture.streamed is (stream is None)
    assert received == capture.wire_bytes  # head and body, chunk framing included, byte for byte


def test_ollama_numbers_come_from_its_own_durations() -> None:
    # Hand arithmetic from the knobs: eval 8 tokens × 0.01 s → 100 tok/s; prompt 26 tokens in 0.05 s
    # → 520 tok/s, an upper bound (Ollama counts cached tokens but not their time); load 0.1 s.
    body = {"model": "qwen3:30b", "prompt": "hi"}  # no `stream`: Ollama streams
    with fake(load_delay_s=0.1, split_lines=True) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        started = time.monotonic()
        with httpx.stream("POST", proxy.url + "/api/generate", json=body, timeout=TIMEOUT) as response:
            lines = [json.loads(line) for line in response.iter_lines() if line]
        client_s = time.monotonic() - started
        (record,) = proxy.records.wait_for(1)
    assert len(lines) == 9 and lines[-1]["done"] is True  # 8 tokens and the final object
    assert record.endpoint == "/api/generate" and record.http_status == 200 and not record.aborted
    assert record.model == "qwen3:30b"
    assert record.decode_tokens == 8 and record.decode_tok_s == pytest.approx(100.0)
    assert record.prompt_tokens == 26 and record.cached_tokens is None
    assert record.prompt_tok_s == pytest.approx(520.0) and record.prompt_rate_upper_bound
    assert record.load_s == pytest.approx(0.1)
    assert record.ttft_s is not None and 0.15 <= record.ttft_s <= client_s  # load + prefill, then the token


def test_vllm_usage_with_cached_tokens_is_recorded_as_estimated_decode() -> None:
    body = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with fake("vllm", cached_prompt_tokens=16) as upstream, running_proxy(upstream.url, "vllm") as proxy:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        (record,) = proxy.records.wait_for(1)
    assert events[-1] == "data: [DONE]"
    assert record.prompt_tokens == 26 and record.cached_tokens == 16 and record.decode_tokens == 8
    # usage only: (8 − 1) tokens over the 7 gaps of 0.01 s seen by the proxy → about 100 tok/s, flagged.
    assert not record.decode_exact and record.decode_tok_s == pytest.approx(100.0, rel=0.5)


def test_lm_studio_stats_are_recorded() -> None:
    body = {"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with fake("lmstudio") as upstream, running_proxy(upstream.url, "lmstudio") as proxy:
        response = httpx.post(proxy.url + "/api/v0/chat/completions", json=body, timeout=TIMEOUT)
        (record,) = proxy.records.wait_for(1)
    stats = response.json()["stats"]
    assert record.decode_tokens == 8 and record.decode_tok_s == pytest.approx(stats["tokens_per_second"])
    assert record.decode_tok_s == pytest.approx(100.0)  # 8 tokens / (8 × 0.01 s)
    assert record.ttft_s == pytest.approx(0.05)  # the server's own time to first token (load 0 + prefill)


def test_an_upstream_dying_mid_stream_ends_the_client_stream_at_once() -> None:
    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}
    with fake(die_after_tokens=3) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        lines: list[str] = []
        with (
            pytest.raises(httpx.RemoteProtocolError),  # an incomplete chunked body: the client knows
            httpx.stream("POST", proxy.url + "/api/chat", json=body, timeout=TIMEOUT) as response,
        ):
            lines.extend(line for line in response.iter_lines() if line)
        (record,) = proxy.records.wait_for(1)
    assert len(lines) == 3
    assert record.aborted and record.http_status == 200 and record.decode_tok_s is None


def test_an_unreachable_upstream_gives_502_with_a_body_naming_it() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with running_proxy(dead, "ollama") as proxy:
        response = httpx.post(proxy.url + "/api/chat", json={"model": "m"}, timeout=TIMEOUT)
        (record,) = proxy.records.wait_for(1)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_unreachable" and error["upstream"] == dead and dead in error["message"]
    assert record.http_status == 502


def test_upstream_errors_pass_through_with_their_status_and_body() -> None:
    with fake(error_status=500) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        response = httpx.post(proxy.url + "/api/chat", json={"model": "m"}, timeout=TIMEOUT)
        (capture,) = upstream.wait_for_captures(1)
        (record,) = proxy.records.wait_for(1)
    assert response.status_code == 500 and response.content == capture.response_body
    assert record.http_status == 500 and record.decode_tok_s is None


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_hanging_up_before_the_first_byte_closes_the_upstream(stream: bool) -> None:
    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with fake(prefill_delay_s=5.0) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(post_bytes("/api/chat", body))
        deadline = time.monotonic() + 5
        while not upstream.captures and time.monotonic() < deadline:  # the request reached the upstream
            time.sleep(0.01)
        hung_up_at = time.monotonic()
        sock.close()
        (capture,) = upstream.wait_for_captures(1, timeout_s=5.0)
        (record,) = proxy.records.wait_for(1)
    assert capture.client_disconnected and capture.disconnected_at is not None
    assert capture.disconnected_at - hung_up_at < 1.0
    assert capture.tokens_sent == 0 and record.aborted


def test_a_client_hanging_up_mid_stream_closes_the_upstream() -> None:
    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}
    with fake(tokens=500, token_delay_s=0.02) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        with httpx.stream("POST", proxy.url + "/api/chat", json=body, timeout=TIMEOUT) as response:
            for index, _line in enumerate(response.iter_lines()):
                if index == 3:
                    break
        hung_up_at = time.monotonic()
        (capture,) = upstream.wait_for_captures(1, timeout_s=5.0)
        (record,) = proxy.records.wait_for(1)
    assert capture.client_disconnected and capture.disconnected_at is not None
    assert capture.disconnected_at - hung_up_at < 1.0 and capture.tokens_sent < 500
    assert record.aborted


@pytest.mark.parametrize("while_streaming", [True, False])
def test_a_next_request_sent_before_the_answer_ended_is_answered_after_it(while_streaming: bool) -> None:
    """HTTP/1.1 pipelining: the next request comes in the same write as the first (`while_streaming`
    False), or while the first answer streams. Neither answer is cut, nor is the client taken to
    have gone."""
    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}
    first = post_bytes("/api/chat", body).replace(b"Connection: close\r\n", b"")
    second = post_bytes("/api/chat", body)
    with fake(tokens=20, token_delay_s=0.02) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
        received = b""
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            if while_streaming:
                sock.sendall(first)
                while b"Zanzibar" not in received and b"quokka" not in received:  # a token has come
                    received += sock.recv(65536)
                sock.sendall(second)
            else:
                sock.sendall(first + second)
            while chunk := sock.recv(65536):  # the second request says Connection: close
                received += chunk
        captures = upstream.wait_for_captures(2)
        records = proxy.records.wait_for(2)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert [capture.tokens_sent for capture in captures] == [20, 20]
    assert not any(capture.client_disconnected for capture in captures)
    assert [record.aborted for record in records] == [False, False]
    assert [record.decode_tokens for record in records] == [20, 20]


def test_a_token_is_required_when_set_and_never_forwarded() -> None:
    with fake() as upstream, running_proxy(upstream.url, "ollama", token="s3cret-token") as proxy:
        body = {"model": "m", "stream": False}
        refused = httpx.post(proxy.url + "/api/chat", json=body, timeout=TIMEOUT)
        wrong = httpx.post(proxy.url + "/api/chat", json=body, headers={"Authorization": "Bearer nope"})
        allowed = httpx.post(
            proxy.url + "/api/chat",
            json=body,
            headers={"Authorization": "Bearer s3cret-token"},
            timeout=TIMEOUT,
        )
        (capture,) = upstream.wait_for_captures(1)
    assert refused.status_code == 401 and wrong.status_code == 401 and allowed.status_code == 200
    assert all(name.lower() != "authorization" for name, _ in capture.request_headers)


def test_keep_alive_and_a_chunked_upload_pass_through() -> None:
    upload = json.dumps({"model": "m", "prompt": "hi", "stream": False}).encode()

    def pieces() -> Any:
        yield upload[:7]
        yield upload[7:]

    with fake() as upstream, running_proxy(upstream.url, "ollama") as proxy:
        with httpx.Client(timeout=TIMEOUT) as client:
            first = client.post(proxy.url + "/api/generate", content=pieces())  # chunked upload
            second = client.post(proxy.url + "/api/generate", content=upload)
        captures = upstream.wait_for_captures(2)
    assert first.status_code == second.status_code == 200
    assert [c.request_body for c in captures] == [upload, upload]
    assert any(name.lower() == "transfer-encoding" for name, _ in captures[0].request_headers)


def test_fifty_concurrent_streams_arrive_intact() -> None:
    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}

    async def one(client: httpx.AsyncClient, url: str) -> bytes:
        async with client.stream("POST", url + "/api/chat", json=body) as response:
            return b"".join([piece async for piece in response.aiter_raw()])

    async def all_of_them(url: str) -> list[bytes]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, url) for _ in range(50))), 30)

    with fake(tokens=20) as upstream, running_proxy(upstream.url, "ollama") as proxy:
        bodies = asyncio.run(all_of_them(proxy.url))
        captures = upstream.wait_for_captures(50, timeout_s=10)
        records = proxy.records.wait_for(50)
    assert sorted(bodies) == sorted(c.response_body for c in captures)
    assert all(r.decode_tokens == 20 and not r.aborted for r in records)


def test_no_generated_text_reaches_a_record() -> None:
    with fake() as upstream, running_proxy(upstream.url, "ollama") as proxy:
        httpx.post(
            proxy.url + "/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        (record,) = proxy.records.wait_for(1)
    assert not any(word in repr(record) for word in WORDS)


def test_expect_100_continue_is_relayed_before_the_body() -> None:
    upload = json.dumps({"model": "m", "prompt": "hi", "stream": False}).encode()
    head = (
        "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(upload)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    with fake() as upstream, running_proxy(upstream.url, "ollama") as proxy:
        host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head.encode())
            interim = sock.recv(4096)  # the upstream's 100 Continue, relayed while the body waits
            sock.sendall(upload)
            final = b""
            while chunk := sock.recv(65536):
                final += chunk
        (capture,) = upstream.wait_for_captures(1)
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    assert interim.endswith(b"\r\n\r\n") and final.startswith(b"HTTP/1.1 200")
    assert capture.request_body == upload


def test_stopping_as_a_client_connects_leaves_no_socket_open() -> None:
    """A connection accepted just as the proxy stops must still be closed (Python 3.11's
    Server.close() races its accept; see ProxyServer.close)."""
    dead = f"http://127.0.0.1:{free_port()}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(30):
            thread = ProxyThread([Route("127.0.0.1", 0, dead, "ollama")], lambda _route, _record: None)
            (url,) = thread.start()
            host, port = url.removeprefix("http://").rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
            thread.stop()
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks[:3]
