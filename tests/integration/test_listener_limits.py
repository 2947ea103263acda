"""Hostile clients against the snapshot/SSE endpoint and `/metrics` (#25, docs/security.md).

Over real loopback sockets, in process (limits made small by monkeypatch so each case takes
seconds): idle and trickling connections are closed at the request deadline, the connection cap
answers a clear 503 from the accept thread, event streams whose client does not read are dropped and
free their slot for `bar --follow`, a rebound `Host` and a browser `Origin` get 403, failed accepts
(EMFILE) are logged once and serving goes on; then a child process at a real file-descriptor limit,
and `llm-tray agent`'s loop living through ticks that fail.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import socketserver
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import snapshots as s
from tests.support.fake_monitor import FakeMonitor
from tests.support.fake_servers import wait_until
from trayapp.cli import agent as agent_cli
from trayapp.sinks import listener, metrics, snapshot_server
from trayapp.sinks.metrics import MetricsState, start_exporter
from trayapp.sinks.snapshot_server import SnapshotServer

WAIT_S = 20.0


def decoding(t: float, models: int = 1) -> Any:
    return s.snap(t, s.server(*[s.model(f"model-{i}", "decoding", 42.0) for i in range(models)]))


@pytest.fixture
def snapshots() -> Iterator[SnapshotServer]:
    srv = SnapshotServer(request_timeout_s=1.0, stream_stall_s=0.5, allowed_hosts=("gpu-box.lan",),
                         allowed_origins=("http://localhost:3000",)).start()  # fmt: skip
    srv.publish(decoding(1.0))
    wait_until(lambda: srv.latest(), 5.0)
    try:
        yield srv
    finally:
        srv.stop(2.0)


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[metrics.Exporter]:
    monkeypatch.setattr(metrics._MetricsHandler, "request_timeout_s", 1.0)
    state = MetricsState()
    state.observe(decoding(1.0))
    exp = start_exporter(
        state, port=0, allowed_hosts=("gpu-box.lan",), allowed_origins=("http://localhost:3000",)
    )
    try:
        yield exp
    finally:
        exp.stop()


def _base(listener_fixture: Any) -> str:
    url = str(listener_fixture.url)
    return url if isinstance(listener_fixture, SnapshotServer) else url.removesuffix("/metrics")


def _path(listener_fixture: Any) -> str:
    return "/v1/snapshot" if isinstance(listener_fixture, SnapshotServer) else "/metrics"


@pytest.fixture(params=["snapshot", "metrics"])
def either(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("snapshots" if request.param == "snapshot" else "exporter")


def _closed_within(sock: socket.socket, limit_s: float, trickle: bytes = b"") -> float:
    """Seconds until the server closes `sock` (sending `trickle` a byte every 0.1 s meanwhile)."""
    started = time.monotonic()
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - started < limit_s:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started
        if sent < len(trickle):
            try:
                sock.send(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
    raise AssertionError(f"still open after {limit_s} s")


# --------------------------------------------------------------------------- deadlines


def test_an_idle_connection_is_closed_at_the_request_deadline(either: Any) -> None:
    """Before #25 /metrics (wsgiref, no timeout) held a thread per idle connection forever."""
    idle = socket.create_connection(("127.0.0.1", either.port))
    try:
        assert _closed_within(idle, 5.0) < 3.0  # the deadline is 1 s here
    finally:
        idle.close()
    assert httpx.get(_base(either) + _path(either), timeout=2).status_code == 200


def test_a_trickling_request_is_closed_however_steadily_it_sends(either: Any) -> None:
    """A byte every 0.1 s keeps a per-read socket timeout from ever firing: the deadline is for the
    whole request."""
    trickle = socket.create_connection(("127.0.0.1", either.port))
    try:
        head = b"GET " + _path(either).encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200
        assert _closed_within(trickle, 6.0, trickle=head) < 3.0
    finally:
        trickle.close()


# --------------------------------------------------------------------------- the connection cap


