"""LlamaCppProbe's quiet polls (issue #26): an idle, awake local server whose process used no CPU
since the last poll is asked /health and /props at most every IDLE_PROPS_REFRESH_S; work, sleep,
and a server in the probe's own process are asked every poll.

The server's answers come from a fake on 127.0.0.1; its "process" is a real idle child process
(`sleep`), whose CPU time the probe reads as it reads a real server's. Poll times are given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_http import FakeServer, file_reply, json_reply
from trayapp.sources.servers.llamacpp import IDLE_PROPS_REFRESH_S, LlamaCppProbe


@pytest.fixture
def captured(fixtures_dir: Path) -> Path:
    return fixtures_dir / "llama-server" / "captured"


@pytest.fixture
def fake(captured: Path) -> Iterator[FakeServer]:
    routes = {
        "/health": file_reply(captured / "health.json"),
        "/props": file_reply(captured / "props.json"),
        "/slots": file_reply(captured / "slots_fresh.json"),  # every slot idle
        "/metrics": file_reply(captured / "metrics_after.txt"),
        "/v1/models": file_reply(captured / "v1_models.json"),
    }
    with FakeServer(routes) as server:
        yield server


@pytest.fixture
def idle_process() -> Iterator[int]:
    """A real process that uses no CPU: the server's process, as far as the probe can tell."""
    with subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"  # idle from now
            yield child.pid
        finally:
            child.kill()


def probe_of(url: str, pid: int) -> LlamaCppProbe:
    probe = LlamaCppProbe(url)
    probe._pid = pid  # the process listening on the port, as the probe would have found it
    return probe


def asked(fake: FakeServer, path: str) -> int:
    return fake.paths_requested().count(path)


def sleeping_props(captured: Path) -> dict[str, Any]:
    props: dict[str, Any] = json.loads((captured / "props.json").read_text())
    return {**props, "is_sleeping": True}


def test_a_quiet_server_is_asked_every_refresh_and_shows_its_sleep_that_late(
    fake: FakeServer, idle_process: int, captured: Path
) -> None:
    probe = probe_of(fake.url, idle_process)
    try:
        readings = [probe.poll(float(t)) for t in range(8)]  # t=0: busy until its slots say idle
        assert asked(fake, "/props") == 2  # t=0 and t=5
        assert asked(fake, "/health") == 1  # t=0; at t=5 /props answered (a server loading or down does not)
        assert {r.status for r in readings} == {"ok"}
        assert {r.models[0].name for r in readings} == {readings[0].models[0].name}
        assert asked(fake, "/slots") == 1  # never while idle and quiet (it would reset the idle timer)
        fake.routes["/props"] = json_reply(sleeping_props(captured))
        fell_asleep_at = 8.0
        t = fell_asleep_at
        while "asleep" not in (readings[-1].models[0].live_rate_reason or ""):
            readings.append(probe.poll(t))
            t += 1.0
            assert t - fell_asleep_at <= IDLE_PROPS_REFRESH_S + 1.0, "the sleep was not seen in time"
        health_before = asked(fake, "/health")
        probe.poll(t)
        probe.poll(t + 1.0)
        assert asked(fake, "/health") == health_before + 2  # asleep: every poll, to see it wake
    finally:
        probe.close()


def test_a_quiet_refresh_that_fails_shows_what_the_usual_poll_shows(
    fake: FakeServer, idle_process: int
) -> None:
    quiet = probe_of(fake.url, idle_process)
    try:
        for t in range(5):
            assert quiet.poll(float(t)).status == "ok"
        fake.routes["/props"] = json_reply({"error": {"code": 503, "message": "Loading model"}}, 503)
        failed = quiet.poll(5.0)  # the refresh: /props fails, so /health is asked as always
        assert asked(fake, "/health") == 2 and asked(fake, "/props") == 3  # t=0, t=5 quiet, t=5 usual
    finally:
        quiet.close()
    usual = probe_of(fake.url, os.getpid())  # never quiet: /health then /props, every poll
    try:
        expected = usual.poll(0.0)
    finally:
        usual.close()
    assert (failed.status, failed.reason) == (expected.status, expected.reason)
    assert failed.status == "loading"  # a 503 from /props, as the usual poll shows it


def test_work_and_a_server_in_this_process_are_asked_every_poll(fake: FakeServer, idle_process: int) -> None:
    probe = probe_of(fake.url, idle_process)
    try:
        probe.poll(0.0)
        probe.poll(1.0)
        assert asked(fake, "/health") == 1  # quiet
        assert probe._cpu.mark is not None
        probe._cpu.mark = (1.0, probe._cpu.mark[1] - 0.5)  # as if it had used half a core since t=1
        probe.poll(2.0)
        assert asked(fake, "/health") == 2 and asked(fake, "/slots") == 2
    finally:
        probe.close()
    fake.requests.clear()
    own = probe_of(fake.url, os.getpid())  # a fake in the probe's own process: its CPU is the probe's
    try:
        for t in range(4):
            own.poll(float(t))
        assert asked(fake, "/health") == 4 and asked(fake, "/props") == 4
    finally:
        own.close()
