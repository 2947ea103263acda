"""The sampler's local endpoint: the latest snapshot over HTTP, for `status`, `watch` and `bar`.

One sampler per machine (the tray app or `llm-tray agent`) serves:

* `GET /v1/snapshot`: the `status --json` document (core/jsonview.py, docs/json.md);
  `?format=text` the `status` text, `?format=line` the `watch` line;
* `GET /v1/glance`: the status-bar document (core/bar.py `glance_json`);
* `GET /v1/events`: server-sent events, `snapshot`, `line` and `glance` each tick and `alert`
  on each alert transition (`{"transition": "started" | "ended", "alert": {...}}`).

`publish(snapshot)` only swaps a reference and wakes a builder thread, so neither the sampler
nor the GUI thread ever waits on a client; the builder makes the documents once per tick and
the handler threads only send bytes. Loopback by default; any other address needs a token,
checked on every request (`Authorization: Bearer ...`, 401 without); the requests are answered by
sinks/snapshot_handler.py. The limits every client meets (sinks/listener.py, values below and in
snapshot_handler.py, docs/security.md): a whole request within REQUEST_TIMEOUT_S, at most
MAX_CONNECTIONS connections and MAX_STREAMS event streams (503 beyond), an event stream whose client
does not read (its small send buffer stays full for STREAM_STALL_S) is dropped and its slot freed, and
on loopback only a loopback `Host` (or an allowed name) and no browser `Origin` (unless allowed).

`start(announce=True)` claims the sampler file (sinks/sampler_file.py) for this endpoint,
unless another live sampler has it: then this endpoint serves all the same, unannounced, and
`machine_sampler` names the other one. The claim is tried again every `reclaim_s` (on the builder
thread, after a snapshot), so when the other sampler stops this one takes over, and a file removed
by someone else comes back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from trayapp.core.bar import glance_json
from trayapp.core.glance import GlanceTracker
from trayapp.core.jsonview import alert_json, snapshot_json
from trayapp.core.loopback import is_loopback
from trayapp.core.model import Alert, Snapshot
from trayapp.core.text import format_watch_line
from trayapp.core.thresholds import Thresholds
from trayapp.sinks.listener import GuardedServer, normal_host
from trayapp.sinks.sampler_file import SamplerInfo, claim_sampler_file, remove_sampler_file
from trayapp.sinks.snapshot_handler import REQUEST_TIMEOUT_S, SnapshotHandler, json_bytes, sse

log = logging.getLogger(__name__)

STREAM_STALL_S = 10.0  # an event stream whose send buffer stays full this long is dropped (its slot freed)
MAX_STREAMS = 32  # event streams at once; more get 503
MAX_CONNECTIONS = 64  # connections at once, streams included; more get 503 from the accept thread
BACKLOG = 256  # events kept for streams that fall behind (older ones are skipped)
RECLAIM_S = 5.0  # an announced endpoint claims the sampler file again this often


@dataclass(frozen=True)
class _Published:
    snapshot: Snapshot
    doc: bytes
    glance: bytes


class SnapshotServer:
    """The endpoint; `start()` binds it, `publish()` feeds it, `stop()` ends it."""

    def __init__(
        self,
        address: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        thresholds: Thresholds | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        role: str = "tray",
        reclaim_s: float = RECLAIM_S,
        intake: Callable[[], object | None] | None = None,
        allowed_hosts: tuple[str, ...] = (),
        allowed_origins: tuple[str, ...] = (),
        stream_stall_s: float = STREAM_STALL_S,
    ) -> None:
        """`intake()`: the monitor that takes posted records (`accept_proxy_records`,
        `record_bench`: trayapp/services/monitor.py), or None while there is none yet; without it the POST
        paths answer 503. `allowed_hosts`: `Host` names answered on loopback beside localhost, 127.0.0.1
        and [::1]; `allowed_origins`: browser `Origin`s answered (none by default)."""
        if not is_loopback(address) and not token:
            raise ValueError(f"{address} is not a loopback address: the snapshot endpoint needs a token")
        self.address = address
        self.token = token
        self.request_timeout_s = request_timeout_s
        self.allowed_hosts = frozenset(normal_host(h) for h in allowed_hosts)
        self.allowed_origins = frozenset(o.strip().lower() for o in allowed_origins)
        self.stream_stall_s = stream_stall_s
        self.role = role  # what the sampler file calls this process: "tray" or "agent"
        self.reclaim_s = reclaim_s
        self.intake = intake or (lambda: None)
        self._port = port
        self._tracker = GlanceTracker(thresholds or Thresholds())
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._latest: _Published | None = None
        self._events: deque[tuple[int, bytes]] = deque(maxlen=BACKLOG)
        self._seq = 0
        self._streams = 0
        self._closed = False
        self._alerts: dict[str, Alert] = {}
        self._announced = False
        self._claim_lock = threading.Lock()  # a claim never runs during or after stop's removal
        self._owner: SamplerInfo | None = None
        self._claimed_mono_s = 0.0
        self._httpd: GuardedServer | None = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ life

    def start(self, announce: bool = False) -> SnapshotServer:
        """Bind and serve from daemon threads; raises OSError when the port is taken.

        `announce`: claim the sampler file (sinks/sampler_file.py), removed again by `stop`;
        when another live sampler has it, nothing is written and `machine_sampler` names that one.
        """
        server = self

        class Handler(SnapshotHandler):
            owner = server
            request_timeout_s = server.request_timeout_s
            allowed_hosts = server.allowed_hosts
            allowed_origins = server.allowed_origins

        httpd = GuardedServer(
            (self.address, self._port), Handler, max_connections=MAX_CONNECTIONS, name="snapshot endpoint"
        )
        threads = [
            threading.Thread(
                target=httpd.serve_forever,  # asleep until a client connects; `stop` wakes it at once
                name="llm-tray-snapshot-http",
                daemon=True,
            ),
            threading.Thread(target=self._build_loop, name="llm-tray-snapshot-build", daemon=True),
        ]
        with self._cond:
            if self._closed:  # stopped while binding (start_in_background)
                httpd.server_close()
                return self
            self._httpd, self._threads = httpd, threads
            for thread in threads:  # under the lock: a `stop` meanwhile (a quit) joins them started
                thread.start()
        if announce:
            self._announced = True
            self._claim()
        log.info("snapshot endpoint on %s", self.url)
        return self

    def start_in_background(self, announce: bool = False) -> None:
        """`start` on a short-lived thread (the GUI thread never binds); a failure is logged."""

        def run() -> None:
            try:
                self.start(announce)
            except OSError as exc:
                log.warning("snapshot endpoint not started: %s", exc)

        threading.Thread(target=run, name="llm-tray-snapshot-start", daemon=True).start()

    @property
    def machine_sampler(self) -> SamplerInfo | None:
        """This machine's sampler as of the last claim (None before one, or unannounced)."""
        return self._owner

    @property
    def is_machine_sampler(self) -> bool:
        """Whether the sampler file names this endpoint (as of the last claim)."""
        return self._owner is not None and self._owner.is_this_process(self.url)

    def _claim(self) -> None:
        """Claim the sampler file (a no-op when it already names this endpoint); logs a change."""
        with self._claim_lock:
            if not self._announced or self._closed:  # stop sets _closed before it removes the file
                return
            self._claimed_mono_s = time.monotonic()
            before, owner = self._owner, claim_sampler_file(self.url, self.role)
            self._owner = owner
        if owner == before:
            return
        if owner.is_this_process(self.url):
            log.info("this %s is this machine's sampler (%s)", self.role, self.url)
        else:
            log.info("%s is this machine's sampler: this endpoint is not announced", owner.describe())

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1]) if self._httpd is not None else self._port

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (event streams end) and remove the sampler file if `start` wrote it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            httpd, threads = self._httpd, self._threads
        with self._claim_lock:
            if self._announced:
                remove_sampler_file(self.url)  # only while it names this endpoint
                self._announced = False
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for thread in threads:
            thread.join(timeout_s)

    # ------------------------------------------------------------------ feeding

    def publish(self, snapshot: Snapshot) -> None:
        """The newest snapshot: swapped in, documents built later on the builder thread."""
        with self._cond:
            self._pending = snapshot
            self._cond.notify_all()

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self._tracker.thresholds = thresholds  # read by the builder thread at its next snapshot

    def _build_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                snapshot, self._pending = self._pending, None
            try:
                self._build(snapshot)
            except Exception:  # a bug here must not end the endpoint
                log.exception("snapshot endpoint: building the documents failed")
            if self._announced and time.monotonic() - self._claimed_mono_s >= self.reclaim_s:
                try:
                    self._claim()
                except OSError as exc:
                    log.warning("sampler file not claimed: %s", exc)

    def _build(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        doc = json_bytes(snapshot_json(snapshot))
        glance = json_bytes(glance_json(self._tracker.update(snapshot), snapshot))
        events = [sse("snapshot", doc), sse("line", json_bytes(format_watch_line(snapshot))),
                  sse("glance", glance)]  # fmt: skip
        active = {a.id: a for a in snapshot.alerts if a.ended_wall_s is None}
        for alert_id, alert in active.items():
            if alert_id not in self._alerts:
                events.append(sse("alert", json_bytes({"transition": "started", "alert": alert_json(alert)})))
        ended = {a.id: a for a in snapshot.alerts if a.ended_wall_s is not None}
        for alert_id, previous in self._alerts.items():
            if alert_id not in active:
                alert = ended.get(alert_id, previous)
                events.append(sse("alert", json_bytes({"transition": "ended", "alert": alert_json(alert)})))
        self._alerts = active
        with self._cond:
            self._latest = _Published(snapshot, doc, glance)
            for event in events:
                self._seq += 1
                self._events.append((self._seq, event))
            self._cond.notify_all()

    # ------------------------------------------------------------------ for the handlers

    def latest(self) -> _Published | None:
        with self._cond:
            return self._latest

    def _stream_slot(self, delta: int) -> bool:
        with self._cond:
            if delta > 0 and self._streams >= MAX_STREAMS:
                return False
            self._streams += delta
            return True

    def _next_events(self, after: int, timeout_s: float) -> tuple[int, list[bytes]] | None:
        """Events numbered after `after` (waits up to `timeout_s`); None once the server stops."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._seq > after, timeout_s)
            if self._closed:
                return None
            return self._seq, [event for seq, event in self._events if seq > after]
