"""The monitor's server polls: one thread per server, and the poll that never raises."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from trayapp.config.bugs import BugLog
from trayapp.config.settings import ACTIVITY_CHECK_S
from trayapp.core.model import ServerReading
from trayapp.core.probe import ServerProbe
from trayapp.core.redact import redact_url
from trayapp.sources.processes import CpuActivity


class PollThread:
    """One server's polls, on a thread of its own that waits for the next one.

    Handing a poll over and waiting for it takes a queue and a lock here: ThreadPoolExecutor's submit
    and wait cost ~0.2 ms of CPU a tick more (issue #26). A poll that never returns holds its own
    thread only (a daemon: it does not hold up the exit either).
    """

    def __init__(self, url: str) -> None:
        self._polls: queue.SimpleQueue[Callable[[], ServerReading] | None] = queue.SimpleQueue()
        self._running = threading.Lock()  # held from start() until the poll returns
        self.reading: ServerReading | None = None  # the last poll's
        self.started_s = 0.0  # when the last poll was started (the monitor's clock)
        name = f"llm-tray-poll {redact_url(url)}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def start(self, poll: Callable[[], ServerReading], now_s: float) -> None:
        """Run `poll` on this thread (not while `running()`)."""
        self._running.acquire()
        self.reading, self.started_s = None, now_s
        self._polls.put(poll)

    def running(self) -> bool:
        return self._running.locked()

    def wait(self, timeout_s: float) -> None:
        """Until the poll returns, or at most `timeout_s`."""
        if self._running.acquire(timeout=max(timeout_s, 0.0)):
            self._running.release()

    def stop(self) -> None:
        """End the thread once its poll (if any) returns."""
        self._polls.put(None)

    def _run(self) -> None:
        while (poll := self._polls.get()) is not None:
            try:
                self.reading = poll()
            finally:
                self._running.release()


def safe_poll(probe: ServerProbe, now_mono: float, clock: Callable[[], float], bugs: BugLog) -> ServerReading:
    """`probe.poll`, stamped with `clock`'s time; a probe that raises (a bug) gives an "error" reading."""
    try:
        reading = probe.poll(now_mono)
        return replace(reading, t_mono_s=clock())
    except Exception as exc:  # probes must not raise; if one does, it is a bug we report, not a crash
        reason = bugs.report(exc, f"probe {probe.url}")
        return ServerReading(kind=probe.kind, url=probe.url, status="error", reason=reason)


class ServerActivity:
    """Whether a server on this machine used CPU since the last look (`CpuActivity` per server, one
    `/proc/PID/stat` read each on Linux): between idle polls, the sign that a request came."""

    def __init__(self) -> None:
        self._marks: dict[str, CpuActivity] = {}  # by server URL

    def seen(self, readings: Iterable[ServerReading], now_s: float) -> bool:
        """`readings`: each server's last; one without a pid (on another machine, not found) is skipped,
        as is this process (a proxy's own upstream)."""
        worked = False
        urls = set()
        for reading in readings:
            urls.add(reading.url)
            if reading.pid is None or reading.pid == os.getpid():
                continue
            if self._marks.setdefault(reading.url, CpuActivity()).worked(reading.pid, now_s):
                worked = True  # every mark moves on: the next look counts from now for each
        for url in set(self._marks) - urls:
            del self._marks[url]
        return worked


class Ticking(Protocol):
    def next_interval_s(self) -> float: ...
    def activity_seen(self) -> bool: ...


def wait_for_next_tick(monitor: Ticking, stop: threading.Event) -> None:
    """Until the next tick is due (`monitor.next_interval_s()`), sooner when a local server got work
    (looked at every ACTIVITY_CHECK_S), or `stop` is set."""
    deadline_s = time.monotonic() + monitor.next_interval_s()
    while not stop.is_set():
        left_s = deadline_s - time.monotonic()
        if left_s <= 0 or stop.wait(min(ACTIVITY_CHECK_S, left_s)):
            return
        if deadline_s - time.monotonic() > 0 and monitor.activity_seen():
            return
