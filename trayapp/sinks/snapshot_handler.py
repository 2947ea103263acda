"""The snapshot endpoint's request handler (sinks/snapshot_server.py): GET the latest documents and the
event stream, POST records and bench results to the sampler's monitor; every answer short JSON."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from trayapp.core.json_limits import json_problem
from trayapp.core.loopback import is_loopback
from trayapp.core.text import format_snapshot, format_watch_line
from trayapp.sinks.listener import GuardedHandler
from trayapp.sinks.sampler_file import BENCH_PATH, MAX_POST_BYTES, RECORDS_PATH
from trayapp.sinks.wire import WireError, from_wire, parse_records

if TYPE_CHECKING:  # snapshot_server imports this module for its handler
    from trayapp.sinks.snapshot_server import SnapshotServer

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0  # a whole request (line, headers, body) within this of connecting or the last answer
SEND_TIMEOUT_S = 10.0  # an answer not taken by the client within this: the connection is dropped
STREAM_SNDBUF = 16 * 1024  # an event stream's socket send buffer: small, so a client that does not read shows
KEEPALIVE_S = 15.0  # an SSE comment this often while nothing happens


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def sse(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"  # JSON has no raw newline


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class SnapshotHandler(GuardedHandler):
    owner: SnapshotServer
    request_timeout_s = REQUEST_TIMEOUT_S
    send_timeout_s = SEND_TIMEOUT_S

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        retry_after_s: int | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="llm-tray"')
        if retry_after_s is not None:
            self.send_header("Retry-After", str(retry_after_s))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        self._send(status, json_bytes({"error": message}), retry_after_s=retry_after_s)

    reply_error = _error  # the listener's refusals (Host, Origin) in the same form

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's errors (bad request line, too long, ...) as short JSON, with a status line."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # garbage parsed as HTTP/0.9 still gets a status line
        with contextlib.suppress(OSError):  # the client may be gone already
            self._error(code, message or "bad request")

    def _authorized(self) -> bool:
        token = self.owner.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def do_GET(self) -> None:
        if not self._authorized():
            self._error(401, "unauthorized: send Authorization: Bearer <token>")
            return
        parts = urlsplit(self.path)
        if parts.path == "/v1/events":
            self._events()
            return
        if parts.path not in ("/v1/snapshot", "/v1/glance"):
            self._error(404, "not found: /v1/snapshot, /v1/glance, /v1/events")
            return
        latest = self.owner.latest()
        if latest is None:
            self._error(503, "no snapshot yet")
            return
        if parts.path == "/v1/glance":
            self._send(200, latest.glance)
            return
        fmt = parse_qs(parts.query).get("format", ["json"])[0]
        if fmt == "text":
            self._send(200, format_snapshot(latest.snapshot).encode(), "text/plain; charset=utf-8")
        elif fmt == "line":
            self._send(200, format_watch_line(latest.snapshot).encode(), "text/plain; charset=utf-8")
        else:
            self._send(200, latest.doc)

    def _refuse(self) -> None:
        self.close_connection = True  # its body, if any, is not read
        if not self._authorized():
            self._error(401, "unauthorized: send Authorization: Bearer <token>")
        else:
            self._error(405, f"only GET, and POST to {RECORDS_PATH} or {BENCH_PATH}")

    do_PUT = do_DELETE = do_PATCH = _refuse

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path not in (RECORDS_PATH, BENCH_PATH):
            self._refuse()
            return
        self.close_connection = True  # one post per connection: a refused body is never read
        if not self._authorized():
            self._error(401, "unauthorized: send Authorization: Bearer <token>")
            return
        if not is_loopback(str(self.client_address[0]).removeprefix("::ffff:")):  # v4-mapped too
            self._error(403, "records are taken from this machine only (loopback)")
            return
        body = self._body()
        if body is None:
            return
        intake = self.owner.intake()
        if intake is None:
            message = f"the {self.owner.role} is starting: no monitor to take it yet, try again"
            self._error(503, message, retry_after_s=1)  # a forwarder asks again (sampler_file.py)
            return
        try:
            if path == RECORDS_PATH:
                self._take_records(intake, body)
            else:
                self._take_bench(intake, body)
        except WireError as exc:
            self._error(400, f"invalid body: {exc}")
        except Exception:  # a bug here must not end the endpoint, nor leave the client waiting
            log.exception("snapshot endpoint: POST %s failed", path)
            self._error(500, "internal error (logged)")

    def _body(self) -> Any | None:
        """The request's JSON body (None, after answering 4xx, when it is not one)."""
        if self.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json":
            self._error(415, "send Content-Type: application/json")
            return None
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._error(411, "send Content-Length")
            return None
        if not length_text.strip().isdigit():
            self._error(400, "invalid Content-Length")
            return None
        length = int(length_text)
        if length > MAX_POST_BYTES:
            self._error(413, f"body over {MAX_POST_BYTES} bytes: send fewer records per post")
            return None
        data = self.rfile.read(length)  # a client this slow is dropped (socket timeout)
        if len(data) != length:
            self._error(400, "body shorter than its Content-Length")
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._error(400, f"invalid JSON: {exc}")
            return None
        problem = json_problem(text)  # nesting and value count, before parsing (core/json_limits.py)
        if problem is not None:
            self._error(413 if "large" in problem else 400, problem.replace("answer", "body", 1))
            return None
        try:
            return json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            self._error(400, f"invalid JSON: {exc}")
            return None

    def _take_records(self, intake: object, body: Any) -> None:
        accept = getattr(intake, "accept_proxy_records", None)
        if accept is None:
            self._error(503, f"this {self.owner.role} takes no proxy records")
            return
        upstreams, lease_s, records = parse_records(body)
        unwatched, recording = accept(upstreams, lease_s, records)
        answer = {"accepted": len(records), "unwatched": unwatched, "recording": recording}
        self._send(202, json_bytes(answer))

    def _take_bench(self, intake: object, body: Any) -> None:
        from trayapp.core.bench import BenchResult

        record_bench = getattr(intake, "record_bench", None)
        if not isinstance(body, dict) or set(body) != {"bench"}:
            raise WireError('an object {"bench": {...}}')
        result = from_wire(BenchResult, body["bench"], "bench")
        done = record_bench(result) if record_bench is not None else None
        if done is None:
            self._error(409, f"this {self.owner.role} does not record (another process holds the store)")
            return
        stored, note = done
        self._send(200, json_bytes({"stored": stored, "note": note}))

    def _events(self) -> None:
        owner = self.owner
        if not owner._stream_slot(+1):
            self._error(503, "too many event streams")
            return
        try:
            # A client that does not read fills this small buffer, then a write waits STREAM_STALL_S and
            # the stream is dropped, its slot freed (the client's own receive buffer comes first).
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
            self.send_timeout_s = owner.stream_stall_s
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            with owner._cond:  # the state now and the number of the last event, together
                latest, seq = owner._latest, owner._seq
            first = [b"retry: 2000\n\n"]
            if latest is not None:  # the state now, then every change
                first += [sse("snapshot", latest.doc), sse("glance", latest.glance)]
            self.wfile.write(b"".join(first))
            self.wfile.flush()
            while True:
                got = owner._next_events(seq, KEEPALIVE_S)
                if got is None:
                    return
                seq, events = got
                self.wfile.write(b"".join(events) if events else b": keepalive\n\n")
                self.wfile.flush()
        except OSError:  # the client went away, or stopped reading for STREAM_STALL_S
            return
        finally:
            owner._stream_slot(-1)
