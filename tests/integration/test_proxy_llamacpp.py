"""The recording proxy in front of a real llama-server (issue #12).

Same requests direct and proxied (temperature 0, fixed seed, no prompt cache): identical bodies
once the per-response `id`, `created` and `timings` are dropped; the record's numbers are the
server's own `timings` of that request; a client hanging up mid-stream stops the server's slot.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import httpx
import pytest

from tests.support.llama import LlamaServer
from tests.support.load import cpu_hog
from tests.support.proxy import running_proxy

pytestmark = pytest.mark.llamacpp

VOLATILE = ("id", "created", "timings", "system_fingerprint")
CHAT = {
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 24,
    "temperature": 0,
    "seed": 7,
    "cache_prompt": False,
}


@pytest.fixture(scope="module")
def proxied(llama_server: LlamaServer) -> Iterator[Any]:
    with running_proxy(llama_server.url, "llamacpp") as proxy:
        yield proxy


def _client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=120)


def _stable(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in VOLATILE}


def _sse_objects(body: bytes) -> list[Any]:
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    return [ev if ev == "[DONE]" else _stable(json.loads(ev)) for ev in events]


def _stream_raw(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> bytes:
    with client.stream("POST", url + path, json=body) as response:
        assert response.status_code == 200
        return b"".join(response.iter_raw())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/completion", {"prompt": "Name three colours.", "n_predict": 24, "temperature": 0, "seed": 7,
                         "cache_prompt": False}),
    ],
)  # fmt: skip
def test_bodies_through_the_proxy_equal_direct_ones(
    llama_server: LlamaServer, proxied: Any, path: str, body: dict[str, Any]
) -> None:
    before = len(proxied.records.items)
    with _client() as client:
        direct = client.post(llama_server.url + path, json=body)
        through = client.post(proxied.url + path, json=body)
        assert through.status_code == direct.status_code == 200
        assert through.headers["content-type"] == direct.headers["content-type"]
        assert _stable(through.json()) == _stable(direct.json())
        streamed = {**body, "stream": True}
        direct_events = _sse_objects(_stream_raw(client, llama_server.url, path, streamed))
        proxied_events = _sse_objects(_stream_raw(client, proxied.url, path, streamed))
    assert len(direct_events) > 5  # a token-by-token stream, not one object
    assert proxied_events == direct_events
    # Both proxied requests are recorded. A record lands just after its client read the last byte:
    # waiting for them here keeps a slow host's late record out of the next test's count.
    records = proxied.records.wait_for(before + 2)[before:]
    assert [r.endpoint for r in records] == [path, path]


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "beside-a-busy-loop"])
def test_the_record_holds_the_servers_own_timings(proxied: Any, busy: bool) -> None:
    """Exact means the server's own figures, on a quiet host and beside a busy neighbour alike."""
    subject = "mountains" if busy else "rivers"  # each run's first prompt is new to the cache
    body = {"prompt": f"Write about {subject}. " * 8, "n_predict": 40, "ignore_eos": True, "stream": True}
    before = len(proxied.records.items)
    finals = []
    with cpu_hog() if busy else nullcontext(), _client() as client:
        for attempt in range(2):  # the second reuses the cached prompt and the upstream connection
            started = time.monotonic()
            first_content_s = None
            last: dict[str, Any] = {}
            lines: list[str] = []
            with client.stream("POST", proxied.url + "/completion", json=body) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    if not line.startswith("data: "):
                        continue
                    obj = json.loads(line[6:])
                    if obj.get("content") and first_content_s is None:
                        first_content_s = time.monotonic() - started
                    last = obj
            assert "timings" in last, (attempt, response.status_code, len(lines), lines[-4:])
            finals.append((last["timings"], first_content_s))
    records = proxied.records.wait_for(before + 2)[before:]
    for record, (timings, client_ttft_s) in zip(records, finals, strict=True):
        assert record.source == "proxy" and record.endpoint == "/completion" and record.http_status == 200
        assert not record.aborted and record.decode_exact
        assert record.decode_tokens == timings["predicted_n"] == 40
        assert record.decode_tok_s == pytest.approx(timings["predicted_per_second"])
        assert record.prompt_tokens == timings["prompt_n"] + timings["cache_n"]
        assert record.cached_tokens == timings["cache_n"]
        assert record.prompt_tok_s == pytest.approx(timings["prompt_per_second"])
        # TTFT as the client lives it: at least the server's prompt time, at most what the client saw.
        assert client_ttft_s is not None and record.ttft_s is not None
        assert timings["prompt_ms"] / 1000 <= record.ttft_s <= client_ttft_s
    assert records[1].cached_tokens and records[1].cached_tokens > records[0].cached_tokens


def test_the_openai_client_works_through_the_proxy(proxied: Any) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(
        base_url=proxied.url + "/v1", api_key="unused", http_client=httpx.Client(trust_env=False)
    )
    before = len(proxied.records.items)
    stream = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Say something about tea."}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert pieces and usage is not None
    (record,) = proxied.records.wait_for(before + 1)[before:]
    assert record.endpoint == "/v1/chat/completions" and record.http_status == 200
    assert record.decode_tokens == usage.completion_tokens
    assert record.prompt_tokens == usage.prompt_tokens
    assert record.decode_exact  # llama-server's own timings ride on the last chunk


def _processing(url: str) -> bool:
    slots = httpx.get(url + "/slots", timeout=5, trust_env=False).json()
    return any(slot.get("is_processing") for slot in slots)


def _seconds_until(url: str, processing: bool, limit_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if _processing(url) is processing:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def test_a_client_hanging_up_mid_stream_stops_the_servers_slot(
    llama_server: LlamaServer, proxied: Any
) -> None:
    port = int(proxied.url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": "Tell a long story.", "n_predict": 400, "ignore_eos": True, "stream": True})
    before = len(proxied.records.items)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        head = f"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body.encode())
        received = b""
        while received.count(b"data: ") < 3:  # a few tokens arrived: mid-stream
            chunk = sock.recv(4096)
            assert chunk, "the stream ended early"
            received += chunk
        assert _processing(llama_server.url)
    finally:
        sock.close()
    stopped_after_s = _seconds_until(llama_server.url, False, limit_s=10)
    # well before the ~400 tokens left would take even on a fast host (~6 s at 65 tok/s)
    assert stopped_after_s is not None and stopped_after_s < 3.0, f"slot still busy after {stopped_after_s} s"
    (record,) = proxied.records.wait_for(before + 1)[before:]
    assert record.aborted and record.http_status == 200
    assert record.decode_tokens is None or record.decode_tokens < 400
