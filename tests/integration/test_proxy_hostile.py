"""The recording proxy against hostile clients and upstreams (issue #25): nothing smuggled past it,
nothing crashes it, no client holds its sockets or memory. Each case was first reproduced against the
proxy before the fix (an adversarial trial of 53193b8)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from tests.support.fake_servers import wait_until
from tests.support.fake_streaming import FakeStreamingUpstream
from tests.support.proxy import running_proxy
from trayapp.services.proxy import limits
from trayapp.services.proxy.recorder import RequestTap

pytestmark = pytest.mark.usefixtures("each_event_loop")  # each test on uvloop and on asyncio


@dataclass
class RawUpstream:
    """A TCP upstream that keeps every byte it is sent and answers each connection with `reply`
    (once its first bytes arrive), as lenient as a server can be: it never parses anything."""

    reply: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    received: list[bytes] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    data = conn.recv(65536)
                    if data:
                        conn.sendall(self.reply)
                        conn.settimeout(0.3)
                        while more := conn.recv(65536):
                            data += more
                except OSError:
                    pass
                self.received.append(data)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def all_bytes(self) -> bytes:
        return b"".join(self.received)


@contextmanager
def raw_upstream(reply: bytes | None = None) -> Iterator[RawUpstream]:
    upstream = RawUpstream() if reply is None else RawUpstream(reply=reply)
    try:
        yield upstream
    finally:
        upstream.close()


def exchange(url: str, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Send raw bytes, read until the proxy closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    received = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request)
        with __import__("contextlib").suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


SMUGGLED = b"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
ATTACKS = {
    "TE chunked, identity + CL": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n"
    b"Transfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "TE + CL": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 40\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "two TE headers": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
    b"Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "bare LF in a header": b"POST /v1/completions HTTP/1.1\r\nHost: a\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "chunk size 1_0": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1_0\r\n" + SMUGGLED[:16] + b"\r\n0\r\n\r\n",
    "Content-Length: ²": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: \xb2\r\n\r\nab",
    "differing Content-Lengths": b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n"
    b"Content-Length: 33\r\n\r\n" + SMUGGLED,
}  # fmt: skip


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_smuggling_request_gets_400_and_no_byte_reaches_the_upstream(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with raw_upstream() as upstream, running_proxy(upstream.url) as proxy:
        response = exchange(proxy.url, ATTACKS[name])
        time.sleep(0.3)
    if name == "chunk size 1_0":  # the head went up (this upstream answers it at once), the bad line not
        assert b"1_0" not in upstream.all_bytes() and status(response) in (400, 200)
    else:  # refused at the head: nothing reaches the upstream
        assert status(response) == 400, response[:200]
        assert upstream.all_bytes() == b""
    assert b"/admin" not in upstream.all_bytes()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_the_forwarded_head_states_its_length_once() -> None:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\ncontent-length: 2\r\n"
        b"Connection: close\r\n\r\nhi"
    )
    with raw_upstream() as upstream, running_proxy(upstream.url) as proxy:
        response = exchange(proxy.url, request)
        time.sleep(0.3)
    assert status(response) == 200
    assert upstream.all_bytes().lower().count(b"content-length") == 1


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 2\r\n\r\nok",
    ],
)
def test_a_malformed_upstream_head_is_a_502_and_a_failed_record(
    reply: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )
    with raw_upstream(reply) as upstream, running_proxy(upstream.url) as proxy:
        response = exchange(proxy.url, request)
        (record,) = proxy.records.wait_for(1)
    assert status(response) == 502 and b"upstream_failed" in response
    assert record.http_status == 502 and record.model == "m"
    assert not [r for r in caplog.records if r.exc_info]


def test_a_malformed_upstream_chunk_cuts_the_response_and_keeps_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n"
    body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    with raw_upstream(reply) as upstream, running_proxy(upstream.url) as proxy:
        response = exchange(proxy.url, request)
        (record,) = proxy.records.wait_for(1)
    assert response.startswith(b"HTTP/1.1 200 OK")  # the head went out before the bad chunk came
    assert b"1_0" not in response and record.aborted
    assert not [r for r in caplog.records if r.exc_info]


def test_a_non_ascii_bearer_is_a_401_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    with raw_upstream() as upstream, running_proxy(upstream.url, token="s3cret") as proxy:
        response = exchange(
            proxy.url,
            "GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3crét\r\n\r\n".encode(),
        )
        latin = exchange(
            proxy.url, b"GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer \xe9\r\n\r\n"
        )
    assert status(response) == 401 and status(latin) == 401
    assert upstream.all_bytes() == b""
    assert not [r for r in caplog.records if r.exc_info]


def test_the_token_sent_in_both_headers_is_never_forwarded() -> None:
    with raw_upstream() as upstream, running_proxy(upstream.url, token="s3cret-token") as proxy:
        response = exchange(
            proxy.url,
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Bearer s3cret-token\r\n"
            b"Authorization: Bearer s3cret-token\r\nConnection: close\r\n\r\n",
        )
        key = exchange(
            proxy.url,
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Bearer s3cret-token\r\n"
            b"Authorization: Bearer upstream-key\r\nConnection: close\r\n\r\n",
        )
        time.sleep(0.3)
    assert status(response) == 200 and status(key) == 200
    sent = upstream.all_bytes()
    assert b"s3cret-token" not in sent and b"Authorization: Bearer upstream-key" in sent
    assert b"proxy-authorization" not in sent.lower()


def test_proxy_credentials_never_go_upstream_from_a_listener_without_a_token() -> None:
    with raw_upstream() as upstream, running_proxy(upstream.url) as proxy:
        response = exchange(
            proxy.url,
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Bearer corp-proxy-pass\r\n"
            b"Authorization: Bearer upstream-key\r\nConnection: close\r\n\r\n",
        )
        wait_until(lambda: bool(upstream.received))  # kept once its connection ended
    assert status(response) == 200
    sent = upstream.all_bytes()
    assert b"corp-proxy-pass" not in sent and b"Authorization: Bearer upstream-key" in sent


def test_a_non_ascii_token_is_refused_at_start_with_a_message() -> None:
    env = {**os.environ, "LLM_TRAY_TOKEN": "tökén"}
    done = subprocess.run(
        [sys.executable, "-m", "trayapp", "proxy", "--listen", "127.0.0.1:0", "--upstream",
         "http://127.0.0.1:9", "--no-record", "--duration", "1"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "printable ASCII" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------- availability
@pytest.fixture
def short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(limits, "IDLE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(limits, "BODY_STALL_TIMEOUT_S", 0.5)


def _closed_within(sock: socket.socket, limit_s: float) -> tuple[bool, bytes]:
    sock.settimeout(limit_s)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        pass
    return True, got


def test_a_silent_or_trickling_client_is_closed_after_the_head_timeout(short_limits: None) -> None:
    with raw_upstream() as upstream, running_proxy(upstream.url) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        for byte in b"GET / ":  # a byte every 50 ms: never a whole head
            trickle.sendall(bytes([byte]))
            time.sleep(0.05)
        closed_silent, said_silent = _closed_within(silent, 3)
        closed_trickle, said_trickle = _closed_within(trickle, 3)
        silent.close()
        trickle.close()
    assert closed_silent and status(said_silent) == 408
    assert closed_trickle and status(said_trickle) == 408
    assert upstream.all_bytes() == b""


def test_an_idle_kept_alive_connection_is_closed(short_limits: None) -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    with raw_upstream(reply) as upstream, running_proxy(upstream.url) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n")
            time.sleep(0.2)
            started = time.monotonic()
            closed, got = _closed_within(sock, 5)
    assert closed and got.endswith(b"ok") and time.monotonic() - started < 3


def test_a_stalled_request_body_is_closed(short_limits: None) -> None:
    with FakeStreamingUpstream("openai") as upstream, running_proxy(upstream.url) as proxy:  # waits for it
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n{")
            closed, _ = _closed_within(sock, 5)
    assert closed


def test_at_the_cap_idle_connections_make_room_and_busy_ones_get_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_CONNECTIONS", 4)
    with (
        FakeStreamingUpstream("openai", tokens=40, token_delay_s=0.05) as upstream,
        running_proxy(upstream.url) as proxy,
    ):
        port = int(proxy.url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.2)
        # A well-behaved client still gets through: the oldest idle connection makes room.
        ok = exchange(
            proxy.url,
            b"GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        closed_first, _ = _closed_within(idle[0], 2)
        # Four streams in flight fill the cap: a fifth connection gets 503 at once.
        body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        for sock in idle:
            sock.close()
        time.sleep(0.2)
        busy = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        for sock in busy:
            sock.sendall(request)
        time.sleep(0.3)
        refused = exchange(proxy.url, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", timeout_s=5)
        for sock in busy:
            sock.close()
    assert status(ok) != 503 and closed_first
    assert status(refused) == 503 and b"Retry-After: 1" in refused


# ---------------------------------------------------------------------------------------- big bodies
def test_a_big_request_body_is_read_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    original = RequestTap.read_request

    def spy(self: RequestTap) -> None:
        threads.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(RequestTap, "read_request", spy)
    big = json.dumps({"model": "big-model", "prompt": "x" * (3 * 1024 * 1024), "stream": False}).encode()
    with FakeStreamingUpstream("openai", tokens=2) as upstream, running_proxy(upstream.url) as proxy:
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: "
            + str(len(big)).encode()
            + b"\r\n\r\n"
            + big
        )
        response = exchange(proxy.url, request, timeout_s=30)
        (record,) = proxy.records.wait_for(1)
    assert status(response) == 200 and record.model == "big-model"
    assert threads and all(name != "llm-tray-proxy" for name in threads)


def test_bodies_past_the_held_budget_are_forwarded_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "REQUEST_BODIES_HELD_BYTES", 1024 * 1024)
    dropped: list[int] = []
    original = RequestTap.drop_request

    def spy(self: RequestTap) -> None:
        dropped.append(1)
        original(self)

    monkeypatch.setattr(RequestTap, "drop_request", spy)
    big = json.dumps({"model": "big-model", "prompt": "x" * (2 * 1024 * 1024), "stream": False}).encode()
    with FakeStreamingUpstream("openai", tokens=2) as upstream, running_proxy(upstream.url) as proxy:
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: "
            + str(len(big)).encode()
            + b"\r\n\r\n"
            + big
        )
        response = exchange(proxy.url, request, timeout_s=30)
        (record,) = proxy.records.wait_for(1)
        (capture,) = upstream.wait_for_captures(1)
    assert status(response) == 200 and capture.request_body == big and record.http_status == 200
    assert dropped == [1]  # not read: the budget was spent
