"""The sampler thread: a MonitorWorker on its own QThread ticks the Monitor and emits Snapshots.

All blocking work (HTTP, NVML, SQLite) happens in `monitor.tick()` on the
worker thread; the GUI thread only receives `snapshot_ready(Snapshot)` through
a queued signal. The monitor is built by a factory *on the worker thread*, so
its thread-affine handles (SQLite connection, NVML) live there too.

`run_in_background` runs a one-off callable (an export, a connection test, a
keyring write) off the GUI thread and delivers the result back to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot
from shiboken6 import Shiboken

from trayapp.config.bugs import BugLog, is_known_failure
from trayapp.config.settings import ACTIVITY_CHECK_S, Settings
from trayapp.core.model import Snapshot

if TYPE_CHECKING:
    from trayapp.core.bench import BenchResult

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.2


class MonitorLike(Protocol):
    warnings: list[str]  # lasting conditions, appended once each (e.g. "not recording: …")

    def tick(self) -> Snapshot: ...
    def next_interval_s(self) -> float: ...
    def activity_seen(self) -> bool: ...  # a local server used CPU since the last look (cheap)
    def apply_settings(self, settings: Settings) -> None: ...
    def close(self) -> None: ...
    @property
    def store_error(self) -> str | None: ...  # why the last tick was not recorded (a full disk, a bug)
    # A bench's result kept as the baseline through this monitor's store: (stored, a note); None when
    # it records nothing (trayapp/services/monitor.py).
    def record_bench(self, result: BenchResult) -> tuple[bool, str | None] | None: ...


class MonitorWorker(QObject):
    """Lives on the sampler thread. Ticks, re-arms a single-shot timer with the monitor's interval."""

    snapshot_ready = Signal(object)  # Snapshot
    error = Signal(str)
    warning = Signal(str)  # a new entry in monitor.warnings (e.g. "not recording: …")
    store_state = Signal(object)  # str: why ticks are not recorded (disk full, a bug); None: recording again
    stopped = Signal()

    def __init__(self, factory: Callable[[], MonitorLike]) -> None:
        super().__init__()
        self._factory = factory
        self._monitor: MonitorLike | None = None
        self._timer: QTimer | None = None
        self._paused = False
        self._stopping = False
        self._last_error: str | None = None
        self._warnings_seen = 0
        self._due_mono_s: float | None = None  # between idle polls: when the next one is due
        self._activity_failed = False
        self.store_error: str | None = None  # the store failure last reported (None: recording)
        self.ticks = 0

    @Slot()
    def start(self) -> None:
        """Build the monitor and tick at once (runs on the worker thread)."""
        self._timer = QTimer(self)
        self._timer.setObjectName("monitor-tick")
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._on_timeout)
        try:
            self._monitor = self._factory()
        except Exception as exc:
            log.exception("cannot start monitoring")
            self.error.emit(f"cannot start monitoring: {type(exc).__name__}: {exc}")
            return
        self._report_warnings()
        if not self._paused:
            self._timer.start(0)

    def _report_warnings(self) -> None:
        """New monitor warnings, and each change of the store's state (failing, recording again)."""
        if self._monitor is None:
            return
        warnings = self._monitor.warnings
        for message in warnings[self._warnings_seen :]:
            log.warning("monitor: %s", message)
            self.warning.emit(str(message))
        self._warnings_seen = len(warnings)
        store_error = self._monitor.store_error
        if store_error != self.store_error:
            self.store_error = store_error
            self.store_state.emit(store_error)

    @Slot()
    def _on_timeout(self) -> None:
        monitor = self._monitor
        if monitor is None or self._paused or self._stopping:
            return
        due_mono_s, self._due_mono_s = self._due_mono_s, None
        if due_mono_s is not None and time.monotonic() < due_mono_s and not self._activity(monitor):
            self._due_mono_s = due_mono_s
            self._arm(min(ACTIVITY_CHECK_S, due_mono_s - time.monotonic()))
            return
        snapshot = None
        try:
            snapshot = monitor.tick()
        except Exception as exc:
            message = f"monitoring tick failed: {type(exc).__name__}: {exc}"
            if message != self._last_error:  # log transitions, not every tick
                log.exception(message)
            self._last_error = message
            self.error.emit(message)
        else:
            if self._last_error is not None:
                log.info("monitoring recovered")
            self._last_error = None
        self.ticks += 1
        self._report_warnings()
        if snapshot is not None:
            self.snapshot_ready.emit(snapshot)
        interval_s = self._interval_s(monitor)
        if interval_s > ACTIVITY_CHECK_S:  # idle: a look at the servers' CPU each ACTIVITY_CHECK_S
            self._due_mono_s = time.monotonic() + interval_s
            interval_s = ACTIVITY_CHECK_S
        self._arm(interval_s)

    def _activity(self, monitor: MonitorLike) -> bool:
        try:
            return monitor.activity_seen()
        except Exception:
            if not self._activity_failed:  # logged once; the polls keep their interval
                self._activity_failed = True
                log.exception("activity_seen failed")
            return False

    def _interval_s(self, monitor: MonitorLike) -> float:
        try:
            interval = float(monitor.next_interval_s())
        except Exception:
            log.exception("next_interval_s failed")
            return DEFAULT_INTERVAL_S
        return interval if interval >= MIN_INTERVAL_S else MIN_INTERVAL_S

    def _arm(self, interval_s: float) -> None:
        if self._timer is not None and not self._paused and not self._stopping:
            self._timer.start(round(interval_s * 1000))

    @Slot(bool)
    def set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        log.info("monitoring %s", "paused" if paused else "resumed")
        if self._timer is None:
            return
        if paused:
            self._timer.stop()
        else:
            self._due_mono_s = None  # resumed: a tick at once
            self._timer.start(0)

    @Slot(object)
    def apply_settings(self, settings: Settings) -> None:
        if self._monitor is None:
            return
        try:
            self._monitor.apply_settings(settings)
        except Exception as exc:
            log.exception("applying settings failed")
            self.error.emit(f"applying settings failed: {type(exc).__name__}: {exc}")

    @Slot()
    def stop(self) -> None:
        """Stop ticking, close the monitor, end the thread's event loop (runs on the worker thread)."""
        self._stopping = True
        if self._timer is not None:
            self._timer.stop()
        if self._monitor is not None:
            try:
                self._monitor.close()
            except Exception:
                log.exception("closing the monitor failed")
            self._monitor = None
        self.stopped.emit()
        thread = self.thread()
        if thread is not None:
            thread.quit()


