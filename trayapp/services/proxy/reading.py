"""Reading a client or upstream connection for the proxy: message heads with deadlines, bytes
pushed back, a read bounded in time, the upstream's reader that hands a response body's reads to its
forwarder (forwarding.py), and the proxy's own error answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from trayapp.services.proxy.http1 import FramingError, Head, parse_head
from trayapp.services.proxy.limits import MAX_HEAD_BYTES, READ_BYTES


class ReadTarget(Protocol):
    """What a `ForwardingReader` hands its reads to (forwarding.py: an answer's head, then its body)."""

    def received(self, data: bytes) -> None: ...

    def ended(self, exc: Exception | None) -> None: ...


class ForwardingReader(asyncio.StreamReader):
    """A StreamReader that hands its reads to a `ReadTarget` while one is attached (an answer's head,
    then its body), and buffers them for `read` as usual otherwise (between answers)."""

    forwarder: ReadTarget | None = None

    def attach(self, target: ReadTarget) -> None:
        """Hand every read to `target` from now on: the bytes buffered so far first, then the
        connection's end if it came (to whichever target is attached by then: a head's target hands
        the reads after it to its body's)."""
        self.forwarder = target
        buffer: bytearray = self._buffer  # type: ignore[attr-defined]  # asyncio's own (all versions)
        buffered = bytes(buffer)
        buffer.clear()
        if buffered:
            self._maybe_resume_transport()  # type: ignore[attr-defined]  # paused by a full buffer
            target.received(buffered)
        ended = self._eof or self.exception() is not None  # type: ignore[attr-defined]
        if ended and self.forwarder is not None:
            self.forwarder.ended(self.exception())

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # asyncio feeds bytes
        forwarder = self.forwarder
        if forwarder is None:
            super().feed_data(data)
        else:
            forwarder.received(data)

    def feed_eof(self) -> None:
        super().feed_eof()
        if self.forwarder is not None:
            self.forwarder.ended(None)

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        if self.forwarder is not None:
            self.forwarder.ended(exc)


class ForwardingProtocol(asyncio.StreamReaderProtocol):
    """asyncio's StreamReaderProtocol over a ForwardingReader, each read handed straight to the
    reader's target while one is attached (two calls fewer a read on a token's path: issue #26)."""

    def __init__(
        self,
        reader: ForwardingReader,
        connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(reader, connected, loop=loop)
        self._forwarding_reader = reader  # held as long as its connection (asyncio's own ref is weak)

    def data_received(self, data: bytes) -> None:
        target = self._forwarding_reader.forwarder
        if target is not None:
            target.received(data)
        else:
            self._forwarding_reader.feed_data(data)


class Reader:
    """A StreamReader with a push-back buffer (bytes read past the end of one message)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.pending = b""

    async def read_some(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await self.reader.read(READ_BYTES)

    async def read_within(self, seconds: float) -> bytes:
        """`read_some`, or asyncio.TimeoutError after `seconds`. A timer that cancels this task, not
        `asyncio.wait_for`, which on Python < 3.12 runs each read as a task of its own (it cost the
        proxy's first token ~0.1 ms a request)."""
        if self.pending:
            return await self.read_some()
        return await within(self.reader.read(READ_BYTES), seconds)

    def has_unread_bytes(self) -> bool:
        """Bytes received and not parsed yet: pushed back here, or buffered by asyncio."""
        return bool(self.pending) or bool(getattr(self.reader, "_buffer", b""))

    def unread(self, data: bytes) -> None:
        if data:
            self.pending = data + self.pending

    def whole_head(self) -> bytes | None:
        """The next message head's bytes when all of them have been read already (a new connection's
        first request, which came before its task ran; a next request read while its client was
        watched), taken at once: no watch, no timer, no wait (issue #26). The bytes after it are pushed
        back. None, nothing taken: not whole yet."""
        stream = self.reader
        buffer: bytearray = stream._buffer  # type: ignore[attr-defined]  # asyncio's own (all versions)
        if b"\r\n\r\n" not in buffer and b"\r\n\r\n" not in self.pending:
            return None  # (an end split between the two is found by `read_head`)
        whole = HeadBuffer().add(self.pending + buffer)
        if whole is None:
            return None
        raw, self.pending = whole
        buffer.clear()
        stream._maybe_resume_transport()  # type: ignore[attr-defined]  # paused by a full buffer
        return raw

    async def read_head(
        self,
        first_byte_s: float | None = None,
        whole_s: float | None = None,
        on_head: Callable[[bytes], Head] | None = None,
    ) -> Head | None:
        """The next message head, read inside the reads that bring it (`HeadWatch`); None when the
        peer closed before sending one. `first_byte_s`: the head must start within it (else `Idle`);
        `whole_s`: the head must be complete within it, counted from its first byte (else `SlowHead`).
        None: no limit. `on_head`: called with the head's bytes inside the read that completes it, in
        place of `parse_head` (the proxy sends a usual request up before parsing it)."""
        watch = HeadWatch(self, first_byte_s, whole_s, on_head)
        try:
            return await watch.head
        finally:
            watch.stop()


class HeadWatch:
    """The next message head on a connection read by a ForwardingReader, taken from the reads as they
    come (no task woken per read); `on_head` (else `parse_head`) makes the head of its bytes inside the
    read that completes it, before the waiting task wakes (the proxy sends a request up there: issue
    #26). The bytes after the head are pushed back for the task."""

    def __init__(
        self,
        client: Reader,
        first_byte_s: float | None,
        whole_s: float | None,
        on_head: Callable[[bytes], Head] | None,
    ) -> None:
        stream = client.reader
        assert isinstance(stream, ForwardingReader)  # the proxy's connections all read through one
        loop = asyncio.get_running_loop()
        self._client, self._stream, self._loop = client, stream, loop
        self._whole_s, self._on_head = whole_s, on_head or parse_head
        self._buffer = HeadBuffer()
        self.head: asyncio.Future[Head | None] = loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._waits_for_first_byte = first_byte_s is not None  # then whole_s runs from the first byte
        if first_byte_s is not None:
            self._timer = loop.call_later(first_byte_s, self._expire, Idle)
        elif whole_s is not None:
            self._timer = loop.call_later(whole_s, self._expire, SlowHead)
        pending, client.pending = client.pending, b""
        if pending:
            self.received(pending)
        if not self.head.done():
            stream.attach(self)

    def received(self, data: bytes) -> None:
        if self.head.done():
            return
        started = self._buffer.started()
        try:
            whole = self._buffer.add(data)
        except FramingError as exc:
            self._end(exc)
            return
        if whole is None:
            if not started and self._buffer.started() and self._waits_for_first_byte:
                self._restart_timer(self._whole_s, SlowHead)  # whole within whole_s of its first byte
            return
        raw, rest = whole
        self._detach()
        self._client.unread(rest)  # the body's first bytes, or the next request
        try:
            head = self._on_head(raw)
        except Exception as exc:  # FramingError (a 400), or a bug: the waiting task raises it
            self._end(exc)
            return
        self._end(None, head)

    def ended(self, exc: Exception | None) -> None:
        if exc is not None:
            self._end(exc)
        elif self._buffer.started():
            self._end(FramingError("connection closed in the middle of a head"))
        else:
            self._end(None, None)

    def stop(self) -> None:
        """The task no longer waits (cancelled, or done)."""
        self._detach()
        if self._timer is not None:
            self._timer.cancel()
        if not self.head.done():
            self.head.cancel()

    def _restart_timer(self, seconds: float | None, failure: type[Exception]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if seconds is None else self._loop.call_later(seconds, self._expire, failure)

    def _expire(self, failure: type[Exception]) -> None:
        self._end(failure())

    def _detach(self) -> None:
        if self._stream.forwarder is self:
            self._stream.forwarder = None

    def _end(self, exc: BaseException | None, head: Head | None = None) -> None:
        self._detach()
        if self._timer is not None:
            self._timer.cancel()
        if self.head.done():
            return
        if exc is not None:
            self.head.set_exception(exc)
        else:
            self.head.set_result(head)


class HangUpWatch:
    """The client's side of an exchange whose request body came whole with its head, watched from the
    read callbacks (no task, no wait a request: issue #26): the client hanging up cancels `response`
    (the pump; closing the upstream then stops the server generating), and its first bytes of a next
    request end the watch, kept for that request (as the client side's "more")."""

    def __init__(self, client: Reader, response: asyncio.Future[bool]) -> None:
        stream = client.reader
        assert isinstance(stream, ForwardingReader)  # the proxy's connections all read through one
        self._client, self._stream = client, stream
        self.response = response  # the pump now (a replay makes a new one)
        self.gone = False  # the client hung up
        if not client.pending:  # else the next request has begun already: nothing to watch
            stream.attach(self)

    def follow(self, response: asyncio.Future[bool]) -> None:
        """Watch for `response` from now on (a replay's pump): cancelled at once if the client has
        gone while it was being set up."""
        self.response = response
        if self.gone:
            response.cancel()

    def received(self, data: bytes) -> None:
        self.stop()
        self._client.pending += data

    def ended(self, exc: Exception | None) -> None:
        self.stop()
        self.gone = True
        if not self.response.done():
            self.response.cancel()

    def stop(self) -> None:
        if self._stream.forwarder is self:
            self._stream.forwarder = None


class HeadBuffer:
    """A message head's bytes as they come, however they are split: linear in the head's size (each
    piece is appended once and only its new bytes, with the 3 before them, are searched for the blank
    line). Empty lines before a head are dropped (allowed before a request line)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no CRLF CRLF ending before [searched + 3]

    def started(self) -> bool:
        """A byte of the head has come (not counting empty lines before it)."""
        return bool(self._buffer)

    def add(self, data: bytes) -> tuple[bytes, bytes] | None:
        """(the head through its blank line, the bytes after it) once the head is whole; FramingError
        past MAX_HEAD_BYTES."""
        buffer = self._buffer
        if not buffer and not data.startswith(b"\r\n"):  # a head in one read (the usual): no copy kept
            end = data.find(b"\r\n\r\n") + 4
            if end >= 4:
                return data[:end], data[end:]
        buffer += data
        if self._searched == 0:
            lead = 0
            while buffer.startswith(b"\r\n", lead):
                lead += 2
            if lead:
                del buffer[:lead]
        end = buffer.find(b"\r\n\r\n", self._searched)
        if end >= 0:
            return bytes(buffer[: end + 4]), bytes(buffer[end + 4 :])
        self._searched = max(0, len(buffer) - 3)
        if len(buffer) > MAX_HEAD_BYTES:
            raise FramingError("head larger than 64 KiB")
        return None


_T = TypeVar("_T")


async def within(awaitable: Awaitable[_T], seconds: float) -> _T:
    """`await awaitable`, or asyncio.TimeoutError after `seconds` (the caller's task is cancelled by a
    timer; a cancel from elsewhere still propagates as CancelledError)."""
    task = asyncio.current_task()
    assert task is not None
    fired: list[bool] = []

    def expire() -> None:
        fired.append(True)
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not fired:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        raise asyncio.TimeoutError from None
    finally:
        handle.cancel()


class Idle(Exception):
    """No request started within the idle limit: the connection is closed quietly."""


class SlowHead(Exception):
    """A request head did not arrive whole within the header limit (408, then closed)."""


def error_response(
    status: int, reason: str, message: str, kind: str, retry_after: str | None = None, **extra: str
) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, **extra}}).encode()
    retry = f"Retry-After: {retry_after}\r\n" if retry_after else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{retry}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
