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


@pytest.mark.parametrize(
    ("fd_limit", "listeners", "pool_most", "expected"),
    [  # by hand: room = limit - 64 reserved - 64 a listener's accept burst; kept ≤ room / 8 a listener
        (None, 1, 64, (512, 64)),  # no limit known
        (1 << 20, 1, 64, (512, 64)),
        (1024, 1, 64, (416, 64)),  # room 896: (896 - 64) // 2
        (256, 1, 64, (56, 16)),  # macOS's default: room 128, kept 16, (128 - 16) // 2
        (256, 1, 2, (63, 2)),  # (128 - 2) // 2
        (256, 2, 2, (15, 2)),  # room 64: (64 - 2 * 2) // 4
        (40, 1, 2, (4, 0)),  # never none at all
    ],
)
def test_the_connection_budget_stays_under_the_descriptor_limit(
    fd_limit: int | None, listeners: int, pool_most: int, expected: tuple[int, int]
) -> None:
    assert limits.connection_budget(fd_limit, listeners, pool_most) == expected


@pytest.mark.parametrize("fd_limit", [512, 1024, 4096, 65536])
@pytest.mark.parametrize("listeners", [1, 2, 3])
def test_every_descriptor_the_budget_allows_fits_under_the_limit(fd_limit: int, listeners: int) -> None:
    cap, kept = limits.connection_budget(fd_limit, listeners, limits.UPSTREAM_REUSE_EVENT_LOOP.pool_most)
    assert cap > 4  # the budget's own (not the floor under a limit too small for any)
    used = listeners * (2 * cap + kept + limits.ACCEPT_BACKLOG) + limits.FD_RESERVE
    assert used <= fd_limit


@pytest.mark.parametrize(
    ("kind", "pool_most", "max_answers"),
    [  # event-loop servers keep many idle connections for nothing; llama-server a thread each
        ("vllm", 64, 1000),
        ("sglang", 64, 1000),
        ("ollama", 64, 1000),
        ("llamacpp", 2, 4),
        ("lmstudio", 2, 4),  # not known to be free: as llama-server
        ("mlx", 2, 4),
        ("openai", 2, 4),
        ("llamacpp-router", 2, 4),  # no kind of its own
    ],
)
def test_how_many_upstream_connections_a_listener_keeps_depends_on_the_servers_http_stack(
    kind: str, pool_most: int, max_answers: int
) -> None:
    assert limits.upstream_reuse(kind) == limits.UpstreamReuse(pool_most, max_answers)
