"""What one streamed token costs the proxy's loop thread: one upstream read through the read path.

    python bench/token_path.py [--src DIR ...] [--reads N]

A token's path, as the proxy runs it (issue #26): the upstream connection's protocol callback, the
response body's forwarder (de-framed, written to the client, timed), and the recorder's reading of
its SSE line (`RequestTap.response_body`). One vLLM-style chunk a read, a client transport that takes
every write; sans network, one thread, warm, best of 5 repetitions of N reads; microseconds a read.
`--src` runs the same on other source trees (e.g. a `git worktree` of an earlier commit), each in
its own process, for a before/after in one run. The loop's own work (the read syscall, the wake) and
the write's syscall are not in it: `bench/proxy_overhead.py` measures the whole hop.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LINE = (
    b'data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1733400000,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":" quokka"},"logprobs":null,"finish_reason":null}]}\n\n'
)
CHUNK = f"{len(LINE):x}\r\n".encode() + LINE + b"\r\n"
REQUEST_BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


class _Transport:
    """A client (or upstream) transport that takes every write at once."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)

    def pause_reading(self) -> None:
        pass


class _Writer:
    transport = _Transport()


async def _per_read_us(reads: int) -> tuple[float, int]:
    from trayapp.services.proxy import limits, reading
    from trayapp.services.proxy.forwarding import BodyForwarder
    from trayapp.services.proxy.http1 import ChunkedBody, RequestLine
    from trayapp.services.proxy.recording import Recording
    from trayapp.services.proxy.route import Route

    loop = asyncio.get_running_loop()
    recording = Recording(Route("127.0.0.1", 0, "http://127.0.0.1:9", "vllm"), lambda route, record: None)
    tap = recording.tap(RequestLine("POST", "/v1/chat/completions", "/v1/chat/completions"), 0.0, 0.0)
    tap.request_body(REQUEST_BODY)
    tap.response_head(200, {"content-type": "text/event-stream"}, 0.0)
    reader = reading.ForwardingReader(limit=limits.READ_BYTES, loop=loop)
    protocol_class: Any = getattr(reading, "ForwardingProtocol", asyncio.StreamReaderProtocol)
    protocol = protocol_class(reader, loop=loop)
    forwarder = BodyForwarder(ChunkedBody(), _Writer(), _Transport(), lambda exc: None)  # type: ignore[arg-type]
    if hasattr(recording, "body_reader"):
        forwarder.deliver_to(recording.body_reader(tap))
    else:  # before 2026-12-05's twelfth pass
        forwarder.deliver_to(lambda payload, mono_s: recording.response_body(tap, payload, mono_s))
    reader.forwarder = forwarder
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(reads):
            protocol.data_received(CHUNK)
        best = min(best, (time.perf_counter() - started) / reads)
    return best * 1e6, tap.text_pieces


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=50_000)
    p.add_argument("--src", action="append", default=[], help="another source tree to run beside this one")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a tree's own process
    a = p.parse_args()
    if a.one is not None:
        sys.path.insert(0, a.one)
        us, pieces = asyncio.run(_per_read_us(a.reads))
        assert pieces == 5 * a.reads, pieces  # every read's line was read as one text piece
        print(f"{us:.2f}")
        return 0
    trees = [str(Path(__file__).resolve().parents[1]), *a.src]
    print(f"a token's read ({len(CHUNK)} bytes, one SSE chunk), best of 5 × {a.reads} reads:")
    for tree in trees:
        run = [sys.executable, __file__, "--one", tree, "--reads", str(a.reads)]
        out = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
        print(f"  {tree}: {out} µs a read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
