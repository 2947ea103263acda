"""What a proxy costs a streaming client: direct vs llm-tray's proxy vs LiteLLM's proxy, in one run.

    python bench/proxy_overhead.py [--runs 5] [--requests 4] [--json] [--litellm-venv /tmp/litellm-venv]
        [--proxy before=/tmp/before-src] [--proxy counted=.@llamacpp] [--no-litellm] [--relay]
        [--prompt-bytes N] [--keep-alive] [--asyncio]

Streaming `POST /v1/chat/completions`, a fresh TCP connection per request (timed from before the
connect), or with `--keep-alive` each client's connection kept from request to request as the OpenAI
SDKs and httpx keep theirs (timed from the request's write), from one asyncio client (raw sockets: the
same cheap client for every variant). Variants, interleaved request by request
(direct, ours, litellm, direct, …) so that drift hits all of them equally:
- direct: the client talks to the upstream;
- ours: `llm-tray proxy --listen 127.0.0.1:0 --upstream KIND=URL --json --no-record`, its own process,
  on uvloop where installed (the `fast` extra, as the installers install it);
- asyncio (with `--asyncio`): the same on asyncio's own event loop (`LLM_TRAY_PROXY_LOOP=asyncio`), as
  where uvloop is not installed (Windows; a plain `pip install`);
- more llm-tray proxies with `--proxy NAME=SRC[@KIND]` (another source tree, e.g. a `git archive` of
  the commit before a change, and the upstream kind it is told against the fake: `llamacpp` turns the
  prompt counter on, and the fake then answers `/apply-template` and `/tokenize` at llama-server's
  measured pace);
- relay (with `--relay`): the floor of any Python hop — a byte relay on the event loop's transports (no HTTP
  read, parsed or recorded; a fresh upstream connection per client, TCP_NODELAY both sides), its own
  process, on the event loop `ours` uses (uvloop where installed);
- native-relay (with `--native-relay`): the floor of any hop on this machine — HAProxy (C, one
  thread) relaying TCP, nothing parsed, a fresh upstream connection per client;
- litellm (unless `--no-litellm`): LiteLLM's proxy from PyPI in its own venv
  (`bench/requirements-litellm.txt`), started with `LITELLM_LOCAL_MODEL_COST_MAP=True`, the upstream
  as an openai-compatible model, every internet request pointed at a closed local port.
Scenarios: (a) the real llama-server (`-t 1`) on loopback, 1 stream (on 2 cores it serves concurrent
streams one after another, so no 50-stream case there); (b) a fake streaming upstream in its own
process (tests/support/fake_streaming.py, vLLM-style SSE, no server noise) at 1 stream and at 50
concurrent streams. Figures per variant: client-side decode tok/s ((N−1)/(t_last−t_first) over the
content events of a stream) and the server's `timings.predicted_per_second` when it arrives, the ratio
to direct, time to first byte (TTFB) and to the first content token (TTFT) — median and p99 over all
streams, and what the proxy adds to direct, paired per round (its batch against the direct batch just
before it; median over runs × requests rounds, with its 95 % bootstrap interval over those rounds:
a run of few rounds at 50 streams moves by milliseconds), each other llm-tray tree (`--proxy`) also
against ours directly, paired per round (an A/B of two trees: the direct batch's noise cancels), a
verdict per issue #26 target (added median TTFT ≤ 0.4 ms at 1 stream against the fake, ≤ 2 ms at 50
streams and against the real llama-server) — and the proxy process's CPU per request (psutil,
whole process: llm-tray's includes its monitor polls; "net" subtracts the idle rate). Children write
to files, never to a pipe; every wait has a deadline; every process is stopped in `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.llama import LlamaServer, free_port  # noqa: E402

VARIANTS = ("direct", "ours", "litellm")  # the default; `--proxy` adds more, `--no-litellm` drops one
STREAM_TIMEOUT_S = 60.0
START_TIMEOUT_S = 120.0
IDLE_S = 5.0
TIE = 0.005  # throughput ratios this close count as equal (run-to-run noise)
CI_LEVEL = 0.95  # the bootstrap interval printed beside each added median
CI_RESAMPLES = 2000
CI_LEAST_ROUNDS = 5  # fewer rounds than this: no interval (it would mean nothing)
TTFT_TARGET_MS = {"fake 1": 0.4, "fake 50": 2.0, "llama-server 1": 2.0}  # issue #26, added median TTFT
KEY = "sk-" + secrets.token_hex(32)  # LiteLLM's master key (it refuses to start without one)
PROMPT = "Write a long story about a lighthouse keeper and the sea."


# ---------------------------------------------------------------------------------------------- client
@dataclass
class Stream:
    """One streamed response as the client saw it (times in seconds from just before connect)."""

    ok: bool = False
    error: str = ""
    ttfb_s: float | None = None
    ttft_s: float | None = None
    tokens: int = 0
    first_token_s: float = 0.0
    last_token_s: float = 0.0
    server_tok_s: float | None = None

    @property
    def client_tok_s(self) -> float | None:
        span = self.last_token_s - self.first_token_s
        return (self.tokens - 1) / span if self.tokens >= 2 and span > 0 else None


def _request(host: str, port: int, body: bytes, keep_alive: bool) -> bytes:
    close = "" if keep_alive else "Connection: close\r\n"
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nAccept: text/event-stream\r\nContent-Length: {len(body)}\r\n"
        f"{close}\r\n"
    )
    return head.encode() + body


class _Body:
    """Incremental HTTP/1.1 body decoder (chunked, Content-Length or until close) → SSE data lines."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.left = None if self.chunked or length is None else int(length)  # body bytes still to come
        # the connection may carry the next request once this body ends (its end is framed, not a close)
        self.reusable = (self.chunked or self.left is not None) and headers.get("connection") != "close"
        self.buffer = b""
        self.need: int | None = None  # bytes left in the current chunk (+2 for its CRLF)
        self.lines = b""
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        payload = b""
        if not self.chunked:
            payload = data
            if self.left is not None:
                self.left -= len(data)
                self.done = self.left <= 0
        else:
            self.buffer += data
            while not self.done:
                if self.need is None:
                    end = self.buffer.find(b"\r\n")
                    if end < 0:
                        break
                    size = int(self.buffer[:end].split(b";")[0], 16)
                    self.buffer = self.buffer[end + 2 :]
                    if size == 0:
                        self.done = True
                        break
                    self.need = size + 2
                if len(self.buffer) < self.need:
                    break
                payload += self.buffer[: self.need - 2]
                self.buffer = self.buffer[self.need :]
                self.need = None
        self.lines += payload
        *complete, self.lines = self.lines.split(b"\n")
        return [line.strip() for line in complete if line.startswith(b"data:")]


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def one_stream(port: int, body: bytes, kept: list[Connection] | None = None) -> Stream:
    """One streamed request on a fresh connection (timed from before the connect), or, with `kept`
    (a pool of idle connections, as an SDK client keeps), on a kept-alive one (timed from the request's
    write; a connection the server has closed is dropped first, as httpx's pool does)."""
    out = Stream()
    try:
        await asyncio.wait_for(_stream("127.0.0.1", port, body, out, kept), STREAM_TIMEOUT_S)
    except Exception as exc:  # a failed stream is reported, never silently dropped
        out.ok, out.error = False, f"{type(exc).__name__}: {exc}"
    return out