def test_at_the_cap_the_longest_idle_connection_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four idle connections fill a cap of four: a fifth client is served at once, and the one that has
    waited longest is closed for it (before, every new client got 503 until an idle one timed out:
    200 idle connections kept `bar --follow` and the scraper out for good; tests/integration/test_soak.py)."""
    monkeypatch.setattr(snapshot_server, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 4)
    srv = SnapshotServer(request_timeout_s=30.0).start()
    srv.publish(decoding(1.0))
    state = MetricsState()
    exp = start_exporter(state, port=0)
    try:
        for base, path in ((srv.url, "/v1/snapshot"), (exp.url.removesuffix("/metrics"), "/metrics")):
            wait_until(lambda base=base, path=path: httpx.get(base + path, timeout=2).status_code == 200, 5.0)
            held = []
            for _ in range(4):  # one at a time, so their order is the order they began to wait
                held.append(socket.create_connection(("127.0.0.1", int(base.rpartition(":")[2]))))
                time.sleep(0.05)
            try:
                served = httpx.get(base + path, timeout=5)
                assert served.status_code == 200
                assert _closed_within(held[0], 5.0) >= 0  # the oldest idle one gave up its slot
                for sock in held[1:]:  # the others still wait, untouched
                    sock.setblocking(False)
                    with pytest.raises(BlockingIOError):
                        sock.recv(1)
            finally:
                for sock in held:
                    sock.close()
    finally:
        srv.stop(2.0)
        exp.stop()


def test_at_the_cap_of_busy_connections_a_new_one_gets_503_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four event streams being served fill a cap of four: none gives up its slot, and a new client gets
    a clear 503 from the accept thread at once."""
    monkeypatch.setattr(snapshot_server, "MAX_CONNECTIONS", 4)
    srv = SnapshotServer(request_timeout_s=30.0).start()
    srv.publish(decoding(1.0))
    port = int(srv.url.rpartition(":")[2])
    try:
        streams = []
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.settimeout(5.0)
            assert sock.recv(4096).startswith(b"HTTP/1.")  # its stream began: it is served, not waiting
            streams.append(sock)
        try:
            started = time.monotonic()
            refused = httpx.get(srv.url + "/v1/snapshot", timeout=5)
            assert time.monotonic() - started < 1.0  # answered by the accept thread, no waiting
            assert refused.status_code == 503
            assert "too many connections (4)" in refused.text
            assert refused.headers["Retry-After"] == "1"
        finally:
            for sock in streams:
                sock.close()
        ticks = iter(range(2, 1000))

        def served_after_a_tick() -> bool:  # a stream finds its client gone at its next write
            srv.publish(decoding(float(next(ticks))))
            return httpx.get(srv.url + "/v1/snapshot", timeout=2).status_code == 200

        wait_until(served_after_a_tick, 5.0)
    finally:
        srv.stop(2.0)


# --------------------------------------------------------------------------- SSE fairness


