"""Reader threads outlive a bug or a dead child (found in review): the router's `/models/sse`
follower over a loopback SSE server, and a `macmon pipe` child that stops (a script printing macmon's
real lines stands in for it: macmon runs only on macOS)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.support.macmon import MACMON_LINES
from trayapp.sources.energy import MacmonProbe
from trayapp.sources.servers.llamacpp_events import RouterEvent, RouterEventStream


def chunked(body: bytes, size: int) -> bytes:
    """`body` framed as HTTP/1.1 chunks of `size` bytes (as the router's cpp-httplib sends it)."""
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


def test_a_bug_while_following_the_stream_is_logged_once_and_the_stream_says_down(
    fixtures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in what handles an event (the book, the probe's callback) must not leave the thread dead
    with its state still "connected" (the probe would trust a frozen book and never read /models
    again): the stream says "down", so the probe polls, and the bug's traceback is logged once."""
    captured = fixtures_dir / "llama-server" / "models_sse" / "load_sleep_wake_evict_unload.txt"
    body = chunked(captured.read_bytes(), 61)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    served = threading.Event()

    def serve(listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(head + body)
                served.set()
                conn.recv(1)  # hold the stream open until the client goes

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    calls: list[str] = []

    def buggy(event: RouterEvent) -> None:
        calls.append(event.model)
        raise RuntimeError("a bug in the book")

    port = listener.getsockname()[1]
    stream = RouterEventStream(f"http://127.0.0.1:{port}", {}, buggy)
    try:
        with caplog.at_level(logging.ERROR):
            stream.start()
            deadline = time.monotonic() + 10
            while not (served.is_set() and stream.state == "down") and time.monotonic() < deadline:
                time.sleep(0.02)
        assert stream.state == "down"
        assert calls == ["alpha"]  # the first event met the bug; none after it was applied
        bugs = [r for r in caplog.records if "internal error" in r.getMessage()]
        assert len(bugs) == 1 and bugs[0].exc_info is not None
    finally:
        stream.close()
        listener.close()


def test_a_macmon_that_stopped_gives_a_reason_not_a_frozen_counter(tmp_path: Path) -> None:
    """A `macmon pipe` child that printed two samples and exited (macmon itself runs only on macOS:
    a script stands in for it, printing its real lines): its last counter would read as 0 W from
    then on, so the probe says why there is no energy instead."""
    fake = tmp_path / "macmon"
    fake.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in MACMON_LINES[:2]) + "exit 3\n")
    fake.chmod(0o755)
    probe = MacmonProbe(platform="darwin", which=lambda name: str(fake), interval_ms=1000)
    try:
        probe.read()  # starts the child
        deadline = time.monotonic() + 10
        (reading,) = probe.read()
        while reading.reason != "macmon stopped (exit 3)" and time.monotonic() < deadline:
            time.sleep(0.02)  # the child's exit, polled
            (reading,) = probe.read()
        assert reading.counter_j is None
        assert reading.reason == "macmon stopped (exit 3)"
    finally:
        probe.close()