async def _stream(host: str, port: int, body: bytes, out: Stream, kept: list[Connection] | None) -> None:
    connection = None
    while kept and connection is None:
        connection = kept.pop()
        if connection[0].at_eof():  # the server closed it while idle
            connection[1].close()
            connection = None
    if connection is None:
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, port)
    else:
        reader, writer = connection
        t0 = time.perf_counter()
    reuse = False
    try:
        writer.write(_request(host, port, body, kept is not None))
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed before the response head")
            if out.ttfb_s is None:
                out.ttfb_s = time.perf_counter() - t0
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        if " 200 " not in status_line + " ":
            raise RuntimeError(f"{status_line}: {rest[:200]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        decoder = _Body(headers)
        data = rest
        while True:
            now = time.perf_counter() - t0
            for line in decoder.feed(data):
                text = line[5:].strip()
                if text == b"[DONE]":
                    out.ok = True
                    continue
                event = json.loads(text)
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        if out.tokens == 0:
                            out.ttft_s = out.first_token_s = now
                        out.tokens += 1
                        out.last_token_s = now
                timings = event.get("timings")
                if isinstance(timings, dict) and timings.get("predicted_per_second"):
                    out.server_tok_s = float(timings["predicted_per_second"])
            if decoder.done:
                break
            data = await reader.read(65536)
            if not data:
                break
        out.ok = out.ok and out.tokens > 0
        if not out.ok:
            out.error = out.error or "no [DONE] or no content"
        reuse = kept is not None and out.ok and decoder.done and decoder.reusable
    finally:
        if reuse and kept is not None:
            kept.append((reader, writer))
        else:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


# ------------------------------------------------------------------------------------------- processes
def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.1)
    tail = log.read_bytes()[-3000:].decode(errors="replace") if log.exists() else "(no log)"
    raise RuntimeError(f"{what} not ready (exit status {proc.poll()}):\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate by pid (its process group), kill if it lingers; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _spawn(
    cmd: list[str], log_dir: Path, name: str, env: dict[str, str], cwd: Path = REPO
) -> subprocess.Popen[bytes]:
    out = open(log_dir / f"{name}.out", "wb")  # noqa: SIM115  # closed below: the child keeps its copy
    err = open(log_dir / f"{name}.err", "wb")  # noqa: SIM115
    try:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True
        )
    finally:
        out.close()
        err.close()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def fake_upstream(log_dir: Path, tokens: int, token_delay_s: float, prefill_s: float) -> Iterator[str]:
    """The fake vLLM-style upstream in its own process (its threads never share the client's GIL)."""
    port_file = log_dir / "fake.port"
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-fake", str(port_file)]
    cmd += ["--fake-tokens", str(tokens), "--fake-token-delay-s", str(token_delay_s)]
    cmd += ["--fake-prefill-s", str(prefill_s)]
    proc = _spawn(cmd, log_dir, f"fake-{tokens}x{token_delay_s}", dict(os.environ))
    try:
        ready = lambda: port_file.exists() and bool(port_file.read_text())  # noqa: E731
        _wait("fake upstream", ready, proc, log_dir / f"fake-{tokens}x{token_delay_s}.err")
        yield port_file.read_text().strip()
    finally:
        _stop(proc)