class WorkerThread(QObject):
    """Owns the sampler QThread and its worker; the GUI thread's handle on them.

    Methods here are called on the GUI thread; they reach the worker through
    queued signals, so they never wait for a tick in progress (except `stop`).
    """

    snapshot_ready = Signal(object)
    error = Signal(str)
    warning = Signal(str)
    store_state = Signal(object)
    _pause_requested = Signal(bool)
    _settings_requested = Signal(object)
    _stop_requested = Signal()

    def __init__(self, factory: Callable[[], MonitorLike], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.qthread = QThread()
        self.qthread.setObjectName("llm-tray-sampler")
        self.worker = MonitorWorker(factory)
        self.worker.moveToThread(self.qthread)
        self.qthread.started.connect(self.worker.start)
        self.worker.snapshot_ready.connect(self.snapshot_ready)
        self.worker.error.connect(self.error)
        self.worker.warning.connect(self.warning)
        self.worker.store_state.connect(self.store_state)
        self._pause_requested.connect(self.worker.set_paused)
        self._settings_requested.connect(self.worker.apply_settings)
        self._stop_requested.connect(self.worker.stop)
        self.paused = False
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.qthread.start()

    def pause(self) -> None:
        self.set_paused(True)

    def resume(self) -> None:
        self.set_paused(False)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._pause_requested.emit(paused)

    def apply_settings(self, settings: Settings) -> None:
        self._settings_requested.emit(settings)

    def is_running(self) -> bool:
        return self.qthread.isRunning()

    def stop(self, timeout_ms: int = 5000) -> bool:
        """Stop the worker and wait for its thread; True when it ended within `timeout_ms`.

        A tick in progress finishes first (probes have their own timeouts).
        """
        if not self._started or self.qthread.isFinished():
            return True
        self._stop_requested.emit()
        if self.qthread.wait(timeout_ms):
            return True
        log.error("the sampler thread did not stop within %d ms", timeout_ms)
        self.qthread.quit()
        return bool(self.qthread.wait(1000))


# --------------------------------------------------------------------------- one-off work


class _Relay(QObject):
    """Lives on the GUI thread; signals emitted from a task thread arrive there queued.

    It is deleted with deleteLater() on the GUI thread once delivered, and `_pending`
    holds it until then, so the task thread (which may hold the last Python reference
    when it ends) never destroys it, and it never dies inside its own slot.
    """

    done = Signal(object)
    failed = Signal(object)

    def __init__(
        self, on_done: Callable[[Any], None] | None, on_error: Callable[[BaseException], None] | None
    ) -> None:
        super().__init__()
        self._on_done = on_done
        self._on_error = on_error
        self.done.connect(self._deliver_done)
        self.failed.connect(self._deliver_error)

    @Slot(object)
    def _deliver_done(self, result: object) -> None:
        self.deleteLater()
        if self._on_done is not None:
            self._on_done(result)

    @Slot(object)
    def _deliver_error(self, exc: object) -> None:
        self.deleteLater()
        if self._on_error is not None and isinstance(exc, BaseException):
            self._on_error(exc)


_background_bugs = BugLog(log)  # a background job's bug: its traceback logged once, then on_error
_pending: set[_Relay] = set()  # keeps relays' Python wrappers alive until Qt has deleted them


def run_in_background(
    fn: Callable[[], Any],
    on_done: Callable[[Any], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    name: str = "llm-tray-task",
) -> threading.Thread:
    """Run `fn()` on a daemon thread; `on_done(result)` / `on_error(exc)` run later on the GUI thread.

    Daemon threads: a hung task (a server that never answers) never blocks quitting the app.
    Call from the GUI thread (the relay object must live there). A failure that is not a known one
    (`is_known_failure`) is a bug: its traceback is logged once, and `on_error` still hears of it.
    """
    for stale in [r for r in _pending if not Shiboken.isValid(r)]:
        _pending.discard(stale)
    relay = _Relay(on_done, on_error)
    _pending.add(relay)
    done, failed = relay.done, relay.failed

    def run() -> None:
        try:
            result = fn()
        except Exception as exc:
            if not is_known_failure(exc):
                _background_bugs.report(exc, f"background job {name}")
            failed.emit(exc)
        else:
            done.emit(result)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
