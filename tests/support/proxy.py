"""The recording proxy in a test: started on a free loopback port, its records collected."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.services.proxy.prompt_length import PromptBoard
from trayapp.services.proxy.route import Route
from trayapp.services.proxy.runner import ProxyThread


@dataclass
class Records:
    """What the proxy recorded, thread-safe; `wait_for` blocks until there are enough."""

    items: list[FinishedRequest] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def add(self, _route: Route, record: FinishedRequest) -> None:
        with self._changed:
            self.items.append(record)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[FinishedRequest]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self.items) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.items)} of {count} records within {timeout_s} s")
                self._changed.wait(left)
            return list(self.items)


@dataclass(frozen=True)
class RunningProxy:
    url: str
    records: Records
    thread: ProxyThread

    def held_bytes(self) -> int:
        """Request bytes the listener holds now (recorder pieces, prompt-count and replay copies)."""
        return self.thread.servers[0].recording.held.held_bytes

    def kept_upstreams(self) -> int:
        """Upstream connections the listener keeps for the next client (its clients gone)."""
        return len(self.thread.servers[0].pool)


@contextmanager
def running_proxy(
    upstream_url: str,
    kind: str = "openai",
    token: str | None = None,
    prompts: PromptBoard | None = None,
    inbox: RecordInbox | None = None,
) -> Iterator[RunningProxy]:
    """`prompts`: where the lengths of the prompts being read go (a monitor's RecordInbox); `inbox`: a
    monitor's inbox that also gets every record and every prompt length, as the tray wires its proxy."""
    records = Records()

    def sink(route: Route, record: FinishedRequest) -> None:
        if inbox is not None:
            inbox.put(route.upstream_url, record)
        records.add(route, record)

    thread = ProxyThread([Route("127.0.0.1", 0, upstream_url, kind, token)], sink, prompts or inbox)
    (url,) = thread.start()
    try:
        yield RunningProxy(url, records, thread)
    finally:
        thread.stop()
