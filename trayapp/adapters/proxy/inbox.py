"""Where the proxies' records wait for the monitor's next tick (no asyncio here: the monitor
imports this whether or not a proxy runs)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from trayapp.core.model import FinishedRequest

INBOX_LIMIT = 10_000  # records waiting for a tick; the oldest go first if nothing drains them


def same_server(url_a: str, url_b: str) -> bool:
    """Whether two base URLs name the same server (`localhost` and `127.0.0.1` are one)."""

    def key(url: str) -> tuple[str, int]:
        parts = urlsplit(url if "://" in url else "http://" + url)
        host = (parts.hostname or "").lower()
        if host in ("localhost", "::1"):
            host = "127.0.0.1"
        return host, parts.port or (443 if parts.scheme == "https" else 80)

    return key(url_a) == key(url_b)


class RecordInbox:
    """Records from proxy threads, taken by the monitor at each tick (thread-safe, bounded)."""

    def __init__(self, upstreams: Iterable[str] = (), limit: int = INBOX_LIMIT) -> None:
        self._records: collections.deque[tuple[str, FinishedRequest]] = collections.deque(maxlen=limit)
        self._lock = threading.Lock()
        self.upstreams: tuple[str, ...] = tuple(upstreams)  # servers with a proxy in front

    def set_upstreams(self, upstreams: Iterable[str]) -> None:
        """The servers the running proxies forward to (their requests are recorded by the proxy)."""
        self.upstreams = tuple(upstreams)

    def proxied(self, url: str) -> bool:
        return any(same_server(url, upstream) for upstream in self.upstreams)

    def put(self, upstream_url: str, record: FinishedRequest) -> None:
        with self._lock:
            self._records.append((upstream_url, record))

    def take(self) -> list[tuple[str, FinishedRequest]]:
        with self._lock:
            records = list(self._records)
            self._records.clear()
        return records
