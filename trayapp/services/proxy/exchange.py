"""One proxied exchange's parts: the upstream connection (opened, kept, judged reusable), what the
pump has done so far, how a response ends early, and a drain that waits only when it must."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trayapp.services.proxy import limits
from trayapp.services.proxy.limits import READ_BYTES
from trayapp.services.proxy.reading import ForwardingProtocol, ForwardingReader, Reader, within


@dataclass
class Upstream:
    reader: Reader
    writer: asyncio.StreamWriter
    transport: asyncio.Transport  # the writer's, typed as the socket transport it is (reads pause)
    idle_since_s: float = 0.0  # time.monotonic() when its last answer ended (or it was opened)
    answers: int = 0  # requests it has answered

    def usable(self, max_answers: int) -> bool:
        """Open, idle for less than the servers' keep-alive timeouts, and with fewer than `max_answers`
        answers: a connection the server is closing as the next request goes out answers nothing (a
        502 seen with llama-server)."""
        fresh = time.monotonic() - self.idle_since_s < limits.UPSTREAM_REUSE_IDLE_S
        fresh = fresh and self.answers < max_answers
        return fresh and not (self.reader.reader.at_eof() or self.writer.transport.is_closing())

    def close(self) -> None:
        self.writer.close()

    @property
    def stream(self) -> ForwardingReader:
        """What the connection's reads go to (a response body's forwarder, or a buffer)."""
        stream = self.reader.reader
        assert isinstance(stream, ForwardingReader)  # open_upstream makes every Upstream's
        return stream


class Cut(Exception):
    """The response was cut short: the client hung up, or the upstream closed mid-body."""


@dataclass
class Exchange:
    """What one request's pump has done so far."""

    status: int | None = None  # the response status forwarded to the client
    complete: bool = False  # the whole response reached the client
    held: int = 0  # request body bytes the recorder holds (counted against the listener's budget)
    over_budget: bool = False
    parsed: asyncio.Future[None] | None = None  # a big body being read off the loop
    bad_body: str | None = None  # why the request body was refused (malformed chunked framing)
    own_status: int | None = None  # the status of an answer the proxy wrote itself (400, 502)
    replay: bytearray | None = field(default_factory=bytearray)  # the request as sent upstream, kept
    #   (under limits.REPLAY_KEPT_BYTES) until the answer starts; None: too large, or no longer needed
    replayed: bool = False  # sent a second time, on a new connection
    read_held: Callable[[], None] | None = None  # the recorder's payloads still held, read before the
    #                                               record (recording.BodyReader.read_held)


class UpstreamFailed(Exception):
    """The upstream could not be reached, or closed before answering. `answered_nothing`: it closed
    (or reset) a connection the request had gone up on before a byte of its answer reached the client."""

    def __init__(self, message: str, answered_nothing: bool = False) -> None:
        super().__init__(message)
        self.answered_nothing = answered_nothing