def _non_reader(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return sock


def test_streams_that_do_not_read_are_dropped_and_free_their_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 clients that connect to /v1/events and never read held every slot: `bar --follow` got 503
    forever. Their buffers fill, a write waits STREAM_STALL_S (0.5 s here) and they are dropped."""
    monkeypatch.setattr(snapshot_server, "MAX_STREAMS", 3)
    srv = SnapshotServer(request_timeout_s=2.0, stream_stall_s=0.5).start()
    srv.publish(decoding(1.0, models=20))
    wait_until(lambda: srv.latest(), 5.0)
    stuck = [_non_reader(srv.port) for _ in range(3)]
    try:
        wait_until(lambda: srv._streams == 3, 5.0)
        refused = httpx.get(srv.url + "/v1/events", timeout=2)
        assert refused.status_code == 503 and "too many event streams" in refused.text

        tick = [1.0]

        def follow_gets_a_stream() -> bool:
            for _ in range(20):  # ticks go on: the non-readers' buffers fill
                tick[0] += 1
                srv.publish(decoding(tick[0], models=20))
                time.sleep(0.01)
            with (
                httpx.Client(timeout=httpx.Timeout(2.0, read=5.0)) as client,
                client.stream("GET", srv.url + "/v1/events") as response,
            ):
                if response.status_code != 200:
                    return False
                for line in response.iter_lines():
                    if line.startswith("event: snapshot"):
                        return True
            return False

        started = time.monotonic()
        wait_until(follow_gets_a_stream, WAIT_S)
        assert time.monotonic() - started < 15.0
        for sock in stuck:  # the server closed them: what is buffered, then EOF or a reset
            sock.settimeout(5.0)
            try:
                while sock.recv(1 << 20):
                    pass
            except ConnectionResetError:
                pass
    finally:
        for sock in stuck:
            sock.close()
        srv.stop(2.0)


# --------------------------------------------------------------------------- Host and Origin


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "localhost"}, 200),
        ({"Host": "LOCALHOST:9464"}, 200),
        ({"Host": "127.0.0.1:1"}, 200),
        ({"Host": "[::1]:9465"}, 200),
        ({"Host": "gpu-box.lan:80"}, 200),  # a name the user allowed
        ({"Host": "attacker.example"}, 403),  # DNS rebinding: the page's own name
        ({"Host": "attacker.example:80"}, 403),
        ({"Host": "127.0.0.1.nip.io"}, 403),
        ({"Host": "localhost", "Origin": "https://attacker.example"}, 403),
        ({"Host": "localhost", "Origin": "null"}, 403),
        ({"Host": "localhost", "Origin": "http://localhost:3000"}, 200),  # an Origin the user allowed
    ],
)
def test_host_and_origin_on_a_loopback_listener(either: Any, headers: dict[str, str], status: int) -> None:
    response = httpx.get(_base(either) + _path(either), headers=headers, timeout=2)
    assert response.status_code == status
    if status == 403:
        assert ("Host" in response.text and "refused" in response.text) or "Origin" in response.text
        assert "docs/security.md" in response.text
        assert "model-0" not in response.text and "llm_tray_" not in response.text


def test_two_host_headers_are_refused(snapshots: SnapshotServer) -> None:
    sock = socket.create_connection(("127.0.0.1", snapshots.port), timeout=5)
    try:
        sock.sendall(b"GET /v1/snapshot HTTP/1.1\r\nHost: localhost\r\nHost: attacker.example\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.0 400")
    finally:
        sock.close()


def test_host_is_not_checked_beyond_loopback_where_the_token_guards() -> None:
    srv = SnapshotServer("0.0.0.0", token="tok-7").start()
    try:
        srv.publish(decoding(1.0))
        good = {"Authorization": "Bearer tok-7", "Host": "gpu-box:9465"}
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{srv.port}/v1/snapshot", headers=good, timeout=2)
                   .status_code == 200, 5.0)  # fmt: skip
        browser = {**good, "Origin": "http://gpu-box:9465"}
        assert (
            httpx.get(f"http://127.0.0.1:{srv.port}/v1/snapshot", headers=browser, timeout=2).status_code
            == 403
        )
    finally:
        srv.stop(2.0)


# --------------------------------------------------------------------------- /metrics and its token


def test_metrics_beyond_loopback_needs_the_token_and_asks_every_scrape_for_it() -> None:
    state = MetricsState()
    state.observe(decoding(1.0))
    with pytest.raises(ValueError, match="needs a token"):
        start_exporter(state, "0.0.0.0", 0)
    exp = start_exporter(state, "0.0.0.0", 0, token="scrape-tok")
    try:
        url = f"http://127.0.0.1:{exp.port}/metrics"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-tok"}):
            response = httpx.get(url, headers=headers, timeout=2)
            assert response.status_code == 401 and "llm_tray_" not in response.text
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        ok = httpx.get(url, headers={"Authorization": "Bearer scrape-tok"}, timeout=2)
        assert ok.status_code == 200 and "llm_tray_decode_tokens_per_second" in ok.text
    finally:
        exp.stop()
    loopback = start_exporter(state, "127.0.0.1", 0, token="scrape-tok")  # on loopback: no token asked
    try:
        assert httpx.get(loopback.url, timeout=2).status_code == 200
    finally:
        loopback.stop()


def test_the_agent_refuses_metrics_beyond_loopback_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path))
    monkeypatch.delenv("LLM_TRAY_TOKEN", raising=False)
    monitor = FakeMonitor()
    args = argparse.Namespace(listen_address="0.0.0.0", metrics_port=0, no_snapshot=True, duration=0.1)
    assert agent_cli.run_agent(args, monitor) == 1  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "--listen-address 0.0.0.0" in err and "needs a token" in err
    assert monitor.closed

    monkeypatch.setenv("LLM_TRAY_TOKEN", "agent-tok")
    monitor = FakeMonitor()
    assert agent_cli.run_agent(args, monitor) == 0  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "warning: /metrics listens beyond loopback" in err and "$LLM_TRAY_TOKEN" in err


# --------------------------------------------------------------------------- accept failures


def test_failed_accepts_are_logged_once_and_serving_goes_on(
    snapshots: SnapshotServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = socketserver.TCPServer.get_request
    failures = [5]

    def failing(self: socketserver.TCPServer) -> Any:
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return original(self)

    monkeypatch.setattr(socketserver.TCPServer, "get_request", failing)
    with caplog.at_level(logging.INFO, logger=listener.__name__):
        assert httpx.get(snapshots.url + "/v1/snapshot", timeout=5).status_code == 200
    assert failures[0] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Too many open files" in warnings[0] and "snapshot endpoint" in warnings[0]


_AT_THE_FD_LIMIT = textwrap.dedent(
    """
    import resource, sys, time
    from tests.support import snapshots as s
    from trayapp.sinks.metrics import MetricsState, start_exporter
    from trayapp.sinks.snapshot_server import SnapshotServer
    srv = SnapshotServer(request_timeout_s=2.0).start()
    srv.publish(s.snap(1.0, s.server(s.model("m", "decoding", 42.0))))
    state = MetricsState()
    exp = start_exporter(state, port=0)
    import os
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 8, used + 8))
    print(srv.port, exp.port, flush=True)
    sys.stdin.readline()  # until the test is done
    srv.stop(1.0); exp.stop(1.0)
    print("alive", flush=True)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd")
