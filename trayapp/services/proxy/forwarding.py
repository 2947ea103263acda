"""A response body forwarded from the upstream's reads themselves: each read is de-framed, written to
the client and shown to the recorder inside the event loop's callback that received it, not buffered
for a task to wake and read (one pass of the loop a chunk, not two: a token's hop, issue #26).

The client side still pushes back: when the client's send buffer passes its high-water mark, the
upstream's reading pauses until the client drains (within limits.SEND_STALL_TIMEOUT_S)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from trayapp.services.proxy.exchange import Cut, drain
from trayapp.services.proxy.http1 import BodyFramer, FramingError
from trayapp.services.proxy.limits import READ_BYTES
from trayapp.services.proxy.reading import ForwardingReader

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
        self._upstream = upstream
        self._on_payload: Payload | None = None  # until `deliver_to`, payloads are held
        self._held: list[tuple[bytes, float]] = []
        self._on_bad_chunk = on_bad_chunk
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._draining: asyncio.Task[None] | None = None
        self._high_water_bytes = client.transport.get_write_buffer_limits()[1]

    def received(self, data: bytes) -> None:
        """One read from the upstream: its body bytes to the client, its payload to the recorder."""
        if self.done.done():
            return  # what follows the body's end (nothing a server sends unasked) is dropped
        try:
            self._forward(data, time.monotonic())  # received before forwarded: the client may read it at once
        except Exception as exc:  # a bug: the pump's task raises it, as a read's would
            if not self.done.done():
                self.done.set_exception(exc)

    def _forward(self, data: bytes, received_mono_s: float) -> None:
        transport = self.client.transport
        if transport.is_closing():
            self.done.set_exception(Cut("the client went away"))
            return
        try:
            used, payload = self._framer.feed(data)
        except FramingError as exc:  # a malformed chunk after the head went out: cut the response
            self._on_bad_chunk(exc)
            self.done.set_exception(Cut(str(exc)))
            return
        transport.write(data[:used] if used < len(data) else data)
        if payload and self._on_payload is not None:
            self._on_payload(payload, received_mono_s)
        elif payload:
            self._held.append((payload, received_mono_s))
        if self._framer.done:
            self.done.set_result(True)
        elif self._draining is None and transport.get_write_buffer_size() > self._high_water_bytes:
            self._upstream.pause_reading()  # the client reads slower than the server writes
            self._draining = asyncio.ensure_future(self._resume_when_drained())

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


async def forward_body(reader: ForwardingReader, forwarder: BodyForwarder) -> bool:
    """Forward the rest of a response body through `forwarder` (the bytes read with the head went to
    `forwarder.received` already); what `forwarder.done` gives, once the client's buffer is below its
    high-water mark (as after any write)."""
    try:
        while reader.has_buffered_bytes() and not forwarder.done.done():
            forwarder.received(await reader.read(READ_BYTES))  # buffered: no wait
        if reader.at_eof() or reader.exception() is not None:
            forwarder.ended(reader.exception())
        elif not forwarder.done.done():
            reader.forwarder = forwarder
        reusable = await forwarder.done
        await drain(forwarder.client)
        return reusable
    finally:
        reader.forwarder = None
        forwarder.stop()