def _serve_fake(port_file: Path, tokens: int, token_delay_s: float, prefill_s: float) -> int:
    from tests.support.fake_streaming import FakeStreamingUpstream

    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    knobs = {"tokens": tokens, "token_delay_s": token_delay_s, "prefill_delay_s": prefill_s}
    knobs["answers_counts"] = True  # /apply-template and /tokenize, for a proxy told it is llama-server
    with FakeStreamingUpstream("vllm", **knobs) as fake:
        port_file.write_text(fake.url)
        deadline = time.monotonic() + 1800  # never outlives a forgotten bench
        while not stop[0] and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def _serve_relay(port_file: Path, upstream_url: str) -> int:
    """The relay variant's process: what a Python hop costs with nothing done but moving bytes."""
    from urllib.parse import urlsplit

    from trayapp.services.proxy.exchange import read_small
    from trayapp.services.proxy.runner import new_loop

    parts = urlsplit(upstream_url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 80)

    class Side(asyncio.Protocol):
        def __init__(self, peer: Side | None = None) -> None:
            self.peer, self.pending = peer, bytearray()
            self.transport: Any = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            read_small(transport)  # as the proxy's transports: no fresh 256 KiB buffer per read
            if self.peer is None:  # the client's side: connect upstream, hold bytes until then
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

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Side, "127.0.0.1", 0, backlog=128)
        port_file.write_text(str(server.sockets[0].getsockname()[1]))
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await asyncio.wait_for(stop.wait(), timeout=1800)  # never outlives a forgotten bench

    loop = new_loop()
    with contextlib.suppress(asyncio.TimeoutError):
        loop.run_until_complete(serve())
    return 0


@contextlib.contextmanager
def relay_proxy(log_dir: Path, upstream_url: str) -> Iterator[Proxy]:
    port_file = log_dir / "relay.port"
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-relay", str(port_file), upstream_url]
    proc = _spawn(cmd, log_dir, "relay", dict(os.environ))
    try:
        ready = lambda: port_file.exists() and bool(port_file.read_text())  # noqa: E731
        _wait("relay", ready, proc, log_dir / "relay.err")
        yield Proxy("relay", int(port_file.read_text()), proc)
    finally:
        _stop(proc)


@contextlib.contextmanager
def native_relay(log_dir: Path, upstream_url: str) -> Iterator[Proxy]:
    """The floor of any hop on this machine: HAProxy (C, event-driven, one thread) relaying TCP with
    nothing parsed, `apt install haproxy`; as the Python relay, a fresh upstream connection per client."""
    from urllib.parse import urlsplit

    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("--native-relay needs haproxy on PATH (apt install haproxy)")
    parts = urlsplit(upstream_url)
    port = free_port()
    config = log_dir / "haproxy.cfg"
    config.write_text(
        "global\n  nbthread 1\n  maxconn 1024\n"
        "defaults\n  mode tcp\n  timeout connect 10s\n  timeout client 600s\n  timeout server 600s\n"
        f"frontend hop\n  bind 127.0.0.1:{port}\n  default_backend upstream\n"
        f"backend upstream\n  server up {parts.hostname}:{parts.port}\n"
    )
    proc = _spawn([binary, "-db", "-f", str(config)], log_dir, "native-relay", dict(os.environ))
    try:
        _wait("native-relay", lambda: _port_open(port), proc, log_dir / "native-relay.err")
        yield Proxy("native-relay", port, proc)
    finally:
        _stop(proc)


