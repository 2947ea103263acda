"""The recording proxy's boundaries (issue #25): nothing a client causes ends `llm-tray proxy`."""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any, cast

import pytest

from trayapp.cli.proxy import TICK_RETRY_S, _tick
from trayapp.services.proxy import limits
from trayapp.services.proxy.runner import _LoopErrors


class FailingMonitor:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.failures:
            raise self.failures.pop(0)

    def next_interval_s(self) -> float:
        return 1.5

    def activity_seen(self) -> bool:

        return False


def test_a_failed_monitor_tick_is_said_once_and_retried(capsys: pytest.CaptureFixture[str]) -> None:
    emfile = OSError(errno.EMFILE, "Too many open files")
    monitor = FailingMonitor([emfile, OSError(errno.EMFILE, "Too many open files"), RuntimeError("x")])
    said: set[str] = set()
    waits = [_tick(cast(Any, monitor), said) for _ in range(4)]
    assert waits == [TICK_RETRY_S, TICK_RETRY_S, TICK_RETRY_S, 1.5]
    err = capsys.readouterr().err
    assert err.count("Too many open files") == 1 and err.count("RuntimeError") == 1
    assert "Traceback" not in err and "forwarding goes on" in err


def test_loop_errors_are_logged_once_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    handler = _LoopErrors()
    loop = asyncio.new_event_loop()
    try:
        for _ in range(3):
            handler.handle(loop, {"message": "socket.accept() out of system resource",
                                  "exception": OSError(errno.EMFILE, "Too many open files")})  # fmt: skip
        handler.handle(loop, {"message": "something else"})
    finally:
        loop.close()
    proxy_lines = [r for r in caplog.records if r.name.endswith("runner")]
    assert len(proxy_lines) == 2 and all(r.levelno == logging.WARNING for r in proxy_lines)


def test_the_connection_cap_stays_under_the_descriptor_limit() -> None:
    assert limits.connection_cap(None) == limits.MAX_CONNECTIONS
    assert limits.connection_cap(1 << 20) == limits.MAX_CONNECTIONS
    burst = limits.ACCEPT_BACKLOG
    assert limits.connection_cap(256) == (256 - limits.FD_RESERVE - burst) // 2
    assert limits.connection_cap(256, listeners=2) == (256 - limits.FD_RESERVE - 2 * burst) // 4
    assert limits.connection_cap(40) == 4  # never none at all
