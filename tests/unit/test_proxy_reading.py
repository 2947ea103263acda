"""Reading a message head however the peer splits it (services/proxy/reading.py): one byte per read,
empty lines before a request line, the bytes after the head pushed back. (Its cost, linear since
issue #26, is measured by bench/framer_cost.py, never here.)"""

from __future__ import annotations

import asyncio

import pytest

from trayapp.services.proxy.exchange import open_upstream
from trayapp.services.proxy.http1 import FramingError
from trayapp.services.proxy.limits import READ_BYTES
from trayapp.services.proxy.reading import Reader

PAD = b"X-Pad: " + b"p" * 3000 + b"\r\n"
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n" + PAD + b"Content-Length: 2\r\n\r\n"


class _Pieces:
    """The read side of a connection delivering `data` in pieces of `size` bytes, then EOF."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    async def read(self, n: int) -> bytes:
        piece = self.data[self.at : self.at + min(n, self.size)]
        self.at += len(piece)
        return piece


def _read(data: bytes, size: int) -> tuple[bytes | None, bytes]:
    async def run() -> tuple[bytes | None, bytes]:
        reader = Reader(_Pieces(data, size))  # type: ignore[arg-type]
        head = await reader.read_head()
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