@dataclass
class Proxy:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    kept: list[Connection] = field(default_factory=list)  # idle client connections (--keep-alive)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its children (0 for direct)."""
        total = 0.0
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid) if self.proc else None
            for p in [root, *root.children(recursive=True)] if root else []:
                with contextlib.suppress(psutil.Error):
                    total += sum(p.cpu_times()[:2])
        return total


@contextlib.contextmanager
def our_proxy(log_dir: Path, upstream: str, src: Path, loop: str = "") -> Iterator[Proxy]:
    """`python -m trayapp proxy` from the source tree `src` (this checkout or a `git archive`); `loop`
    "asyncio" keeps asyncio's event loop where uvloop is installed."""
    env = {**os.environ, "LLM_TRAY_HOME": tempfile.mkdtemp(prefix="llm-tray-bench-", dir=log_dir)}
    env["PYTHONPATH"] = str(src)
    if loop:
        env["LLM_TRAY_PROXY_LOOP"] = loop
    cmd = [sys.executable, "-m", "trayapp", "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream]
    proc = _spawn([*cmd, "--json", "--no-record"], log_dir, "ours", env, cwd=src)
    out = log_dir / "ours.out"

    def listening() -> dict[str, Any] | None:
        for line in out.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "listening":
                return dict(json.loads(line))
        return None

    try:
        _wait("llm-tray proxy", lambda: listening() is not None, proc, log_dir / "ours.err")
        url = str((listening() or {})["listen"])
        yield Proxy("ours", int(url.rsplit(":", 1)[1]), proc)
    finally:
        _stop(proc)


@contextlib.contextmanager
def litellm_proxy(log_dir: Path, venv: Path, upstream_url: str) -> Iterator[Proxy]:
    config = log_dir / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
        f"      api_base: {upstream_url}/v1\n      api_key: sk-bench\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
    )
    port = free_port()
    closed = f"http://127.0.0.1:{free_port()}"  # any internet request fails at once, never leaves
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "NO_PROXY": "127.0.0.1,localhost",
           "LITELLM_LOG": "ERROR", "HF_HUB_OFFLINE": "1", "LITELLM_MASTER_KEY": KEY}  # fmt: skip
    env.pop("PYTHONPATH", None)
    cmd = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
    proc = _spawn([*cmd, "--port", str(port), "--num_workers", "1"], log_dir, "litellm", env)
    try:
        _wait("litellm", lambda: _port_open(port), proc, log_dir / "litellm.err")
        yield Proxy("litellm", port, proc)
    finally:
        _stop(proc)


# ----------------------------------------------------------------------------------------- the bench
@dataclass
class Scenario:
    name: str
    concurrency: int
    variants: tuple[str, ...] = VARIANTS
    samples: dict[str, list[list[Stream]]] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    idle_cpu_pct: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.variants:
            self.samples[name], self.failures[name] = [], []
            self.cpu_s[name] = self.wall_s[name] = 0.0


async def _batch(proxy: Proxy, body: bytes, n: int, keep_alive: bool) -> tuple[list[Stream], float, float]:
    """n concurrent streams → (streams, proxy CPU seconds, wall seconds)."""
    kept = proxy.kept if keep_alive else None
    cpu0, t0 = proxy.cpu_s(), time.perf_counter()
    streams = await asyncio.gather(*(one_stream(proxy.port, body, kept) for _ in range(n)))
    return list(streams), proxy.cpu_s() - cpu0, time.perf_counter() - t0


async def run_scenario(
    sc: Scenario, proxies: dict[str, Proxy], body: bytes, runs: int, requests: int, keep_alive: bool
) -> None:
    try:
        await _rounds(sc, proxies, body, runs, requests, keep_alive)
    finally:
        for proxy in proxies.values():
            for _, writer in proxy.kept:
                writer.close()
            proxy.kept.clear()