async def open_upstream(host: str, port: int) -> Upstream:
    """A new connection to the upstream; UpstreamFailed saying why when it cannot be opened."""
    try:  # `within`, not asyncio.wait_for (a task of its own per connect on Python < 3.12)
        loop = asyncio.get_running_loop()
        reader = ForwardingReader(limit=READ_BYTES, loop=loop)  # asyncio.open_connection, this reader
        protocol = ForwardingProtocol(reader, loop=loop)
        transport, _ = await within(
            loop.create_connection(lambda: protocol, host, port), limits.CONNECT_TIMEOUT_S
        )
    except (OSError, asyncio.TimeoutError) as exc:
        raise UpstreamFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
    read_small(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return Upstream(Reader(reader), writer, transport, time.monotonic())


def read_small(transport: asyncio.BaseTransport) -> None:
    """Have asyncio's transport read at most READ_BYTES at a time (its default, 256 KiB, is a fresh
    buffer at glibc's mmap threshold, sources/malloc.py: an mmap, mremap and munmap for every token
    of a stream, ~50 µs each time on a 2-core VM). uvloop's transports read into one buffer of their
    own and have no such attribute."""
    if hasattr(transport, "max_size"):
        transport.max_size = READ_BYTES


class EarlyUpstream:
    """An upstream connection opened before the request that takes it has come: as a client connects,
    while its first head arrives (the connect no longer waits behind the head: ~0.6 ms of a request's
    first byte on a 2-core machine), and when a kept connection is spent (its answers reached its
    listener's limits.UpstreamReuse.max_answers) while the client reads its last answer. Closed unused
    after `hold_s`: a client that sends nothing holds no server thread (llama-server gives each connection
    one) for longer (limits.EARLY_UPSTREAM_HOLD_S for a new client; limits.UPSTREAM_REUSE_IDLE_S for
    one whose kept connection it replaces, as long as that one would have been held)."""

    def __init__(self, host: str, port: int, hold_s: float) -> None:
        self._opening: asyncio.Future[Upstream] | None = asyncio.ensure_future(open_upstream(host, port))
        self._opening.add_done_callback(_retrieve_failure)
        self._timer = asyncio.get_running_loop().call_later(hold_s, self.drop)

    async def take(self) -> Upstream | None:
        """The connection (awaited if still opening); None when it was dropped; UpstreamFailed when
        it could not be opened."""
        opening, self._opening = self._opening, None
        self._timer.cancel()
        return None if opening is None else await opening

    def ready(self) -> Upstream | None:
        """The connection, taken, if it is open already (else None, and it is not taken)."""
        opening = self._opening
        if opening is None or not opening.done() or opening.cancelled() or opening.exception() is not None:
            return None
        self._opening = None
        self._timer.cancel()
        return opening.result()

    def drop(self) -> None:
        """Close it, or stop opening it; nothing when it was taken."""
        opening, self._opening = self._opening, None
        self._timer.cancel()
        if opening is None:
            return
        if not opening.done():
            opening.cancel()  # asyncio closes a socket still connecting
        elif not opening.cancelled() and opening.exception() is None:
            opening.result().close()


class UpstreamPool:
    """Upstream connections whose clients have gone, kept for the next client (at most `most`, newest
    taken first): a client that opens a connection per request (curl, a CLI, a script) has its request
    go up at once, not after a connect, as a kept client connection's next request does. Each is
    closed once idle limits.UPSTREAM_REUSE_IDLE_S, as a client's kept one would be: a server thread
    (llama-server gives each open connection one) is held no longer than a client keeping its own
    connection to the server would hold it."""

    def __init__(self, most: int, max_answers: int) -> None:
        self._most = most
        self._max_answers = max_answers
        self._idle: list[tuple[Upstream, asyncio.TimerHandle]] = []  # oldest first
        self._promised = 0  # kept connections set aside for clients whose first request is to come
        self._closed = False

    def put(self, upstream: Upstream) -> None:
        """Keep `upstream` (idle, its last answer whole), or close it when it may not be reused."""
        if self._closed or self._most <= 0 or not upstream.usable(self._max_answers):
            upstream.close()
            return
        if len(self._idle) >= self._most:
            oldest, timer = self._idle.pop(0)
            timer.cancel()
            oldest.close()
        left_s = limits.UPSTREAM_REUSE_IDLE_S - (time.monotonic() - upstream.idle_since_s)
        timer = asyncio.get_running_loop().call_later(max(0.0, left_s), self._expire, upstream)
        self._idle.append((upstream, timer))

    def take(self) -> Upstream | None:
        """A kept connection still usable (the newest), no longer kept; None when there is none."""
        while self._idle:
            upstream, timer = self._idle.pop()
            timer.cancel()
            if upstream.usable(self._max_answers):
                return upstream
            upstream.close()
        return None

    def promise(self) -> bool:
        """Set a kept connection aside for a client that has just connected, True, while the pool
        keeps more than it has promised; False: the client opens its own at once (EarlyUpstream).
        50 clients connecting together beside 2 kept connections: 2 promised, 48 opened early, where
        all 50 used to count on the pool and 48 opened theirs only once their heads had come, behind
        every other head (the median stream's first token +4 ms, issue #26). Kept once the client's
        first head has come (`keep_promise`), whether or not that request took one."""
        if len(self._idle) > self._promised:
            self._promised += 1
            return True
        return False

    def keep_promise(self, promised: list[bool]) -> None:
        """The promise made to a client (`promised[0]`, then False) is kept: its first head has come,
        and takes the connection set aside for it (this is said before the take: a client connecting
        between the two would find every kept connection promised and open its own), or never will."""
        if promised[0]:
            promised[0] = False
            self._promised = max(0, self._promised - 1)

    def __len__(self) -> int:
        return len(self._idle)

    def _expire(self, upstream: Upstream) -> None:
        self._idle = [(kept, timer) for kept, timer in self._idle if kept is not upstream]
        upstream.close()

    def close(self) -> None:
        """Close every kept connection, and any put from now on (the listener closes)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for upstream, timer in idle:
            timer.cancel()
            upstream.close()


def _retrieve_failure(opening: asyncio.Future[Upstream]) -> None:
    """A failure no request asked for (the client sent nothing) is not an unretrieved exception."""
    if not opening.cancelled():
        opening.exception()


async def drain(writer: asyncio.StreamWriter) -> None:
    """Wait until `writer` may take more; Cut when the client is gone or reads nothing for too long."""
    transport = writer.transport
    if not transport.get_write_buffer_size() and not transport.is_closing():
        return  # all sent (the usual case for a token): nothing to wait for, nothing failed
    try:
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
            await writer.drain()  # not paused: returns at once (no timer needed)
        else:
            await within(writer.drain(), limits.SEND_STALL_TIMEOUT_S)
    except ConnectionError as exc:
        raise Cut(str(exc)) from exc
    except asyncio.TimeoutError as exc:
        raise Cut("the client read nothing for too long") from exc
