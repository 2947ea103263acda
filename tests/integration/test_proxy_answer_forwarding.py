"""An answer's head forwarded inside the upstream read that completes it (services/proxy/forwarding.py,
issue #26): its bytes reach the client before the call returns, with no pass of the event loop; bytes
and the connection's end that came before the head was awaited are not lost; what the proxy refuses
never reaches the client. Real sockets on loopback; the upstream's reads are fed as asyncio's
protocol feeds them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from trayapp.services.proxy.exchange import Cut, Exchange, Upstream, UpstreamFailed
from trayapp.services.proxy.forwarding import HeadForwarder, forward_body
from trayapp.services.proxy.limits import READ_BYTES
from trayapp.services.proxy.reading import ForwardingReader, Reader

pytestmark = pytest.mark.usefixtures("each_event_loop")  # each test on uvloop and on asyncio

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
PAYLOAD = b'data: {"token": 1}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(PAYLOAD), PAYLOAD)


@dataclass
class Sides:
    client: asyncio.StreamWriter  # the proxy's side of the client's connection
    client_peer: socket.socket  # what the client reads (blocking, with a timeout)
    upstream: Upstream  # the proxy's side of the upstream connection (paused, resumed)
    reader: ForwardingReader  # its reads, fed here as asyncio's protocol feeds them


@asynccontextmanager
async def sides() -> AsyncIterator[Sides]:
    client_mine, client_peer = socket.socketpair()
    upstream_mine, upstream_peer = socket.socketpair()
    _, client = await asyncio.open_connection(sock=client_mine)
    _, upstream = await asyncio.open_connection(sock=upstream_mine)
    client_peer.settimeout(5)
    reader = ForwardingReader(limit=READ_BYTES)
    try:
        yield Sides(client, client_peer, Upstream(Reader(reader), upstream, upstream.transport), reader)  # type: ignore[arg-type]
    finally:
        for writer in (client, upstream):
            writer.close()
        for sock in (client_peer, upstream_peer):
            sock.close()


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def forwarder(s: Sides, exchange: Exchange, method: str = "POST") -> HeadForwarder:
    """Watching the upstream's reads from now on (as from the moment a request went up)."""
    return HeadForwarder(method, exchange, s.client, s.upstream, lambda exc: None)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        assert piece, f"closed after {data!r}"
        data += piece
    return data


def test_the_head_and_the_first_chunk_reach_the_client_inside_the_read_that_completed_the_head() -> None:
    async def main() -> None:
        async with sides() as s:
            exchange = Exchange()
            heads = forwarder(s, exchange)
            s.reader.feed_data(HEAD[:20])  # a head split across reads
            s.reader.feed_data(HEAD[20:] + CHUNK)
            # no pass of the loop since the read: the bytes are on the client's socket already
            assert s.client.transport.get_write_buffer_size() == 0
            assert read_exactly(s.client_peer, len(HEAD + CHUNK)) == HEAD + CHUNK
            answer = await heads.forwarded()
            assert (answer.status, exchange.status, answer.trailing) == (200, 200, False)
            assert answer.body is not None and s.reader.forwarder is answer.body
            payloads: list[bytes] = []
            answer.body.deliver_to(lambda payload, _mono_s: payloads.append(payload))
            s.reader.feed_data(CHUNK + b"0\r\n\r\n")  # the next token and the end go straight through too
            assert read_exactly(s.client_peer, len(CHUNK) + 5) == CHUNK + b"0\r\n\r\n"
            assert await forward_body(s.reader, answer.body) is True
            assert payloads == [PAYLOAD, PAYLOAD] and s.reader.forwarder is None

    run(main)


def test_an_answer_that_came_before_it_was_awaited_and_then_the_end_are_both_handed_on() -> None:
    """A fast upstream answers (and closes) before its head is watched: the buffered bytes go out, and
    the body, cut by the close, ends its forwarding (not a pump waiting forever)."""

    async def main() -> None:
        async with sides() as s:
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
            s.reader.feed_data(head + b"12345")
            s.reader.feed_eof()
            answer = await forwarder(s, Exchange()).forwarded()
            assert read_exactly(s.client_peer, len(head) + 5) == head + b"12345"
            assert answer.body is not None
            with pytest.raises(Cut, match="mid-response"):
                await forward_body(s.reader, answer.body)

    run(main)


def test_interim_heads_go_out_then_the_final_one_and_bytes_after_a_bodiless_answer_end_its_reuse() -> None:
    async def main() -> None:
        async with sides() as s:
            exchange = Exchange()
            interim = b"HTTP/1.1 100 Continue\r\n\r\n"
            final = b"HTTP/1.1 204 No Content\r\n\r\n"
            s.reader.feed_data(interim + final + b"stray")
            answer = await forwarder(s, exchange).forwarded()
            assert read_exactly(s.client_peer, len(interim + final)) == interim + final
            assert (answer.status, exchange.status, answer.body, answer.trailing) == (204, 204, None, True)
            s.client_peer.setblocking(False)
            with pytest.raises(BlockingIOError):  # the stray bytes were not forwarded
                s.client_peer.recv(100)

    run(main)


@pytest.mark.parametrize(
    ("fed", "message", "answered_nothing"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "malformed response", False),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "middle of a head", False),
        (b"", "without answering", True),
    ],
)
def test_a_refused_or_missing_head_fails_the_answer_and_sends_the_client_nothing(
    fed: bytes, message: str, answered_nothing: bool
) -> None:
    async def main() -> None:
        async with sides() as s:
            exchange = Exchange()
            heads = forwarder(s, exchange)
            if fed:
                s.reader.feed_data(fed)
            if b"\r\n\r\n" not in fed:
                s.reader.feed_eof()
            with pytest.raises(UpstreamFailed, match=message) as failed:
                await heads.forwarded()
            assert failed.value.answered_nothing is answered_nothing and exchange.status is None
            assert s.reader.forwarder is None
            s.client_peer.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.client_peer.recv(100)

    run(main)