async def _rounds(
    sc: Scenario, proxies: dict[str, Proxy], body: bytes, runs: int, requests: int, keep_alive: bool
) -> None:
    for proxy in proxies.values():  # warm-up: first connections (all of them, kept alive), imports, caches
        await _batch(proxy, body, sc.concurrency if keep_alive else min(sc.concurrency, 4), keep_alive)
    idle0 = {name: proxy.cpu_s() for name, proxy in proxies.items()}
    await asyncio.sleep(IDLE_S)  # background CPU (llm-tray's monitor polls, LiteLLM's own loops)
    sc.idle_cpu_pct = {name: (proxies[name].cpu_s() - idle0[name]) * 100 / IDLE_S for name in sc.variants}
    rounds = 1 if sc.concurrency > 1 else requests
    others = [name for name in sc.variants if name != "direct"]
    for i in range(runs * rounds):  # one round: direct, then each proxy (in rotating order), back to back
        turn = i % len(others) if others else 0
        for name in ["direct", *others[turn:], *others[:turn]]:
            streams, cpu, wall = await _batch(proxies[name], body, sc.concurrency, keep_alive)
            sc.failures[name] += [s.error for s in streams if not s.ok]
            sc.samples[name].append([s for s in streams if s.ok])
            sc.cpu_s[name] += cpu
            sc.wall_s[name] += wall


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """A percentile-bootstrap interval (CI_LEVEL) of the median of `values`, one value a round (a
    round's batch is one paired measurement, its streams are not independent); seeded, so the same
    rounds give the same interval. None with fewer than CI_LEAST_ROUNDS rounds."""
    if len(values) < CI_LEAST_ROUNDS:
        return None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(CI_RESAMPLES))
    tail = round((1 - CI_LEVEL) / 2 * CI_RESAMPLES)
    return medians[tail], medians[CI_RESAMPLES - 1 - tail]


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summarize(sc: Scenario) -> dict[str, Any]:
    """Per variant: median and p99 over all streams; added and ratio to direct paired per round
    (this variant's batch median against the direct batch just before it), median over rounds."""

    def per_run(name: str, pick: Callable[[Stream], float | None]) -> list[float | None]:
        return [_median([x for s in batch if (x := pick(s)) is not None]) for batch in sc.samples[name]]

    def flat(name: str, pick: Callable[[Stream], float | None]) -> list[float]:
        return [x for run in sc.samples[name] for s in run if (x := pick(s)) is not None]

    picks: dict[str, Callable[[Stream], float | None]] = {
        "client_tok_s": lambda s: s.client_tok_s,
        "server_tok_s": lambda s: s.server_tok_s,
        "client_over_server": lambda s: (
            s.client_tok_s / s.server_tok_s if s.client_tok_s and s.server_tok_s else None
        ),  # delivery vs the server's own rate: server-speed noise cancels
        "ttfb_ms": lambda s: None if s.ttfb_s is None else s.ttfb_s * 1000,
        "ttft_ms": lambda s: None if s.ttft_s is None else s.ttft_s * 1000,
    }
    out: dict[str, Any] = {"scenario": sc.name, "concurrency": sc.concurrency, "variants": {}}
    base = {key: per_run("direct", pick) for key, pick in picks.items()}
    for name in sc.variants:
        row: dict[str, Any] = {"streams_ok": sum(len(r) for r in sc.samples[name])}
        row["streams_failed"] = len(sc.failures[name])
        row["first_failures"] = sc.failures[name][:3]
        row["tokens_median"] = _median([float(s.tokens) for r in sc.samples[name] for s in r])
        for key, pick in picks.items():
            runs = per_run(name, pick)
            row[key] = _median(flat(name, pick))
            row[f"{key}_p99"] = _p99(flat(name, pick))
            if key.endswith("_ms"):  # paired per round: (variant − direct) of the same round
                deltas = [
                    a - b for a, b in zip(runs, base[key], strict=True) if a is not None and b is not None
                ]
                row[f"added_{key}"] = _median(deltas)
                row[f"added_{key}_ci"] = median_ci(deltas)
                p99, p99_direct = row[f"{key}_p99"], _p99(flat("direct", pick))
                row[f"added_{key}_p99"] = None if p99 is None or p99_direct is None else p99 - p99_direct
            else:
                ratios = [a / b for a, b in zip(runs, base[key], strict=True) if a and b]
                row[f"{key}_ratio"] = _median(ratios)
        n_ok = row["streams_ok"] + row["streams_failed"]
        proxied = name != "direct" and n_ok > 0
        row["cpu_ms_per_request"] = sc.cpu_s[name] * 1000 / n_ok if proxied else None
        row["idle_cpu_pct"] = sc.idle_cpu_pct.get(name) if proxied else None
        idle_s = (row["idle_cpu_pct"] or 0.0) / 100 * sc.wall_s[name]  # what it burns with no request
        row["net_cpu_ms_per_request"] = (sc.cpu_s[name] - idle_s) * 1000 / n_ok if proxied else None
        row["cpu_pct_while_streaming"] = sc.cpu_s[name] * 100 / sc.wall_s[name] if sc.wall_s[name] else None
        out["variants"][name] = row
    ours_ttft = per_run("ours", picks["ttft_ms"]) if "ours" in sc.variants else []
    for name in sc.variants:
        if name in ("direct", "ours"):
            continue
        # against ours directly, round by round: the direct batch's noise cancels (an A/B of two trees)
        runs = per_run(name, picks["ttft_ms"])
        deltas = [a - b for a, b in zip(runs, ours_ttft, strict=True) if a is not None and b is not None]
        out["variants"][name]["ttft_ms_minus_ours"] = _median(deltas)
        out["variants"][name]["ttft_ms_minus_ours_ci"] = median_ci(deltas)
        out["variants"][name]["rounds"] = len(deltas)
    return out


