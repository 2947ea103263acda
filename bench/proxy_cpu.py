"""What a proxied request costs the proxy's event-loop thread in CPU, and which part of it is what.

    python bench/proxy_cpu.py [--bursts 40] [--streams 50] [--src DIR]

The real proxy (`ProxyThread`, a vLLM-kind route, the recorder on, its records dropped) runs in this
process; the fake streaming upstream and the clients (`bench/proxy_timeline.py`'s: every stream
connects at once, 5-token answers) are processes of their own. Each burst is timed with
`time.thread_time()` of the proxy's thread (asked on that thread before and after), so what the
clients and the upstream do is not counted, nor the time the thread waits. Parts of the recorder are
left out burst by burst, in rotation in the one process (paired: a busy neighbour moves them all):
the whole recorder, its reading of the answer, the client's naming, the record's making. A byte
relay on an event loop of its own in this process (nothing parsed, a fresh upstream connection per
client, as `bench/proxy_overhead.py --relay`) is timed the same way in the same rounds: the floor.
µs a request, mean and median over the bursts. A measurement of CPU, not of latency (issue #26's
sixteenth pass: 861 µs ours, 328 the relay; no recorder 639).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def _relay(upstream: tuple[str, int]) -> tuple[asyncio.AbstractEventLoop, int]:
    """A byte relay (as proxy_overhead.py's) on its own loop thread here: (its loop, its port)."""
    from trayapp.services.proxy.exchange import read_small
    from trayapp.services.proxy.runner import new_loop

    class Side(asyncio.Protocol):
        def __init__(self, peer: Side | None = None) -> None:
            self.peer, self.pending = peer, bytearray()
            self.transport: Any = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            read_small(transport)
            if self.peer is None:
                asyncio.get_running_loop().create_task(self._connect())
            else:
                self.peer.peer = self
                if self.peer.pending:
                    transport.write(bytes(self.peer.pending))

        async def _connect(self) -> None:
            try:
                await asyncio.get_running_loop().create_connection(lambda: Side(self), *upstream)
            except OSError:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.peer is not None and self.peer.transport is not None:
                self.peer.transport.write(data)
            else:
                self.pending += data

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None and self.peer.transport is not None:
                self.peer.transport.close()

    loop = new_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start() -> asyncio.Server:
        return await loop.create_server(Side, "127.0.0.1", 0, backlog=128)

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    return loop, server.sockets[0].getsockname()[1]


def _variants() -> dict[str, list[tuple[Any, str, Any]]]:
    """Each variant's patches: (class, attribute, value)."""
    from trayapp.services.proxy.recorder import RequestTap
    from trayapp.services.proxy.recording import Recording

    def nothing(*_: Any, **__: Any) -> None:
        return None

    def no_reading(self: Recording, tap: RequestTap, naming: Any = None) -> Callable[[bytes, float], None]:
        return nothing

    return {
        "ours": [],
        "no recorder": [
            (RequestTap, "active", property(lambda self: False)),
            (Recording, "body_reader", no_reading),
            (Recording, "feed", nothing),
        ],
        "no answer reading": [(Recording, "body_reader", no_reading)],
        "no naming": [(Recording, "name_client", nothing)],
        "no record made": [(Recording, "record", nothing)],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bursts", type=int, default=40, help="bursts of each variant")
    p.add_argument("--streams", type=int, default=50)
    p.add_argument("--src", default=str(BENCH.parent), help="llm-tray tree to run")
    a = p.parse_args()
    sys.path.insert(0, a.src)
    sys.path.insert(0, str(BENCH))
    from proxy_overhead import fake_upstream

    from trayapp.services.proxy.route import Route
    from trayapp.services.proxy.runner import ProxyThread

    variants = _variants()
    saved: dict[tuple[Any, str], Any] = {}

    def apply(name: str) -> None:
        for (owner, attribute), value in saved.items():
            setattr(owner, attribute, value)
        saved.clear()
        for owner, attribute, value in variants[name]:
            saved[(owner, attribute)] = owner.__dict__[attribute]
            setattr(owner, attribute, value)

    def thread_cpu_s(loop: asyncio.AbstractEventLoop) -> float:
        async def read() -> float:
            return time.thread_time()

        return asyncio.run_coroutine_threadsafe(read(), loop).result(10)

    per_request_us: dict[str, list[float]] = {name: [] for name in [*variants, "relay"]}
    with tempfile.TemporaryDirectory() as logs, fake_upstream(Path(logs), 5, 0.02, 0.0) as url:
        upstream_port = int(url.rstrip("/").rsplit(":", 1)[1])
        proxy = ProxyThread([Route("127.0.0.1", 0, url, "vllm")], lambda _route, _record: None)
        proxy_port = int(proxy.start()[0].rsplit(":", 1)[1])
        relay_loop, relay_port = _relay(("127.0.0.1", upstream_port))
        try:
            for burst in range(a.bursts + 1):  # the first round warms up, uncounted
                for name in per_request_us:
                    loop, port = (relay_loop, relay_port) if name == "relay" else (proxy._loop, proxy_port)
                    apply("ours" if name == "relay" else name)
                    before_s = thread_cpu_s(loop)
                    subprocess.run(
                        [
                            sys.executable,
                            str(BENCH / "proxy_timeline.py"),
                            "--clients",
                            str(port),
                            str(a.streams),
                        ],
                        capture_output=True,
                        check=True,
                        timeout=60,
                    )
                    time.sleep(0.15)  # the burst's last records and closes
                    if burst:
                        per_request_us[name].append((thread_cpu_s(loop) - before_s) / a.streams * 1e6)
        finally:
            apply("ours")
            proxy.stop()
            relay_loop.call_soon_threadsafe(relay_loop.stop)
    print(f"CPU of the serving thread a request, {a.bursts} bursts of {a.streams} streams (5-token answers)")
    print("| variant | mean µs | median µs | IQR µs |\n|---|---|---|---|")
    for name, values in per_request_us.items():
        low, _, high = statistics.quantiles(values, n=4)
        mean, median = statistics.mean(values), statistics.median(values)
        print(f"| {name} | {mean:.0f} | {median:.0f} | {low:.0f}–{high:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
