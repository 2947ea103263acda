"""Who holds one listener's connection slots, and who gives one up at the cap (limits.py); the
bytes of request bodies it holds at once (`HeldBytes`).

At the cap a new connection takes the slot of the connection that has waited longest for a
request head *with nothing sent to read*: an idle or trickling connection, never one whose
request has arrived and is about to be read. A burst of accepted connections runs before any of
their bytes are read, so without that test the last of a burst closed a well-behaved client
accepted a moment before it (seen beside a busy neighbour: 8 % of clients lost to 200 idle
connections). When every waiting connection has bytes to read, or none is waiting, the new
connection is refused (503).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trayapp.sinks.listener import kernel_bytes_waiting

Connection = asyncio.Task[None]


@dataclass(frozen=True)
class _Waiting:
    since_s: float  # time.monotonic() when it began to wait for a head
    has_bytes: Callable[[], bool]  # bytes read from it and not parsed yet (asyncio's or ours)
    fileno: int  # its socket, for the kernel's count (-1: unknown)


class Slots:
    """The connections one listener holds (at most `cap`), and those between requests."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held: set[Connection] = set()
        self._waiting: dict[Connection, _Waiting] = {}
        self.refused = 0  # connections answered 503 at the cap
        self.evicted = 0  # idle or trickling connections closed to make room

    def admit(self, connection: Connection) -> Literal["free", "evicted"] | None:
        """Hold a slot for `connection`: a free one, or one a waiting connection was closed to
        make at the cap ("evicted"); None: refuse it."""
        evicted = len(self.held) >= self.cap
        if evicted and not self._evict_one():
            self.refused += 1
            return None
        self.held.add(connection)
        return "evicted" if evicted else "free"

    def waiting(self, connection: Connection, has_bytes: Callable[[], bool], fileno: int) -> None:
        self._waiting[connection] = _Waiting(time.monotonic(), has_bytes, fileno)

    def busy(self, connection: Connection) -> None:
        """A head arrived (or the wait ended): it no longer gives up its slot."""
        self._waiting.pop(connection, None)

    def release(self, connection: Connection) -> None:
        self._waiting.pop(connection, None)
        self.held.discard(connection)

    def _evict_one(self) -> bool:
        for connection, wait in sorted(self._waiting.items(), key=lambda item: item[1].since_s):
            if wait.has_bytes() or kernel_bytes_waiting(wait.fileno) > 0:
                continue  # its request is here: reading it is what comes next
            self.release(connection)  # its slot is free now; its task closes its socket
            connection.cancel()
            self.evicted += 1
            return True
        return False


class HeldBytes:
    """Request-body bytes one listener holds at once, under `limit_bytes`
    (limits.REQUEST_BODIES_HELD_BYTES): the recorder's pieces and the prompt counter's copies."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0

    def take(self, count_bytes: int) -> bool:
        """Hold `count_bytes` more if the budget allows; False (nothing held): it does not."""
        if self.held_bytes + count_bytes > self.limit_bytes:
            return False
        self.held_bytes += count_bytes
        return True

    def give(self, count_bytes: int) -> None:
        self.held_bytes -= count_bytes


def fd_soft_limit() -> int | None:
    """This process's soft limit on open files (what the cap stays under); None: none or unknown."""
    try:
        import resource  # not on Windows
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)
