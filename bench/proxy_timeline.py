"""When each of N streams starting together is accepted, read, sent up and answered: a timeline.

    python bench/proxy_timeline.py [--src DIR] [--streams 50] [--rounds 8]

`bench/proxy_overhead.py` says how much later the median stream's first token comes through the
proxy; this says where in the burst that time goes. The real proxy (`ProxyThread`, a vLLM-kind route,
the recorder on, its records dropped) runs in this process with a few of its steps timestamped
(`time.perf_counter`, the system's monotonic clock, which the client process shares): a client
connection accepted, its head read, its request sent up, and each upstream connection's connect
begun and done. The clients are another process (asyncio, as the bench's: every stream connects at
once, sends its request, reads until the first SSE `data:`); the fake streaming upstream a third.
Each round sends the burst straight to the fake, then through the proxy; printed: the median first
byte of each, and for the last proxy rounds each step's time from the burst's start at the 1st,
13th, 25th, 38th and 50th connection (in the order they were accepted). Timestamps cost the proxy a
little; the order of events is what this gives (issue #26, fifteenth pass: 48 of 50 connections
opened their upstream connection only after their heads had come).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
STEPS = ("first byte", "accepted", "head read", "sent up")


async def _burst(port: int, streams: int) -> list[dict[str, Any]]:
    async def one() -> dict[str, Any]:
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        local_port = writer.get_extra_info("sockname")[1]
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + BODY)
        first, seen = None, b""
        while data := await reader.read(65536):
            seen += data
            if first is None and b"data:" in seen:
                first = time.perf_counter()
        writer.close()
        return {"port": local_port, "started": started, "first": first}

    return list(await asyncio.gather(*(one() for _ in range(streams))))


def _clients(port: int, streams: int) -> int:
    """The client process: one burst, its streams as JSON on stdout."""
    print(json.dumps(asyncio.run(_burst(port, streams))))
    return 0


def _ms(at: float, start: float) -> float:
    return (at - start) * 1e3


def _steps(events: dict[tuple[str, int], float], port: int, start: float) -> list[float]:
    """The proxy's steps for the client connection from `port`, ms from `start` (nan: not seen)."""
    return [_ms(events.get((step, port), float("nan")), start) for step in STEPS[1:]]


def _timeline(src: str, streams: int, rounds: int, tokens: int, token_delay_s: float) -> int:
    sys.path.insert(0, src)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from proxy_overhead import fake_upstream

    import trayapp.services.proxy.exchange as exchange
    import trayapp.services.proxy.reading as reading
    import trayapp.services.proxy.server as server
    from trayapp.services.proxy.route import Route
    from trayapp.services.proxy.runner import ProxyThread

    events: dict[tuple[str, int], float] = {}
    connects: list[tuple[float, float]] = []

    def peer_port(transport: Any) -> int:
        peer = transport.get_extra_info("peername")
        return int(peer[1]) if peer else 0

    accepted = reading.ForwardingProtocol.connection_made

    def connection_made(self: Any, transport: Any) -> None:
        events.setdefault(("accepted", peer_port(transport)), time.perf_counter())
        accepted(self, transport)

    begin = server.ProxyServer._begin

    def head_read(self: Any, head: Any, client: Any, writer: Any, *rest: Any) -> Any:
        events[("head read", peer_port(writer.transport))] = time.perf_counter()
        return begin(self, head, client, writer, *rest)

    send = server.send

    def sent_up(checked: Any, client: Any, writer: Any, *rest: Any) -> Any:
        result = send(checked, client, writer, *rest)
        events[("sent up", peer_port(writer.transport))] = time.perf_counter()
        return result

    open_upstream = exchange.open_upstream

    async def connect(host: str, port: int) -> Any:
        begun = time.perf_counter()
        upstream = await open_upstream(host, port)
        connects.append((begun, time.perf_counter()))
        return upstream

    reading.ForwardingProtocol.connection_made = connection_made  # type: ignore[method-assign]
    server.ProxyServer._begin = head_read  # type: ignore[method-assign]
    server.send = sent_up
    exchange.open_upstream = server.open_upstream = connect

    def burst(port: int) -> list[dict[str, Any]]:
        out = subprocess.run(
            [sys.executable, __file__, "--clients", str(port), str(streams)],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        return list(json.loads(out))

    first_bytes: dict[str, list[float]] = {"direct": [], "proxy": []}
    shown: list[tuple[list[list[float]], list[tuple[float, float]]]] = []
    with tempfile.TemporaryDirectory() as logs, fake_upstream(Path(logs), tokens, token_delay_s, 0.0) as url:
        fake_port = int(url.rsplit(":", 1)[1].strip("/"))
        proxy = ProxyThread([Route("127.0.0.1", 0, url, "vllm")], lambda _route, _record: None)
        port = int(proxy.start()[0].rsplit(":", 1)[1])
        try:
            for _ in range(rounds):
                for name, target in (("direct", fake_port), ("proxy", port)):
                    events.clear()
                    connects.clear()
                    out = burst(target)
                    start = min(stream["started"] for stream in out)
                    first_bytes[name].append(statistics.median(_ms(s["first"], start) for s in out))
                    if name == "proxy":
                        rows = [[_ms(s["first"], start), *_steps(events, s["port"], start)] for s in out]
                        shown.append((rows, [(_ms(a, start), _ms(b, start)) for a, b in connects]))
                    time.sleep(0.3)  # the fake's threads of the burst end
        finally:
            proxy.stop()
    direct, through = statistics.median(first_bytes["direct"]), statistics.median(first_bytes["proxy"])
    added = through - direct
    print(f"median first byte: direct {direct:.2f} ms, through the proxy {through:.2f} ms ({added:+.2f})")
    for rows, opened in shown[-2:]:
        rows.sort(key=lambda row: row[1])
        print("\nms from the burst's start, by connection in the order accepted:")
        print("  " + "".join(f"{step:>12}" for step in ("#", *STEPS)))
        for index in sorted({0, len(rows) // 4, len(rows) // 2, 3 * len(rows) // 4, len(rows) - 1}):
            print("  " + f"{index + 1:>12}" + "".join(f"{value:12.2f}" for value in rows[index]))
        if opened:
            begun, done = sorted(a for a, _ in opened), sorted(b for _, b in opened)
            print(
                f"  upstream connects: {len(opened)}, begun {begun[0]:.2f}–{begun[-1]:.2f} ms, "
                f"done {done[0]:.2f}–{done[-1]:.2f} ms"
            )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=str(Path(__file__).resolve().parent.parent), help="llm-tray tree to run")
    p.add_argument("--streams", type=int, default=50)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--fake-tokens", type=int, default=5)
    p.add_argument("--fake-token-delay-s", type=float, default=0.02)
    p.add_argument("--clients", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.clients is not None:
        return _clients(*a.clients)
    return _timeline(a.src, a.streams, a.rounds, a.fake_tokens, a.fake_token_delay_s)


if __name__ == "__main__":
    sys.exit(main())
