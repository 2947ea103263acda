"""The pass-through pump: one asyncio listener per route, every byte forwarded as it arrives.

Per client connection there is one upstream connection (kept alive while both sides allow).
Per request two tasks run side by side: the client side (the request body, then a watch for
the client hanging up) and the response pump (upstream → client, chunk by chunk, each read
written and drained before the next). When the client hangs up at any stage — before the
first byte, mid-stream, during a non-streaming request — the upstream connection is closed,
which is how every server here learns to stop generating. The recorder tap sees de-framed
payload as it passes and never holds it; a recorder bug is logged and never breaks a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from trayapp.core.loopback import is_loopback
from trayapp.core.model import FinishedRequest
from trayapp.core.redact import redact_url
from trayapp.services.proxy.http1 import (
    MAX_HEAD_BYTES,
    BodyFramer,
    FramingError,
    Head,
    RequestLine,
    parse_head,
    request_body,
    response_body,
    status_of,
)
from trayapp.services.proxy.prompt_length import PromptBoard, PromptCounter
from trayapp.services.proxy.recorder import RequestTap

log = logging.getLogger(__name__)

READ_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Route:
    """Listen on `listen_host:listen_port`, forward to `upstream_url` (a server of `server_kind`)."""

    listen_host: str
    listen_port: int
    upstream_url: str
    server_kind: str = "openai"
    token: str | None = None  # required from clients when set (always set off loopback)

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"upstream must be an http:// URL (local servers speak plain HTTP): {self.upstream_url}"
            )
        if not is_loopback(self.listen_host) and not self.token:
            raise ValueError(f"listening on {self.listen_host} (not loopback) needs a token")

    @property
    def upstream_host(self) -> str:
        return urlsplit(self.upstream_url).hostname or "127.0.0.1"

    @property
    def upstream_port(self) -> int:
        return urlsplit(self.upstream_url).port or 80


RecordSink = Callable[[Route, FinishedRequest], None]


class _Reader:
    """A StreamReader with a push-back buffer (bytes read past the end of one message)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.pending = b""

    async def read_some(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await self.reader.read(READ_BYTES)

    def unread(self, data: bytes) -> None:
        if data:
            self.pending = data + self.pending

    async def read_head(self) -> Head | None:
        """The next message head; None when the peer closed before sending one."""
        buffer = b""
        while True:
            buffer = buffer.lstrip(b"\r\n")  # empty lines before a request line are allowed
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                self.unread(buffer[end + 4 :])
                return parse_head(buffer[: end + 4])
            if len(buffer) > MAX_HEAD_BYTES:
                raise FramingError("head larger than 64 KiB")
            data = await self.read_some()
            if not data:
                if buffer:
                    raise FramingError("connection closed in the middle of a head")
                return None
            buffer += data


@dataclass
class _Upstream:
    reader: _Reader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        return not (self.reader.reader.at_eof() or self.writer.transport.is_closing())

    def close(self) -> None:
        self.writer.close()


class _Cut(Exception):
    """The response was cut short: the client hung up, or the upstream closed mid-body."""


@dataclass
class _Exchange:
    """What one request's pump has done so far."""

    status: int | None = None  # the response status forwarded to the client
    complete: bool = False  # the whole response reached the client


class _UpstreamFailed(Exception):
    """The upstream could not be reached, or closed before answering."""


def _error_response(status: int, reason: str, message: str, kind: str, **extra: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, **extra}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class ProxyServer:
    """One route's listener. `start()` binds; `close()` stops listening and ends open streams."""

    def __init__(self, route: Route, on_record: RecordSink, prompts: PromptBoard | None = None) -> None:
        self.route = route
        self.on_record = on_record
        self._prompts = PromptCounter(prompts, route.upstream_url, route.server_kind)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._recorder_failed = False
        self.port = route.listen_port

    @property
    def listen_url(self) -> str:
        host = self.route.listen_host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, self.route.listen_host, self.route.listen_port, limit=READ_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "proxy listening on %s -> %s (%s)",
            self.listen_url,
            redact_url(self.route.upstream_url),
            self.route.server_kind,
        )

    def cancel_connections(self) -> None:
        for task in list(self._connections):
            task.cancel()

    async def close(self) -> None:
        if self._server is not None:
            # Stop accepting first and let connections accepted a moment ago get their transports:
            # Python 3.11's Server.close() would otherwise fail those ("assert self._sockets is not
            # None" in Server._attach) and leave their sockets open.
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            for _ in range(3):
                await asyncio.sleep(0)
            self._server.close()
        self.cancel_connections()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
        await self._prompts.close()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        client = _Reader(reader)
        upstream: _Upstream | None = None
        try:
            while True:
                try:
                    head = await client.read_head()
                except FramingError as exc:
                    writer.write(_error_response(400, "Bad Request", str(exc), "bad_request"))
                    break
                if head is None:
                    break
                keep, upstream = await self._serve(head, client, writer, upstream)
                if not keep:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            if upstream is not None:
                upstream.close()
            writer.close()  # before any await: a cancel arriving now must not leave a socket open
            for closing in (writer, upstream.writer if upstream is not None else None):
                if closing is not None:  # the transport flushes what it holds, then closes
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await asyncio.wait_for(closing.wait_closed(), CLOSE_TIMEOUT_S)

    def _authorized(self, head: Head) -> Head | None:
        """The head to forward when the client may use the proxy (our token removed), else None."""
        token = self.route.token
        if token is None:
            return head
        for name in ("proxy-authorization", "authorization"):
            value = head.get(name) or ""
            scheme, _, credential = value.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(credential.strip(), token):
                return _without_header(head, name)
        return None

    async def _open_upstream(self) -> _Upstream:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.route.upstream_host, self.route.upstream_port, limit=READ_BYTES),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise _UpstreamFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
        return _Upstream(_Reader(reader), writer)

    async def _serve(
        self, head: Head, client: _Reader, writer: asyncio.StreamWriter, upstream: _Upstream | None
    ) -> tuple[bool, _Upstream | None]:
        """One request → (keep the client connection, the upstream connection to reuse)."""
        try:
            line = RequestLine.of(head)
            framer = request_body(head)
        except FramingError as exc:
            writer.write(_error_response(400, "Bad Request", str(exc), "bad_request"))
            return False, upstream
        forwarded = self._authorized(head)
        if forwarded is None:
            writer.write(
                _error_response(
                    401, "Unauthorized", "llm-tray proxy: a bearer token is required", "unauthorized"
                )
            )
            return False, upstream
        tap = self._tap(line)
        if upstream is None or not upstream.usable():
            if upstream is not None:
                upstream.close()
            try:
                upstream = await self._open_upstream()
            except _UpstreamFailed as exc:
                upstream_name = redact_url(self.route.upstream_url)
                message = f"llm-tray proxy: upstream {upstream_name} unreachable ({exc})"
                writer.write(
                    _error_response(
                        502, "Bad Gateway", message, "upstream_unreachable", upstream=upstream_name
                    )
                )
                self._record(tap, status=502, aborted=False)
                return False, None
        upstream.writer.write(forwarded.raw)
        exchange = _Exchange()
        auth = dict((k.lower(), v) for k, v in forwarded.headers).get("authorization")
        client_side = asyncio.create_task(self._client_side(client, framer, upstream, tap, auth))
        response = asyncio.create_task(self._pump_response(upstream, writer, tap, line.method, exchange))
        keep = False
        try:
            await asyncio.wait({client_side, response}, return_when=asyncio.FIRST_COMPLETED)
            if not response.done() and client_side.done() and client_side.result() == "gone":
                response.cancel()  # the client hung up first: closing the upstream stops the server
            else:
                keep = await response
                exchange.complete = True
        except (_Cut, ConnectionError):
            pass
        except _UpstreamFailed as exc:
            if exchange.status is None:
                name = redact_url(self.route.upstream_url)
                message = f"llm-tray proxy: upstream {name} {exc}"
                writer.write(_error_response(502, "Bad Gateway", message, "upstream_failed", upstream=name))
                exchange.status = 502
        finally:
            if not client_side.done():
                client_side.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await client_side
            if not response.done():
                response.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await response
        self._record(
            tap, status=exchange.status if exchange.status == 502 else None, aborted=not exchange.complete
        )
        if not (exchange.complete and keep and framer.done):
            upstream.close()
            return False, None
        return head.keep_alive(), upstream

    def _tap(self, line: RequestLine) -> RequestTap:
        return RequestTap(
            server_kind=self.route.server_kind,
            method=line.method,
            path=line.path,
            started_mono_s=time.monotonic(),
            started_wall_s=time.time(),
        )

    def _record(self, tap: RequestTap, *, status: int | None, aborted: bool) -> None:
        if not tap.active:
            return
        self._prompts.prompt_read(tap)
        try:
            if status is not None:
                tap.response_head(status, {}, time.monotonic())
            record = tap.finish(now_mono_s=time.monotonic(), now_wall_s=time.time(), aborted=aborted)
            if record is not None:
                self.on_record(self.route, record)
        except Exception:
            self._recorder_bug()

    def _recorder_bug(self) -> None:
        if not self._recorder_failed:
            self._recorder_failed = True
            log.exception("proxy recorder failed (the stream is forwarded unrecorded)")

    async def _client_side(
        self, client: _Reader, framer: BodyFramer, upstream: _Upstream, tap: RequestTap, auth: str | None
    ) -> str:
        """Forward the request body, then watch the client: "gone" when it hangs up, "more" when it
        sends the next request early (kept for the next round)."""
        while not framer.done:
            data = await client.read_some()
            if not data:
                return "gone"
            try:
                used, payload = framer.feed(data)
            except FramingError:
                return "gone"
            upstream.writer.write(data[:used] if used < len(data) else data)
            client.unread(data[used:])
            self._feed(tap.request_body, payload)
            if framer.done:  # before the drain: the response head (which ends the copy) may come then
                self._feed(self._prompts.request_sent, tap, auth)
            await upstream.writer.drain()
        data = await client.read_some()
        if not data:
            return "gone"
        client.unread(data)
        return "more"

    def _feed(self, method: Callable[..., None], *args: object) -> None:
        try:
            method(*args)
        except Exception:
            self._recorder_bug()

    async def _pump_response(
        self,
        upstream: _Upstream,
        writer: asyncio.StreamWriter,
        tap: RequestTap,
        method: str,
        exchange: _Exchange,
    ) -> bool:
        """Forward one response; True when the upstream connection may carry another request."""
        while True:
            try:
                head = await upstream.reader.read_head()
            except FramingError as exc:
                raise _UpstreamFailed(f"sent a malformed response ({exc})") from exc
            except ConnectionError as exc:
                raise _UpstreamFailed(f"closed the connection ({exc})") from exc
            if head is None:
                raise _UpstreamFailed("closed the connection without answering")
            status = status_of(head)
            writer.write(head.raw)
            exchange.status = status
            if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): forward, read the next
                await self._drain(writer)
                continue
            break
        headers = {name.lower(): value for name, value in head.headers}
        self._feed(tap.response_head, status, headers, time.monotonic())
        framer = response_body(head, method)
        await self._drain(writer)
        while not framer.done:
            try:
                data = await upstream.reader.read_some()
            except ConnectionError:
                data = b""
            received_mono_s = time.monotonic()  # before forwarding: the client may read it at once
            if not data:
                if framer.until_close:
                    return False
                raise _Cut("upstream closed mid-response")  # the client sees the cut at once: we close too
            used, payload = framer.feed(data)
            writer.write(data[:used] if used < len(data) else data)
            if payload:
                self._feed(tap.response_body, payload, received_mono_s)
                if self._prompts.pending and tap.first_text_mono_s is not None:
                    self._prompts.prompt_read(tap)
            await self._drain(writer)
        return head.keep_alive()

    @staticmethod
    async def _drain(writer: asyncio.StreamWriter) -> None:
        try:
            await writer.drain()
        except ConnectionError as exc:
            raise _Cut(str(exc)) from exc


def _without_header(head: Head, name: str) -> Head:
    headers = tuple((key, value) for key, value in head.headers if key.lower() != name)
    raw = head.start_line + "\r\n" + "".join(f"{key}: {value}\r\n" for key, value in headers) + "\r\n"
    return Head(head.start_line, headers, raw.encode("latin-1"))