def test_listeners_at_a_real_fd_limit_keep_serving() -> None:
    """A child whose fd limit leaves room for 8 more: 40 connections to each listener hit EMFILE; when
    they go, both serve again and the process lives on."""
    pipe = subprocess.PIPE
    child = subprocess.Popen([sys.executable, "-c", _AT_THE_FD_LIMIT], stdin=pipe, stdout=pipe, stderr=pipe,
                             text=True, cwd=os.getcwd())  # fmt: skip
    try:
        assert child.stdout is not None
        snap_port, metrics_port = map(int, child.stdout.readline().split())
        for port, path in ((snap_port, "/v1/snapshot"), (metrics_port, "/metrics")):
            held = []
            for _ in range(40):
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break
            time.sleep(0.5)
            for sock in held:
                sock.close()

            def served(port: int = port, path: str = path) -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(served, 8.0)
        assert child.poll() is None
        out, err = child.communicate("done\n", timeout=30)
        assert "alive" in out, err
        assert "Traceback" not in err, err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# --------------------------------------------------------------------------- the agent's loop


class _FailingMonitor(FakeMonitor):
    """Ticks that fail as at the fd limit, then recover."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.settings = type("S", (), {"thresholds": None})()

    def tick(self) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().tick()

    def next_interval_s(self) -> float:
        return 0.05

    def activity_seen(self) -> bool:

        return False


def test_the_agent_lives_through_ticks_that_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before #25 an OSError from `monitor.tick()` (EMFILE) ended `llm-tray agent`."""
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path))
    monkeypatch.delenv("LLM_TRAY_TOKEN", raising=False)
    monkeypatch.setattr(agent_cli, "TICK_RETRY_S", 0.05)
    monitor = _FailingMonitor(failures=3)
    args = argparse.Namespace(listen_address="127.0.0.1", metrics_port=0, no_snapshot=True, duration=1.0)
    assert agent_cli.run_agent(args, monitor) == 0  # type: ignore[arg-type]
    assert monitor.failures == 0 and monitor.ticks > 0
    err = capsys.readouterr().err
    assert err.count("tick failed (OSError: [Errno 24] Too many open files)") == 1  # once per episode
    assert "ticking again" in err