def _fmt(value: float | None, spec: str, signed: bool = False) -> str:
    return "—" if value is None else format(value, ("+" if signed else "") + spec)


COLUMNS = (
    "upstream, streams", "variant", "client tok/s (× direct)", "server tok/s (× direct)",
    "TTFB median (added)", "added TTFB p99", "TTFT median (added)", "added TTFT p99",
    "proxy CPU ms/request (net of idle)", "idle CPU %", "tokens", "ok/failed",
)  # fmt: skip


def _cells(res: dict[str, Any], name: str, r: dict[str, Any]) -> list[str]:
    direct = name == "direct"

    def times(key: str) -> list[str]:
        added = "" if direct else f" ({_fmt(r['added_' + key], '.2f', True)}{_ci(r['added_' + key + '_ci'])})"
        p99 = "—" if direct else _fmt(r[f"added_{key}_p99"], ".2f", True)
        return [f"{_fmt(r[key], '.2f')}{added}", p99]

    def rate(key: str) -> str:
        ratio = "" if direct or r[key] is None else f" ({_fmt(r[key + '_ratio'], '.3f')}×)"
        return f"{_fmt(r[key], '.1f')}{ratio}"

    cpu = f"{_fmt(r['cpu_ms_per_request'], '.1f')} ({_fmt(r['net_cpu_ms_per_request'], '.1f')})"
    return [
        f"{res['scenario']}, {res['concurrency']}", name, rate("client_tok_s"), rate("server_tok_s"),
        *times("ttfb_ms"), *times("ttft_ms"), "—" if direct else cpu, _fmt(r["idle_cpu_pct"], ".2f"),
        _fmt(r["tokens_median"], ".0f"), f"{r['streams_ok']}/{r['streams_failed']}",
    ]  # fmt: skip


def _ci(interval: tuple[float, float] | None) -> str:
    return (
        "" if interval is None else f" [{_fmt(interval[0], '.2f', True)}, {_fmt(interval[1], '.2f', True)}]"
    )


