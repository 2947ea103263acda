"""`LoopbackGetter` (the probes' GETs to a server on this machine without httpx, issue #26) against
fake servers on 127.0.0.1: the same answers and the same failure statuses and reasons as `fetch`,
one kept connection, and a kept connection the server closed replaced without a failure."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.fake_http import FakeServer, hang, json_reply, oversized, truncated
from tests.support.llama import free_port
from trayapp.sources.http import FetchError, LoopbackGetter, Response, fetch, make_client

TIMEOUT = httpx.Timeout(connect=1.0, read=0.5, write=1.0, pool=1.0)
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer(
        {
            "/health": json_reply({"status": "ok"}),
            "/loading": json_reply({"error": {"code": 503, "message": "Loading model"}}, 503),
            "/denied": json_reply({"error": {"message": "Invalid API Key"}}, 401),
            "/gzip": json_reply({"a": 1}, headers={"Content-Encoding": "gzip"}),
            "/big": oversized(2 * 1024 * 1024),
            "/cut": truncated(b'{"sta', declared_bytes=100),
            "/hang": hang,
        }
    ) as server:
        yield server


def both(url: str, path: str, **kwargs: object) -> tuple[Response | FetchError, Response | FetchError]:
    """What `fetch` (httpx) and `LoopbackGetter` make of one GET: the response or the FetchError."""
    results: list[Response | FetchError] = []
    getter = LoopbackGetter.for_url(url, TIMEOUT)
    assert getter is not None
    calls: list[Callable[[], Response | None]] = [
        lambda: fetch(client, path, **kwargs),  # type: ignore[arg-type]
        lambda: getter.get(path, **kwargs),  # type: ignore[arg-type]
    ]
    with make_client(url, TIMEOUT) as client:
        for call in calls:
            try:
                answer = call()
                assert answer is not None
                results.append(answer)
            except FetchError as exc:
                results.append(exc)
    getter.close()
    return results[0], results[1]


@pytest.mark.parametrize("path", ["/health", "/loading", "/denied", "/gzip", "/cut", "/hang", "/missing"])
def test_the_same_answer_or_failure_as_fetch(fake: FakeServer, path: str) -> None:
    via_httpx, direct = both(fake.url, path)
    if isinstance(via_httpx, Response):
        assert isinstance(direct, Response)
        assert (direct.status_code, direct.text) == (via_httpx.status_code, via_httpx.text)
        assert direct.headers["content-type"] == via_httpx.headers["content-type"]
    else:
        assert isinstance(direct, FetchError), direct
        assert (direct.status, direct.http_status) == (via_httpx.status, via_httpx.http_status)
        if path == "/cut":  # the libraries word the cut differently; both say who closed it
            assert "server closed the connection" in direct.reason
            assert "server closed the connection" in via_httpx.reason
        else:
            assert direct.reason == via_httpx.reason


def test_the_size_limit_and_a_refused_port_as_fetch(fake: FakeServer) -> None:
    via_httpx, direct = both(fake.url, "/big", max_bytes=64 * 1024)
    assert isinstance(direct, FetchError) and isinstance(via_httpx, FetchError)
    assert direct.reason == via_httpx.reason == "/big: response larger than 64 KiB"
    refused_url = f"http://127.0.0.1:{free_port()}"
    via_httpx, direct = both(refused_url, "/health")
    assert isinstance(direct, FetchError) and isinstance(via_httpx, FetchError)
    assert direct.status == via_httpx.status == "unreachable"
    assert "connection refused or unreachable" in direct.reason


def test_only_plain_loopback_urls() -> None:
    assert LoopbackGetter.for_url("http://127.0.0.1:8080") is not None
    assert LoopbackGetter.for_url("http://localhost:8080/prefix") is not None
    assert LoopbackGetter.for_url("https://127.0.0.1:8080") is None  # TLS: httpx
    assert LoopbackGetter.for_url("http://10.1.2.3:8080") is None  # another machine: httpx (proxies)
    assert LoopbackGetter.for_url("http://user:pw@127.0.0.1:8080") is None  # credentials: httpx
    assert LoopbackGetter.for_url("http://127.0.0.1:8080/?key=1") is None


def test_one_kept_connection_and_the_path_prefix(fake: FakeServer) -> None:
    fake.protocol_version = "HTTP/1.1"
    fake.routes["/v1/health"] = json_reply({"status": "ok"})
    getter = LoopbackGetter.for_url(fake.url + "/v1", TIMEOUT)
    assert getter is not None
    try:
        for _ in range(3):
            answer = getter.get("/health")
            assert answer is not None and answer.json() == {"status": "ok"}
        assert fake.paths_requested() == ["/v1/health"] * 3
        assert answer is not None and answer.headers["content-type"] == "application/json"
    finally:
        getter.close()
    peers = {headers.get("Host") for _, _, headers in fake.requests}
    assert peers == {f"127.0.0.1:{fake.port}"}


class ClosingServer:
    """Answers each connection's first request with a keep-alive 200, then closes it (as cpp-httplib
    does with an idle kept connection). Counts the connections."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.answered = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                conn.sendall(ANSWER)
            self.answered.set()

    def close(self) -> None:
        self.listener.close()


def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    server = ClosingServer()
    getter = LoopbackGetter.for_url(f"http://127.0.0.1:{server.port}", TIMEOUT)
    assert getter is not None
    try:
        for _ in range(3):
            server.answered.clear()
            answer = getter.get("/health")
            assert answer is not None and answer.json() == {}
            assert server.answered.wait(5.0)  # the server has closed its end
        assert server.connections == 3
    finally:
        getter.close()
        server.close()
