"""The tray's sampler in a test process, wired as trayapp/app/tray_app.py wires it: a real `Monitor` ticking
on a thread and publishing to a `SnapshotServer` that announces itself (no Qt needed)."""

from __future__ import annotations

import threading

from tests.support.cli import wait_for
from tests.support.llama import monitor_for
from trayapp.config.settings import HardwareConfig, MonitorConfig, Settings
from trayapp.core.model import Snapshot
from trayapp.services.monitor import Monitor
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sinks.snapshot_server import RECLAIM_S, SnapshotServer

WAIT_S = 60.0  # a busy 2-core host: a start, a claim, a first tick
RAM_GBPS = 50.0  # given: no RAM benchmark competes in the tests


class TraySampler:
    """`record=True`: it holds the store's writer lock and takes the CLI's records (its intake);
    `reclaim_s`: how often the endpoint re-claims the sampler file (5 s in the app). `store_later`:
    as the tray starts, its endpoint answers (503 to a post: no monitor yet) before its monitor is
    made and opens the store (~3 s later in the app), which `open_store()` does here."""

    def __init__(
        self,
        upstream: str,
        *,
        tick_s: float = 0.5,
        record: bool = False,
        reclaim_s: float = RECLAIM_S,
        store_later: bool = False,
    ) -> None:
        self._settings = Settings(
            monitor=MonitorConfig(discover=False, poll_active_s=tick_s, poll_idle_s=tick_s),
            hardware=HardwareConfig(ram_bandwidth_gbps=RAM_GBPS),
        )
        self._upstream, self._record = upstream, record
        self.monitor: Monitor | None = None
        self._started = False
        if not store_later:
            self.open_store()
        intake = (lambda: self.monitor) if record else None
        self.server = SnapshotServer(thresholds=self._settings.thresholds, intake=intake, reclaim_s=reclaim_s)
        self.tick_s = tick_s
        self.snapshots: list[Snapshot] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-tray-sampler", daemon=True)

    def open_store(self) -> None:
        """Make the monitor (it opens the store: it must get its writer lock) and begin ticking."""
        inbox = {"proxy_inbox": RecordInbox()} if self._record else {}
        self.monitor = monitor_for(self._upstream, settings=self._settings, record=self._record, **inbox)
        if self._record:
            assert not self.monitor.warnings, self.monitor.warnings  # it holds the store
        if self._started:
            self._thread.start()

    def start(self) -> TraySampler:
        self.server.start(announce=True)
        self._started = True
        if self.monitor is not None:
            self._thread.start()
            wait_for(lambda: self.server.latest() is not None, WAIT_S, "the sampler's first snapshot")
        return self

    def _run(self) -> None:
        assert self.monitor is not None
        while not self._stop.is_set():
            snapshot = self.monitor.tick()
            with self._lock:
                self.snapshots.append(snapshot)
            self.server.publish(snapshot)
            self._stop.wait(self.tick_s)

    def since(self, index: int) -> list[Snapshot]:
        with self._lock:
            return self.snapshots[index:]

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=WAIT_S)
        self.server.stop(2.0)
        if self.monitor is not None:
            self.monitor.close()
