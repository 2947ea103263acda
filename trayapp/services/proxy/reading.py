"""Reading a client or upstream connection for the proxy: message heads with deadlines, bytes
pushed back, a read bounded in time, the upstream's reader that hands a response body's reads to its
forwarder (forwarding.py), and the proxy's own error answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
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

    async def read_head(self, first_byte_s: float | None = None, whole_s: float | None = None) -> Head | None:
        """The next message head; None when the peer closed before sending one. `first_byte_s`: the
        head must start within it (else `Idle`); `whole_s`: the head must be complete within it,
        counted from its first byte (else `SlowHead`). None: no limit (a response head)."""
        buffer = HeadBuffer()
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        data = self.pending
        self.pending = b""
        while True:
            whole = buffer.add(data)
            if whole is not None:
                raw, rest = whole
                self.unread(rest)
                return parse_head(raw)
            started = buffer.started()
            if deadline is None and whole_s is not None and (started or first_byte_s is None):
                deadline = loop.time() + whole_s
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise SlowHead
                try:
                    data = await self.read_within(left)
                except asyncio.TimeoutError:
                    raise SlowHead from None
            elif not started and first_byte_s is not None:
                try:
                    data = await self.read_within(first_byte_s)
                except asyncio.TimeoutError:
                    raise Idle from None
            else:
                data = await self.read_some()
            if not data:
                if started:
                    raise FramingError("connection closed in the middle of a head")
                return None


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
