"""Where the proxies' records wait for the monitor's next tick (no asyncio here: the monitor
imports this whether or not a proxy runs)."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterable
from typing import Protocol

from trayapp.core.loopback import same_server, server_key
from trayapp.core.model import FinishedRequest
from trayapp.core.proxied_streams import ProxiedStream

INBOX_LIMIT = 10_000  # records waiting for a tick; the oldest go first if nothing drains them
# A stopped proxy's servers stay proxied this long: the monitor may see a request the proxy has just
# recorded finish in its slots only at its next poll, and must not record it a second time from there.
LEASE_END_GRACE_S = 5.0


class StreamProgress(Protocol):
    """What the proxy's tap (recorder.RequestTap) says of an answer while it passes: read, never written,
    from the monitor's thread (plain attribute reads of values the proxy's thread replaces whole)."""

    @property
    def request_model(self) -> str | None: ...

    @property
    def streaming(self) -> bool: ...

    @property
    def text_pieces(self) -> int: ...


class RecordInbox:
    """Records from proxy threads, taken by the monitor at each tick (thread-safe, bounded), and
    the lengths of the prompts the proxies are forwarding right now."""

    def __init__(self, upstreams: Iterable[str] = (), limit: int = INBOX_LIMIT) -> None:
        self._records: collections.deque[tuple[str, FinishedRequest]] = collections.deque(maxlen=limit)
        self._lock = threading.Lock()
        self._prompts: dict[int, tuple[str, str | None, int]] = {}  # in-flight prompts' lengths
        self.upstreams: tuple[str, ...] = tuple(upstreams)  # servers with a proxy in front
        self._lent: dict[tuple[str, int | None], float] = {}  # server key → until (monotonic s)
        self._streams: dict[int, tuple[str, int, StreamProgress]] = {}  # key → (upstream, number, tap)
        self._numbers = itertools.count(1)

    def set_upstreams(self, upstreams: Iterable[str]) -> None:
        """The servers the running proxies forward to (their requests are recorded by the proxy)."""
        self.upstreams = tuple(upstreams)

    def lend(self, upstreams: Iterable[str], lease_s: float) -> None:
        """Servers a proxy of another process forwards to (`llm-tray proxy` beside the tray): they
        count as proxied for `lease_s` from now, renewed by its next post (0: it stopped, and they stay
        proxied for LEASE_END_GRACE_S, past the poll that sees its last request end)."""
        until = time.monotonic() + max(lease_s, LEASE_END_GRACE_S)
        with self._lock:
            for url in upstreams:
                self._lent[server_key(url)] = until

    def proxied(self, url: str) -> bool:
        if any(same_server(url, upstream) for upstream in self.upstreams):
            return True
        with self._lock:
            until = self._lent.get(server_key(url))
        return until is not None and until > time.monotonic()

    def put(self, upstream_url: str, record: FinishedRequest) -> None:
        with self._lock:
            self._records.append((upstream_url, record))

    def prompt_started(self, key: int, upstream_url: str, model: str | None, tokens: int) -> None:
        """A proxied request's prompt, `tokens` long, is being read (until `prompt_ended(key)`)."""
        with self._lock:
            self._prompts[key] = (upstream_url, model, tokens)

    def prompt_ended(self, key: int) -> None:
        """That request's first token came, or it ended."""
        with self._lock:
            self._prompts.pop(key, None)

    def prompt_totals(self, url: str) -> list[tuple[str | None, int]]:
        """(model asked for, prompt tokens) of the proxied prompts being read on this server now."""
        with self._lock:
            return [(model, n) for upstream, model, n in self._prompts.values() if same_server(upstream, url)]

    def stream_started(self, key: int, upstream_url: str, progress: StreamProgress) -> None:
        """A proxied request is under way (until `stream_ended(key)`); once its answer streams, its
        progress is read at each tick (`streams`)."""
        with self._lock:
            self._streams[key] = (upstream_url, next(self._numbers), progress)

    def stream_ended(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def streams(self, url: str) -> list[ProxiedStream]:
        """The answers being streamed from this server now, with the tokens forwarded so far."""
        with self._lock:
            mine = [(n, tap) for upstream, n, tap in self._streams.values() if same_server(upstream, url)]
        return [ProxiedStream(n, tap.request_model, tap.text_pieces) for n, tap in mine if tap.streaming]

    def take(self) -> list[tuple[str, FinishedRequest]]:
        with self._lock:
            records = list(self._records)
            self._records.clear()
        return records
