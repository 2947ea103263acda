"""An answer forwarded from the upstream's reads themselves: its head is read, checked and written to
the client, and each read of its body de-framed, written to the client and shown to the recorder,
inside the event loop's callback that received it, not buffered for a task to wake and read (one
pass of the loop a hop, not two: issue #26).

The client side still pushes back: when the client's send buffer passes its high-water mark, the
upstream's reading pauses until the client drains (within limits.SEND_STALL_TIMEOUT_S)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from trayapp.services.proxy.exchange import Cut, Exchange, Upstream, UpstreamFailed, drain
from trayapp.services.proxy.http1 import BodyFramer, FramingError, Head, parse_head, response_body, status_of
from trayapp.services.proxy.reading import ForwardingReader, HeadBuffer

Payload = Callable[[bytes, float], None]  # (de-framed body bytes, time.monotonic() when received)
BadChunk = Callable[[FramingError], None]


class BodyForwarder:
    """One response body, upstream → client: `done` is True when the body ended where the connection
    may carry another request, False when it ended with the connection (a body without a length);
    Cut when the upstream closed mid-body, sent a malformed chunk, or the client went away."""

    def __init__(
        self,
        framer: BodyFramer,
        client: asyncio.StreamWriter,
        upstream: asyncio.Transport,
        on_bad_chunk: BadChunk,
    ) -> None:
        self._framer = framer
        self.client = client
        self._client_transport = client.transport  # read once: StreamWriter.transport is a property
        self._upstream = upstream
        self._on_payload: Payload | None = None  # until `deliver_to`, payloads are held
        self._held: list[tuple[bytes, float]] = []
        self._on_bad_chunk = on_bad_chunk
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._draining: asyncio.Task[None] | None = None
        self._high_water_bytes = self._client_transport.get_write_buffer_limits()[1]

    def received(self, data: bytes) -> None:
        """One read from the upstream: its body bytes to the client, its payload to the recorder (one
        call a read: the hop of every token, issue #26)."""
        done = self.done
        if done.done():
            return  # what follows the body's end (nothing a server sends unasked) is dropped
        received_mono_s = time.monotonic()  # received before forwarded: the client may read it at once
        transport = self._client_transport
        try:
            if transport.is_closing():
                done.set_exception(Cut("the client went away"))
                return
            try:
                used, payload = self._framer.feed(data)
            except FramingError as exc:  # a malformed chunk after the head went out: cut the response
                self._on_bad_chunk(exc)
                done.set_exception(Cut(str(exc)))
                return
            transport.write(data[:used] if used < len(data) else data)
            if payload and self._on_payload is not None:
                self._on_payload(payload, received_mono_s)
            elif payload:
                self._held.append((payload, received_mono_s))
            if self._framer.done:
                done.set_result(True)
            elif self._draining is None and transport.get_write_buffer_size() > self._high_water_bytes:
                self._upstream.pause_reading()  # the client reads slower than the server writes
                self._draining = asyncio.ensure_future(self._resume_when_drained())
        except Exception as exc:  # a bug: the pump's task raises it, as a read's would
            if not done.done():
                done.set_exception(exc)

    def deliver_to(self, on_payload: Payload) -> None:
        """The payloads forwarded so far (the bytes read with the head, forwarded before the recorder
        was told the head), then every next one, to `on_payload`."""
        held, self._held = self._held, []
        for payload, received_mono_s in held:
            on_payload(payload, received_mono_s)
        self._on_payload = on_payload

    def ended(self, exc: Exception | None) -> None:
        """The upstream closed (`exc`: with an error)."""
        if self.done.done():
            return
        if self._framer.until_close:  # its end, reset or not (as a read that fails ends it)
            self.done.set_result(False)
        else:
            self.done.set_exception(Cut("upstream closed mid-response"))

    async def _resume_when_drained(self) -> None:
        try:
            await drain(self.client)
        except Cut as exc:
            if not self.done.done():
                self.done.set_exception(exc)
            return
        self._draining = None
        if not self.done.done():
            self._upstream.resume_reading()

    def stop(self) -> None:
        if self._draining is not None:
            self._draining.cancel()
        if not self.done.done():
            self.done.cancel()
        else:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                self.done.exception()  # read: no "exception was never retrieved" for a Cut nobody awaited


@dataclass
class Answer:
    """An answer's head, as forwarded to the client."""

    head: Head
    status: int
    received_mono_s: float  # time.monotonic() when its last byte came
    body: BodyForwarder | None  # None: an answer without a body
    trailing: bool  # bytes came after an answer without a body: the connection is not reused


class HeadForwarder:
    """An answer's head, upstream → client, inside the read callback that completes it, from the moment
    the request went up (whatever the pump's task is doing): checked (its status, how its body is
    framed) before a byte of it reaches the client, written (an interim 1xx head too, then the next is
    read), and the body's bytes read with it handed to a BodyForwarder, which the upstream's reads then
    go to. `exchange.status`: the last status forwarded."""

    def __init__(
        self,
        method: str,
        exchange: Exchange,
        client: asyncio.StreamWriter,
        upstream: Upstream,
        on_bad_chunk: BadChunk,
    ) -> None:
        self._method = method
        self._exchange = exchange
        self._client = client
        self._upstream = upstream.transport
        self._on_bad_chunk = on_bad_chunk
        self._buffer = HeadBuffer()
        self._claimed = False  # the answer went to the pump (which then stops its body)
        self.answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._reader = upstream.stream
        self._reader.attach(self)

    async def forwarded(self) -> Answer:
        """The answer's head once it went to the client; UpstreamFailed when the upstream closed
        before one (`answered_nothing`: not a byte of answer went out) or sent a malformed one."""
        answer = await self.answer
        self._claimed = True
        return answer

    def stop(self) -> None:
        """No longer wanted (the exchange ends): the upstream's reads are left alone, and a body
        forwarder begun for no pump is stopped."""
        if self._reader.forwarder is self:
            self._reader.forwarder = None
        if not self.answer.done():
            self.answer.cancel()
        elif not self.answer.cancelled() and self.answer.exception() is None:  # read: never unretrieved
            body = self.answer.result().body
            if body is not None and not self._claimed:
                if self._reader.forwarder is body:
                    self._reader.forwarder = None
                body.stop()

    def received(self, data: bytes) -> None:
        if self.answer.done():
            return
        try:
            self._take(data, time.monotonic())
        except FramingError as exc:
            self._fail(UpstreamFailed(f"sent a malformed response ({exc})"))
        except Exception as exc:  # a bug: the pump's task raises it, as a read's would
            self._fail(exc)

    def _take(self, data: bytes, received_mono_s: float) -> None:
        while True:
            whole = self._buffer.add(data)
            if whole is None:
                return
            raw, data = whole
            head = parse_head(raw)
            status = status_of(head)
            framer = response_body(head, self._method, status)  # checked before a byte reaches the client
            self._client.transport.write(head.raw)
            self._exchange.status = status
            if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): forwarded, the next read
                self._buffer = HeadBuffer()
                continue
            body = None
            if not framer.done:
                body = BodyForwarder(framer, self._client, self._upstream, self._on_bad_chunk)
                if data:
                    body.received(data)
                self._reader.forwarder = body
            else:
                self._reader.forwarder = None
            trailing = bool(data) and body is None
            self.answer.set_result(Answer(head, status, received_mono_s, body, trailing))
            return

    def ended(self, exc: Exception | None) -> None:
        """The upstream closed (`exc`: with an error) before the head was whole."""
        if self.answer.done():
            return
        nothing = self._exchange.status is None
        if self._buffer.started():
            cut = "sent a malformed response (connection closed in the middle of a head)"
            self._fail(UpstreamFailed(cut))
        elif exc is None:
            self._fail(UpstreamFailed("closed the connection without answering", nothing))
        elif isinstance(exc, ConnectionError):
            self._fail(UpstreamFailed(f"closed the connection ({exc})", nothing))
        else:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._reader.forwarder is self:
            self._reader.forwarder = None
        if not self.answer.done():
            self.answer.set_exception(exc)


async def forward_body(reader: ForwardingReader, forwarder: BodyForwarder) -> bool:
    """Forward the rest of a response body (`forwarder` gets the upstream's reads since its head
    came); what `forwarder.done` gives, once the client's buffer is below its high-water mark (as after
    any write)."""
    try:
        reusable = await forwarder.done
        await drain(forwarder.client)
        return reusable
    finally:
        reader.forwarder = None
        forwarder.stop()