def markdown(results: list[dict[str, Any]]) -> str:
    """The results table (times in ms; "added" = variant − direct, paired per run; [a, b] its
    bootstrap interval), then each other tree against ours, paired per round."""
    rows = [COLUMNS, tuple("---" for _ in COLUMNS)]
    rows += [tuple(_cells(res, name, r)) for res in results for name, r in res["variants"].items()]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.append(
        f"\n(added: the variant's batch median − the direct batch's of the same round, median over rounds; "
        f"[a, b]: its {CI_LEVEL:.0%} bootstrap interval over those rounds)"
    )
    for res in results:
        for name, r in res["variants"].items():
            if "ttft_ms_minus_ours" in r:
                lines.append(
                    f"- {res['scenario']}, {res['concurrency']}: {name} − ours, TTFT paired per round: "
                    f"{_fmt(r['ttft_ms_minus_ours'], '.2f', True)} ms{_ci(r['ttft_ms_minus_ours_ci'])} "
                    f"({r['rounds']} rounds)"
                )
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, each MET or MISSED, never hidden."""
    verdicts: list[str] = []
    for res in results:
        ours, lite = res["variants"]["ours"], res["variants"].get("litellm")
        label = f"{res['scenario']}, {res['concurrency']} stream(s)"
        ratio = ours["client_tok_s_ratio"]
        delivery = ours["client_over_server_ratio"]  # the server's own rate moves too: it cancels here
        judged = delivery if delivery is not None else ratio
        met = judged is not None and judged >= 0.99
        how = f"client ÷ server {_fmt(delivery, '.3f')}× direct's; raw" if delivery is not None else "raw"
        verdicts.append(f"{label}: throughput ≥ 0.99× direct: {_verdict(met)} ({how} {_fmt(ratio, '.3f')}×)")
        target_ms = TTFT_TARGET_MS.get(f"{res['scenario'].split(' ')[0]} {res['concurrency']}")
        if target_ms is not None:
            added = ours["added_ttft_ms"]
            met = added is not None and added <= target_ms
            shown = f"{_fmt(added, '.2f', True)} ms{_ci(ours['added_ttft_ms_ci'])}"
            verdicts.append(f"{label}: added median TTFT ≤ {target_ms:g} ms: {_verdict(met)} ({shown})")
        if lite is None:
            continue
        keys = ("added_ttfb_ms", "added_ttfb_ms_p99", "added_ttft_ms", "added_ttft_ms_p99")
        keys += ("cpu_ms_per_request", "net_cpu_ms_per_request")
        worse = [k for k in keys if ours[k] is not None and lite[k] is not None and ours[k] > lite[k]]
        lite_ratio = lite["client_tok_s_ratio"]  # within TIE: a tie (noise; bunched tokens read high)
        note = ""
        if delivery is not None and lite["client_over_server_ratio"] is None:
            note = "; tok/s not compared: LiteLLM drops `timings`, so its ratio keeps the server's noise"
        elif ratio is not None and lite_ratio is not None and ratio < lite_ratio - TIE:
            worse.insert(0, "client_tok_s")
        behind = f" (behind on {', '.join(worse)})" if worse else ""
        verdicts.append(f"{label}: ahead of LiteLLM on every figure: {_verdict(not worse)}{behind}{note}")
    return verdicts


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def _body(max_tokens: int, llama: bool, prompt_bytes: int = 0) -> bytes:
    body: dict[str, Any] = {"model": "bench", "stream": True}
    prompt = (PROMPT + " ") * max(1, prompt_bytes // (len(PROMPT) + 1)) if prompt_bytes else PROMPT
    body["messages"] = [{"role": "user", "content": prompt}]
    if llama:
        body |= {"max_tokens": max_tokens, "temperature": 0, "seed": 1, "ignore_eos": True}
    return json.dumps(body).encode()


def _scenario(
    sc: Scenario, proxies: dict[str, Proxy], direct_port: int, body: bytes, a: Any
) -> dict[str, Any]:
    proxies = {"direct": Proxy("direct", direct_port), **proxies}
    sc.variants = tuple(proxies)
    sc.__post_init__()
    asyncio.run(run_scenario(sc, proxies, body, a.runs, a.requests, a.keep_alive))
    return summarize(sc)


@contextlib.contextmanager
def all_proxies(
    log_dir: Path, a: argparse.Namespace, upstream_url: str, fake: bool
) -> Iterator[dict[str, Proxy]]:
    """Ours (and every `--proxy`) and LiteLLM in front of `upstream_url`; a proxy's KIND only
    against the fake (the real server is llama-server to all of them)."""
    with contextlib.ExitStack() as stack:
        proxies: dict[str, Proxy] = {}
        for name, src, kind in [("ours", a.src, a.fake_kind), *a.proxy]:
            told = (kind or a.fake_kind) if fake else "llamacpp"
            proc_dir = log_dir / name
            proc_dir.mkdir(exist_ok=True)
            proxy = stack.enter_context(our_proxy(proc_dir, f"{told}={upstream_url}", src))
            proxies[name] = Proxy(name, proxy.port, proxy.proc)
        if a.asyncio:
            proc_dir = log_dir / "asyncio"
            proc_dir.mkdir(exist_ok=True)
            told = a.fake_kind if fake else "llamacpp"
            proxy = stack.enter_context(our_proxy(proc_dir, f"{told}={upstream_url}", a.src, loop="asyncio"))
            proxies["asyncio"] = Proxy("asyncio", proxy.port, proxy.proc)
        if a.relay:
            proxies["relay"] = stack.enter_context(relay_proxy(log_dir, upstream_url))
        if a.native_relay:
            proxies["native-relay"] = stack.enter_context(native_relay(log_dir, upstream_url))
        if not a.no_litellm:
            proxies["litellm"] = stack.enter_context(litellm_proxy(log_dir, a.litellm_venv, upstream_url))
        yield proxies


def _proxy_spec(text: str) -> tuple[str, Path, str | None]:
    """`NAME=SRC[@KIND]` → (name, source tree, upstream kind against the fake)."""
    name, _, rest = text.partition("=")
    src, _, kind = rest.partition("@")
    if not name or not src or name in ("direct", "ours", "asyncio", "litellm", "relay", "native-relay"):
        raise argparse.ArgumentTypeError(f"--proxy NAME=SRC[@KIND], a new name: {text!r}")
    return name, Path(src).resolve(), kind or None


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="repetitions (rounds = runs × requests at 1 stream)")
    p.add_argument("--requests", type=int, default=4, help="1-stream requests per variant per run")
    p.add_argument("--llama-tokens", type=int, default=32, help="max_tokens per llama-server request")
    p.add_argument("--fake-tokens", type=int, default=100)
    p.add_argument("--fake-token-delay-s", type=float, default=0.01, help="1 stream (100 tok/s)")
    p.add_argument("--fake-prefill-s", type=float, default=0.02)
    p.add_argument("--concurrent", type=int, default=50)
    p.add_argument("--concurrent-tokens", type=int, default=50)
    p.add_argument("--concurrent-token-delay-s", type=float, default=0.02, help="per stream (50 tok/s)")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out (no venv needed)")
    reuse = "each client keeps its connection from request to request (as the OpenAI SDKs and httpx do)"
    p.add_argument("--keep-alive", action="store_true", help=reuse)
    on_asyncio = "add ours on asyncio's event loop (LLM_TRAY_PROXY_LOOP=asyncio), beside ours on uvloop"
    p.add_argument("--asyncio", action="store_true", help=on_asyncio)
    p.add_argument("--relay", action="store_true", help="add the floor: a Python byte relay, nothing parsed")
    native = "add the floor of any hop: HAProxy relaying TCP (C), nothing parsed"
    p.add_argument("--native-relay", action="store_true", help=native)
    another = "another llm-tray proxy: its source tree and the upstream kind told (fake only)"
    p.add_argument(
        "--proxy", type=_proxy_spec, action="append", default=[], metavar="NAME=SRC[@KIND]", help=another
    )
    p.add_argument("--fake-kind", default="vllm", help="the upstream kind `ours` is told against the fake")
    p.add_argument("--prompt-bytes", type=int, default=0, help="a longer prompt (the counter counts ≥ 8 KiB)")
    p.add_argument("--src", type=Path, default=REPO, help="llm-tray source tree to run (default: this one)")
    venv = Path(os.environ.get("LITELLM_VENV", "/tmp/litellm-venv"))
    p.add_argument("--litellm-venv", type=Path, default=venv)
    p.add_argument("--json", action="store_true", help="print the results as JSON (after the table)")
    p.add_argument("--log-dir", type=Path, default=None, help="children's output (default: a temp dir)")
    p.add_argument("--serve-fake", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-relay", nargs=2, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.serve_fake is not None:
        return _serve_fake(a.serve_fake, a.fake_tokens, a.fake_token_delay_s, a.fake_prefill_s)
    if a.serve_relay is not None:
        return _serve_relay(Path(a.serve_relay[0]), a.serve_relay[1])
    venv = a.litellm_venv
    if not a.no_litellm and not (venv / "bin" / "litellm").exists():
        hint = f"python -m venv {venv} && {venv}/bin/pip install -r bench/requirements-litellm.txt"
        print(f"no LiteLLM in {venv}: {hint}", file=sys.stderr)
        return 2
    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix="proxy-overhead-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"logs: {log_dir}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    if not a.skip_llama:
        with (
            LlamaServer(threads=1, log_dir=log_dir) as server,
            all_proxies(log_dir, a, server.url, fake=False) as proxies,
        ):
            body = _body(a.llama_tokens, True, a.prompt_bytes)
            results.append(_scenario(Scenario("llama-server", 1), proxies, server.port, body, a))
    plan = [(1, a.fake_tokens, a.fake_token_delay_s)]
    if a.concurrent > 1:
        plan.append((a.concurrent, a.concurrent_tokens, a.concurrent_token_delay_s))
    for concurrency, tokens, delay_s in plan:
        with (
            fake_upstream(log_dir, tokens, delay_s, a.fake_prefill_s) as url,
            all_proxies(log_dir, a, url, fake=True) as proxies,
        ):
            sc = Scenario(f"fake ({1 / delay_s:g} tok/s)", concurrency)
            body = _body(tokens, False, a.prompt_bytes)
            results.append(_scenario(sc, proxies, int(url.rsplit(":", 1)[1]), body, a))
    print(markdown(results))
    print()
    print("\n".join(f"- {line}" for line in targets(results)))
    if a.json:
        print(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
