"""What framing one proxied request costs: the proxy's hand-written framer vs h11 vs httptools (llhttp).

    python bench/framer_cost.py [--httptools-path DIR]

Per request, the work the proxy's framer does on the forwarding path: parse the request head, decide
its body framing and rebuild the head to forward; then, for a streamed answer like llama-server's
(chunked, one SSE event per chunk, 100 events), parse the response head and find every chunk's end
and payload. Sans I/O, one thread, best of 5 repetitions of N requests; microseconds per request.
httptools is not a dependency: give the folder of an unpacked wheel with --httptools-path, or it is
skipped. (issue #25: the measurement behind keeping the hand-written framer, docs/performance.md.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:11435\r\nUser-Agent: OpenAI/Python 1.40\r\n"
    b"Accept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-xyz\r\n"
    b"Content-Length: 120\r\n\r\n" + b"x" * 120
)
EVENT = b'data: {"choices":[{"delta":{"content":" word"},"index":0}],"model":"m"}\n\n'
CHUNKS = b"".join(f"{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n" for _ in range(100)) + b"0\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
PIECES = [CHUNKS[i : i + len(EVENT) + 6] for i in range(0, len(CHUNKS), len(EVENT) + 6)]  # ~ one per read


def ours() -> None:
    from trayapp.services.proxy.http1 import (
        RequestLine,
        normalised,
        parse_head,
        request_body,
        response_body,
        status_of,
    )

    end = REQUEST.find(b"\r\n\r\n") + 4
    head = parse_head(REQUEST[:end])
    RequestLine.of(head)
    framer = request_body(head)
    normalised(head, framer)
    framer.feed(REQUEST[end:])
    response = parse_head(RESPONSE)
    status_of(response)
    body = response_body(response, "POST")
    for piece in PIECES:
        body.feed(piece)
    assert body.done


def ours_heads() -> None:
    """The part before the first byte goes up and before the answer's head goes back (TTFT's share)."""
    from trayapp.services.proxy.http1 import RequestLine, normalised, parse_head, request_body, response_body

    end = REQUEST.find(b"\r\n\r\n") + 4
    head = parse_head(REQUEST[:end])
    RequestLine.of(head)
    normalised(head, request_body(head))
    response_body(parse_head(RESPONSE), "POST")


def h11_framer() -> None:
    import h11

    server = h11.Connection(h11.SERVER)
    server.receive_data(REQUEST)
    while not isinstance(server.next_event(), h11.EndOfMessage):
        pass
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/", headers=[("Host", "a"), ("Content-Length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(RESPONSE)
    client.next_event()
    for piece in PIECES:
        client.receive_data(piece)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
                break


def httptools_framer() -> None:
    import httptools

    class Sink:
        done = False

        def on_message_complete(self) -> None:
            self.done = True

        def on_body(self, body: bytes) -> None:
            pass

    request = Sink()
    httptools.HttpRequestParser(request).feed_data(REQUEST)
    response = Sink()
    parser = httptools.HttpResponseParser(response)
    parser.feed_data(RESPONSE)
    for piece in PIECES:
        parser.feed_data(piece)
    assert request.done and response.done


def trickled_head_s(head_bytes: int = 60 * 1024) -> float:
    """Seconds `Reader.read_head` takes for a head of `head_bytes` that arrives 1 byte per read (a
    slow or hostile client): linear since issue #26, ~1.5 s for 64 KiB when each read re-scanned it."""
    import asyncio

    from trayapp.services.proxy.limits import READ_BYTES
    from trayapp.services.proxy.reading import ForwardingReader, Reader

    filler = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    head = b"GET / HTTP/1.1\r\nHost: a\r\n" + filler * (head_bytes // len(filler)) + b"\r\n"

    async def run() -> float:
        stream = ForwardingReader(limit=READ_BYTES)
        waiting = asyncio.ensure_future(Reader(stream).read_head())
        await asyncio.sleep(0)  # it waits: each byte is taken as asyncio's protocol feeds it
        started = time.perf_counter()
        for at in range(len(head)):
            stream.feed_data(head[at : at + 1])
        parsed = await waiting
        assert parsed is not None and parsed.raw == head
        return time.perf_counter() - started

    return asyncio.run(run())


def best_us(run: Callable[[], None], n: int) -> float:
    run()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            run()
        best = min(best, (time.perf_counter() - started) / n)
    return best * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--httptools-path", default=None)
    a = p.parse_args()
    if a.httptools_path:
        sys.path.insert(0, a.httptools_path)
    framers: list[tuple[str, Callable[[], None]]] = [("hand-written (http1.py)", ours), ("h11", h11_framer)]
    try:
        import httptools  # noqa: F401

        framers.append(("httptools (llhttp)", httptools_framer))
    except ImportError:
        print("httptools: not found (--httptools-path DIR)", file=sys.stderr)
    print(f"per request: a {len(REQUEST)}-byte request, a chunked answer of 100 SSE events")
    for name, run in framers:
        print(f"{name:26s} {best_us(run, a.requests):8.1f} µs")
    print(
        f"{'hand-written, heads only':26s} {best_us(ours_heads, a.requests):8.1f} µs (before the first byte)"
    )
    print(f"{'a 60 KiB head, 1 byte a read':26s} {trickled_head_s() * 1e3:8.1f} ms (Reader.read_head)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
