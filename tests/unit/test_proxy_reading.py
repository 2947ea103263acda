"""Reading a message head however the peer splits it (services/proxy/reading.py): one byte per read,
empty lines before a request line, the bytes after the head pushed back, the reads taken as they
come. (Its cost, linear since issue #26, is measured by bench/framer_cost.py, never here.)"""

from __future__ import annotations

import asyncio

import pytest

from trayapp.services.proxy.exchange import open_upstream
from trayapp.services.proxy.http1 import FramingError, parse_head
from trayapp.services.proxy.limits import READ_BYTES
from trayapp.services.proxy.reading import ForwardingReader, HangUpWatch, Reader

PAD = b"X-Pad: " + b"p" * 3000 + b"\r\n"
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n" + PAD + b"Content-Length: 2\r\n\r\n"


def _read(data: bytes, size: int) -> tuple[bytes | None, bytes]:
    """The head read from `data` arriving in reads of `size` bytes, then the end; what follows it."""

    async def run() -> tuple[bytes | None, bytes]:
        stream = ForwardingReader(limit=READ_BYTES)
        reader = Reader(stream)
        waiting = asyncio.ensure_future(reader.read_head())
        await asyncio.sleep(0)  # it waits for reads: each is taken as asyncio's protocol feeds it
        for at in range(0, len(data), size):
            stream.feed_data(data[at : at + size])
        stream.feed_eof()
        head = await waiting
        rest = b""
        while piece := await reader.read_some():
            rest += piece
        return (None if head is None else head.raw), rest

    return asyncio.run(run())


@pytest.mark.parametrize("size", [1, 2, 3, 5, 4096, 1 << 20])
def test_a_head_split_anyhow_is_read_whole_and_what_follows_is_kept(size: int) -> None:
    assert _read(b"\r\n\r\n" + HEAD + b"{}", size) == (HEAD, b"{}")


def test_a_head_never_ended_is_refused_past_its_limit_and_a_cut_one_is_malformed() -> None:
    endless = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"p" * (70 * 1024)
    with pytest.raises(FramingError, match="larger than 64 KiB"):
        _read(endless, 997)
    with pytest.raises(FramingError, match="middle of a head"):
        _read(HEAD[:-1], 1)
    assert _read(b"", 1) == (None, b"")


def test_both_sides_of_a_proxied_connection_read_at_most_64_kib_at_a_time() -> None:
    """asyncio's transports read 256 KiB at a time by default: a fresh buffer at glibc's mmap threshold
    (sources/malloc.py) for every token of a stream. The proxy's transports read READ_BYTES."""

    async def main() -> int:
        accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()
        server = await asyncio.start_server(lambda _r, w: accepted.put_nowait(w), "127.0.0.1", 0)
        upstream = await open_upstream("127.0.0.1", server.sockets[0].getsockname()[1])
        size: int = upstream.writer.transport.max_size  # type: ignore[attr-defined]
        other_end = await asyncio.wait_for(accepted.get(), 10)
        for writer in (upstream.writer, other_end):
            writer.close()
            await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return size

    assert asyncio.run(main()) == READ_BYTES


def test_on_head_runs_inside_the_read_that_completes_the_head_with_what_follows_pushed_back() -> None:
    """The proxy sends a request up from `on_head`: inside the read that brought the head's last bytes,
    before any pass of the event loop, with the body's first bytes there to send with it."""

    async def run() -> None:
        stream = ForwardingReader(limit=READ_BYTES)
        reader = Reader(stream)
        seen: list[tuple[bytes, bytes]] = []
        waiting = asyncio.ensure_future(
            reader.read_head(None, None, lambda raw: seen.append((raw, reader.pending)) or parse_head(raw))
        )
        await asyncio.sleep(0)
        stream.feed_data(HEAD[:10])
        assert seen == []
        stream.feed_data(HEAD[10:] + b"{}")
        assert seen == [(HEAD, b"{}")]  # no pass of the loop since the read
        head = await waiting
        assert head is not None and head.raw == HEAD

    asyncio.run(run())


def test_a_hang_up_watch_cancels_the_pump_and_a_replays_pump_set_up_after_it() -> None:
    """The client hanging up (its reads end) cancels the exchange's pump, and a pump set up after
    that (a replay on a new connection) is cancelled as it is followed."""

    async def run() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        stream = ForwardingReader(limit=READ_BYTES)
        pump: asyncio.Future[bool] = loop.create_future()
        watch = HangUpWatch(Reader(stream), pump)
        stream.feed_eof()
        replay: asyncio.Future[bool] = loop.create_future()
        watch.follow(replay)
        return watch.gone, pump.cancelled(), replay.cancelled()

    assert asyncio.run(run()) == (True, True, True)


def test_a_next_request_ends_the_hang_up_watch_and_is_kept_for_its_turn() -> None:
    """Bytes of a next request while an answer streams are kept (pushed back), not taken for a hang-up;
    the watch stops there, as a client side that saw "more" did."""

    async def run() -> tuple[bool, bool, bytes]:
        loop = asyncio.get_running_loop()
        stream = ForwardingReader(limit=READ_BYTES)
        reader = Reader(stream)
        pump: asyncio.Future[bool] = loop.create_future()
        watch = HangUpWatch(reader, pump)
        stream.feed_data(HEAD[:10])
        stream.feed_data(HEAD[10:])  # after the watch stopped: asyncio's buffer, as any read
        stream.feed_eof()  # not watched any more: the pump is left to its answer
        head = await reader.read_head()
        assert head is not None
        return watch.gone, pump.cancelled(), head.raw

    assert asyncio.run(run()) == (False, False, HEAD)


def test_a_head_read_whole_before_anyone_waits_is_taken_at_once_and_a_part_of_one_is_left() -> None:
    """A new connection's first request has usually come whole before its task runs: its bytes are
    taken from what was read, with the bytes after it pushed back; part of a head is left where it is,
    for `read_head`, as is a head whose end is split between the pushed-back bytes and the reads."""

    async def run() -> None:
        stream = ForwardingReader(limit=READ_BYTES)
        reader = Reader(stream)
        assert reader.whole_head() is None
        stream.feed_data(b"\r\n" + HEAD[:-2])
        assert reader.whole_head() is None and reader.has_unread_bytes()
        stream.feed_data(HEAD[-2:] + b"{}")
        assert reader.whole_head() == HEAD and reader.pending == b"{}"  # (the empty line before it dropped)
        assert await reader.read_some() == b"{}"
        reader.unread(HEAD[:-1])  # a next request pushed back, its last byte still to come
        stream.feed_data(b"\n")
        assert reader.whole_head() is None  # (its end split: found by read_head)
        first = await reader.read_head()
        assert first is not None and first.raw == HEAD and not reader.has_unread_bytes()
        reader.unread(HEAD[:-1])
        stream.feed_data(b"\n" + HEAD)  # the same, and a whole head after it
        assert [reader.whole_head(), reader.whole_head()] == [HEAD, HEAD]
        assert not reader.has_unread_bytes()

    asyncio.run(run())
