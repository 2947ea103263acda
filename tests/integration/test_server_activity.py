"""Between idle polls, a look at each local server's CPU (services/poll_thread.py).

Real processes: one that waits (an idle server) and one that computes (a server given a request). The
look reads the process's CPU time and asks it nothing; work since the last look (≥ WORK_CPU_SHARE of a
core) starts the next poll at once (`wait_for_next_tick`, the agent's wait; the tray's worker does the
same with its timer: tests/qt/test_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.fake_servers import wait_until
from trayapp.config.settings import ACTIVITY_CHECK_S
from trayapp.core.model import ServerReading
from trayapp.services.poll_thread import ServerActivity, wait_for_next_tick

READY = "print('ready', flush=True)\n"  # said once started: the interpreter's own start-up is CPU
IDLE = READY + "import sys; sys.stdin.read()"  # waits until its stdin closes: no CPU
BUSY = READY + "while True: pass"


Start = Callable[[str], "subprocess.Popen[bytes]"]


@pytest.fixture
def process() -> Iterator[Start]:
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _reading(pid: int | None, url: str = "http://127.0.0.1:8080") -> ServerReading:
    return ServerReading(kind="llamacpp", url=url, status="ok", pid=pid)


def test_an_idle_server_shows_no_work_and_a_computing_one_does(process: Start) -> None:
    idle, busy = process(IDLE), process(BUSY)
    readings = [_reading(idle.pid, "http://127.0.0.1:1"), _reading(busy.pid, "http://127.0.0.1:2")]
    only_idle = ServerActivity()
    assert only_idle.seen(readings[:1], time.monotonic()) is False  # the first look only marks
    for _ in range(3):
        time.sleep(0.1)  # a window for CPU to be used in (none will be)
        assert only_idle.seen(readings[:1], time.monotonic()) is False
    both = ServerActivity()
    both.seen(readings, time.monotonic())
    wait_until(lambda: both.seen(readings, time.monotonic()), timeout_s=10.0, interval_s=0.1)


def test_a_server_without_a_pid_or_this_process_is_not_looked_at() -> None:
    activity = ServerActivity()
    readings = [_reading(None), _reading(os.getpid(), "http://127.0.0.1:3")]  # a remote one; a proxy's own
    end_s = time.monotonic() + 0.3
    while time.monotonic() < end_s:  # this process computes meanwhile: never counted
        assert activity.seen(readings, time.monotonic()) is False


class _Monitor:
    def __init__(self, interval_s: float, active_after_looks: int | None) -> None:
        self.interval_s = interval_s
        self.active_after_looks = active_after_looks
        self.looks = 0

    def next_interval_s(self) -> float:
        return self.interval_s

    def activity_seen(self) -> bool:
        self.looks += 1
        return self.active_after_looks is not None and self.looks >= self.active_after_looks


def test_the_wait_ends_at_the_first_look_that_finds_work() -> None:
    monitor = _Monitor(interval_s=30.0, active_after_looks=2)
    started_s = time.monotonic()
    wait_for_next_tick(monitor, threading.Event())
    assert monitor.looks == 2
    assert time.monotonic() - started_s < 30.0 / 2  # two looks, ACTIVITY_CHECK_S apart: not the 30 s
    assert ACTIVITY_CHECK_S == 1.0


def test_an_active_monitor_waits_its_interval_without_looking_and_stop_ends_any_wait() -> None:
    active = _Monitor(interval_s=0.2, active_after_looks=None)  # generating: polls every 0.2 s here
    wait_for_next_tick(active, threading.Event())
    assert active.looks == 0
    idle = _Monitor(interval_s=600.0, active_after_looks=None)
    stop = threading.Event()
    waiter = threading.Thread(target=wait_for_next_tick, args=(idle, stop))
    waiter.start()
    wait_until(lambda: idle.looks >= 1, timeout_s=10.0)  # looking, finding nothing, still waiting
    assert waiter.is_alive()
    stop.set()
    waiter.join(5.0)
    assert not waiter.is_alive()
