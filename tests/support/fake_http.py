"""Tiny fake HTTP servers on 127.0.0.1:0 (stdlib `http.server` in a thread).

Routes map a path (query string ignored) to a `Reply` or to a callable that
writes the response itself (to hang, truncate, or stream a huge body).
Unknown paths answer 404 with a llama.cpp-style error body. A subclass may
compute its answers instead by overriding `FakeServer.respond` (the fakes in
`fake_servers.py` do).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

Handler = Callable[[BaseHTTPRequestHandler, "FakeServer"], None]


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


def json_reply(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(data).encode(), "application/json", headers or {})


def text_reply(text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Reply:
    return Reply(status, text.encode(), content_type)


def file_reply(path: Path, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    content_type = "application/json" if path.suffix == ".json" else "text/plain; version=0.0.4"
    return Reply(status, path.read_bytes(), content_type, headers or {})


def captured_reply(path: Path) -> Reply:
    """A raw HTTP answer captured from a real server (`tests/fixtures/mlx/*.http`): its status, content
    type and body as sent (an empty body stays empty)."""
    head, _, body = path.read_bytes().partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "text/plain")
    return Reply(int(status_line.split()[1]), body, content_type)


NOT_FOUND = json_reply({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}, 404)


def write_reply(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
    """Send `reply`; a client that already hung up (a timeout test) only closes the connection."""
    try:
        handler.send_response(reply.status)
        handler.send_header("Content-Type", reply.content_type)
        handler.send_header("Content-Length", str(len(reply.body)))
        for key, value in reply.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(reply.body)
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True


def delayed(reply: Reply, delay_s: float) -> Handler:
    """Stall `delay_s` seconds (less if the fake server stops), then send `reply`."""

    def write(handler: BaseHTTPRequestHandler, server: FakeServer) -> None:
        server.release.wait(timeout=delay_s)
        write_reply(handler, reply)

    return write


def hang(handler: BaseHTTPRequestHandler, server: FakeServer) -> None:
    """Accept the request and never answer (until the fake server stops)."""
    server.release.wait(timeout=60.0)


def truncated(body: bytes, declared_bytes: int) -> Handler:
    """Declare `declared_bytes` of body, send only `body`, then close the connection."""

    def write(handler: BaseHTTPRequestHandler, server: FakeServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(declared_bytes))
        handler.end_headers()
        handler.wfile.write(body)
        handler.close_connection = True

    return write


def oversized(total_bytes: int, chunk_bytes: int = 256 * 1024) -> Handler:
    """A 200 JSON-ish body of `total_bytes`, written in chunks; stops quietly when the client hangs up."""

    def write(handler: BaseHTTPRequestHandler, server: FakeServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(total_bytes))
        handler.end_headers()
        sent = 0
        chunk = b" " * chunk_bytes
        try:
            while sent < total_bytes:
                part = chunk[: min(chunk_bytes, total_bytes - sent)]
                handler.wfile.write(part)
                sent += len(part)
        except OSError:
            pass  # the client stopped reading: that is the point
        handler.close_connection = True

    return write


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up on purpose are part of the tests


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.protocol_version = self.server.fake.protocol_version

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        fake = self.server.fake
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = dict(self.headers.items())
        with fake.lock:
            fake.requests.append((self.command, path, headers))
            route = fake.respond(self.command, path, body, headers)
        if callable(route):
            route(self, fake)
        else:
            write_reply(self, route)

    do_GET = _serve
    do_POST = _serve


class FakeServer:
    """A fake HTTP server on 127.0.0.1. Use as a context manager; `routes` may change while it runs.

    `requests` lists `(method, path, headers)` in arrival order.
    """

    protocol_version = "HTTP/1.0"  # one request per connection

    def __init__(self, routes: Mapping[str, Reply | Handler] | None = None, port: int = 0) -> None:
        self.routes: dict[str, Reply | Handler] = dict(routes or {})
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (still known after `stop`)."""
        assert self._port, "not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths_requested(self) -> list[str]:
        with self.lock:
            return [path for _, path, _ in self.requests]

    def count(self, method: str, path: str) -> int:
        """How many `method` requests for `path` arrived."""
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == method and p == path)

    def respond(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply | Handler:
        """The answer to one request (called holding `lock`): its route, else `NOT_FOUND`."""
        return self.routes.get(path, NOT_FOUND)

    def start(self) -> Self:
        """Start serving (nothing happens when it already does)."""
        if self._server is not None:
            return self
        self.release.clear()
        server = _Server(("127.0.0.1", self._port), _RequestHandler)
        server.fake = self
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
