"""A stand-in for trayapp.services.monitor.Monitor: the Qt tests' tray runs it (in process, or in a
child started with `python -c`)."""

from __future__ import annotations

import threading

from tests.support.snapshots import alert, model, server, snap
from trayapp.config.settings import Settings
from trayapp.core.bench import BenchResult
from trayapp.core.model import Snapshot


class FakeMonitor:
    """Same methods as trayapp.services.monitor.Monitor; a model decoding at a rising rate."""

    def __init__(self) -> None:
        self.ticks = 0
        self.applied: list[Settings] = []
        self.closed = False
        self.thread = threading.get_ident()
        self.warnings: list[str] = []
        self.store_error: str | None = None  # set by a test: why ticks are not recorded

    def tick(self) -> Snapshot:
        self.ticks += 1
        alerts = (alert("offload-1"),) if self.ticks >= 3 else ()
        return snap(float(self.ticks), server(model(rate=40.0 + self.ticks)), alerts=alerts)

    def next_interval_s(self) -> float:
        return 0.05

    def activity_seen(self) -> bool:

        return False

    def apply_settings(self, settings: Settings) -> None:
        self.applied.append(settings)

    def close(self) -> None:
        self.closed = True

    def record_bench(self, result: BenchResult) -> tuple[bool, str | None] | None:
        return None  # records nothing, as a monitor with no store
