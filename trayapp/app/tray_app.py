"""The tray app's composition root: QApplication, sampler thread, tray, dashboard, notifier, proxies.

`run_tray()` (app/tray_main.py) is what `llm-tray` (no subcommand) runs. Threads: the GUI thread
owns every widget and never does blocking I/O; one sampler QThread runs the
Monitor (HTTP, NVML, SQLite); one-off work (export, keyring, start-at-login,
the exporter's socket) runs on short-lived daemon threads. Each recording proxy the user turned
on runs on its own event-loop thread; its records reach the monitor's tick through a RecordInbox.
Each snapshot is also published on this machine's loopback snapshot endpoint
(sinks/snapshot_server.py) for `status`, `watch` and `bar`: a reference swap on the GUI thread.

`LLM_TRAY_TEST_EVENTS=<path>` makes the app append JSON lines describing what
it shows (tray shown, icon changes with their number, dashboard shown, curve
point counts) for end-to-end tests. No prompt text ever reaches the log or
those events.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from trayapp.app.actions import (
    autostart_enabled,
    export_session_log,
    identify_server,
    set_autostart,
    store_api_key,
)
from trayapp.app.events import TestEvents
from trayapp.app.proxy_service import ProxyService
from trayapp.app.single_instance import InstanceListener
from trayapp.config.settings import ExporterConfig, ProxyConfig, Settings, watched_settings
from trayapp.core.diagnostics import diagnostics_text
from trayapp.core.glance import IconState
from trayapp.core.model import Snapshot
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sinks.snapshot_server import SnapshotServer
from trayapp.ui.dashboard import LazyDashboard as Dashboard  # the real window loads when first opened
from trayapp.ui.menu_text import settings_summary
from trayapp.ui.notifier import Notifier
from trayapp.ui.tray import TrayController
from trayapp.ui.worker import MonitorLike, WorkerThread, run_in_background

if TYPE_CHECKING:  # windows a user rarely opens load when first opened (their Qt classes: ~2 MiB)
    from trayapp.ui.no_tray_window import NoTrayWindow
    from trayapp.ui.settings_dialog import SettingsDialog, SettingsServices

log = logging.getLogger(__name__)

TRAY_WAIT_S = 60.0  # how long to wait for the panel's system tray (at login, and at a normal start)
TRAY_POLL_MS = 1000
TRAY_WAIT_ENV = "LLM_TRAY_TRAY_WAIT_S"  # tests shorten the wait

MonitorFactory = Callable[[], MonitorLike]


# --------------------------------------------------------------------------- services


def settings_services() -> SettingsServices:
    """The settings dialog's way to the sources (connection test, keyring)."""
    from trayapp.ui.settings_dialog import SettingsServices

    return SettingsServices(identify=identify_server, store_api_key=store_api_key)


# --------------------------------------------------------------------------- the app


class TrayApp(QObject):
    """Everything the tray app is made of, wired together. Lives on the GUI thread."""

    def __init__(
        self,
        app: QApplication,
        settings: Settings,
        monitor_factory: MonitorFactory,
        *,
        at_login: bool = False,
        events: TestEvents | None = None,
        instance: InstanceListener | None = None,
        proxy_inbox: RecordInbox | None = None,
        discover: bool | None = None,
    ) -> None:
        """`discover`: the command line's override of `settings.monitor.discover` (None: as configured)."""
        super().__init__()
        self.app = app
        self.settings = settings
        self.discover_override = discover
        self.at_login = at_login
        self.events = events or TestEvents(None)
        self.instance = instance
        self.last_snapshot: Snapshot | None = None
        self.last_error: str | None = None
        self.warnings: list[str] = []
        self.store_error: str | None = None  # why the session is not being recorded now
        self.tray_visible = False
        self._settings_dialog: SettingsDialog | None = None
        self._exporter: Any = None
        self._metrics_state: Any = None
        self._tray_deadline = 0.0
        self.no_tray_window: NoTrayWindow | None = None  # says how to get a tray, while there is none
        self._stopped = False
        self.proxies = ProxyService(proxy_inbox or RecordInbox())  # the monitor's inbox (run_tray)
        self.monitor: MonitorLike | None = None  # built on the sampler thread; a bench stores through it
        # for status, watch and bar; a CLI proxy's or bench's records reach the monitor through it
        self.snapshots = SnapshotServer(thresholds=settings.thresholds, intake=lambda: self.monitor)
        self._bench_window: Any = None

        def build_monitor() -> MonitorLike:
            self.monitor = monitor_factory()
            return self.monitor

        self.runner = WorkerThread(build_monitor)
        self.dashboard = Dashboard(kv_type=settings.hardware.kv_type, thresholds=settings.thresholds)
        self.tray = TrayController(
            self.runner,
            export_callback=export_session_log,
            diagnostics=self.diagnostics,
            autostart_enabled=autostart_enabled(),
            set_autostart=set_autostart,
            thresholds=settings.thresholds,
            discovery=self.discovery(settings),
        )
        self.notifier = Notifier(self.tray.tray, settings.notifications)

        self.runner.snapshot_ready.connect(self.on_snapshot)
        self.runner.error.connect(self.on_error)
        self.runner.warning.connect(self.on_warning)
        self.runner.store_state.connect(self.on_store_state)
        self.tray.open_dashboard.connect(self.show_dashboard)
        self.tray.open_settings.connect(self.open_settings)
        self.tray.bench_requested.connect(self.open_bench)
        self.tray.quit_requested.connect(app.quit)
        self.tray.icon_changed.connect(self._on_icon_changed)
        self.tray.pause_changed.connect(lambda paused: self.events.emit("paused", paused=paused))
        self.notifier.alert_clicked.connect(self.focus_alert)
        self.notifier.notified.connect(lambda a: self.events.emit("notified", id=a.id, kind=a.kind))
        self.dashboard.redrawn.connect(lambda info: self.events.emit("curve", **info))
        if instance is not None:
            instance.show_requested.connect(self.show_dashboard)
        app.aboutToQuit.connect(self.shutdown)

        self._tray_timer = QTimer(self)
        self._tray_timer.setObjectName("wait-for-system-tray")
        self._tray_timer.setInterval(TRAY_POLL_MS)
        self._tray_timer.timeout.connect(self._poll_tray)

    @cached_property
    def versions(self) -> dict[str, str]:
        """The versions diagnostics name, read when first asked for (importlib.metadata, platform)."""
        from trayapp.ui.versions import collect_versions

        return collect_versions()

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        self.events.emit("started", pid=os.getpid(), at_login=self.at_login)
        if self.tray.shown_state is not None:
            self._on_icon_changed(self.tray.shown_state)  # drawn before anyone listened
        QTimer.singleShot(0, self._start_sampling)  # once the loop runs: the panel docks the icon first
        if QSystemTrayIcon.isSystemTrayAvailable():
            self._show_tray()
        else:
            try:
                wait_s = float(os.environ.get(TRAY_WAIT_ENV, TRAY_WAIT_S))
            except ValueError:
                wait_s = TRAY_WAIT_S
            log.info("no system tray yet: waiting up to %.0f s for the panel", wait_s)
            self._tray_deadline = time.monotonic() + wait_s
            self._tray_timer.start()
            if not self.at_login:  # started by hand: a window now; a tray that appears still gets the icon
                self._run_without_tray("No system tray is available on this desktop", wait_s)
        self._apply_proxies(self.settings.proxies)  # after the tray shows, so its warnings are seen

    def _start_sampling(self) -> None:
        """The sampler, its endpoints: after the icon, so their imports and probes never delay it."""
        if self._stopped:
            return
        self.runner.start()
        self.snapshots.start_in_background(announce=True)
        self._apply_exporter(self.settings.exporter)

    def _poll_tray(self) -> None:
        if QSystemTrayIcon.isSystemTrayAvailable():
            self._tray_timer.stop()
            self._show_tray()
        elif time.monotonic() >= self._tray_deadline:
            self._tray_timer.stop()
            if self.no_tray_window is None:
                self._run_without_tray("No system tray appeared after login")

    def _show_tray(self) -> None:
        if self.no_tray_window is not None:  # it appeared while the app ran as a window
            self.app.setQuitOnLastWindowClosed(False)
            self.dashboard.set_banner(None)
            self.no_tray_window.close()
            self.no_tray_window = None
        self.tray.show()
        self.tray_visible = True
        log.info("tray icon shown")
        self.events.emit("tray_shown")

    def _run_without_tray(self, why: str, wait_s: float = 0.0) -> None:
        log.warning("%s: running as a window", why)
        self.app.setQuitOnLastWindowClosed(True)  # the window is the app now: closing it quits
        self.dashboard.set_banner(
            f"{why}, so llm-tray runs as this window (closing it quits). "
            "Desktops without a tray (e.g. GNOME) need an extension such as AppIndicator for the icon."
        )
        self.events.emit("no_tray", reason=why)
        self.show_dashboard()
        from trayapp.ui.no_tray_window import NoTrayWindow

        window = self.no_tray_window = NoTrayWindow(why, wait_s)
        window.open_dashboard.connect(self.show_dashboard)
        window.quit_requested.connect(self.app.quit)
        window.show()
        self.events.emit("no_tray_window", waiting=window.waiting, text=window.text())

    def shutdown(self) -> None:
        """Stop everything, each part even when one before it fails (that is logged). Called by
        `aboutToQuit` and again after the event loop: the first call does it."""
        if self._stopped:
            return
        self._stopped = True
        log.info("stopping")
        exporter, self._exporter = self._exporter, None
        instance = self.instance
        steps: list[tuple[str, Callable[[], object]]] = [
            ("the tray's wait timer", self._tray_timer.stop),
            ("the no-tray window", self.no_tray_window.close if self.no_tray_window else _nothing),
            ("the sampler thread", self._stop_sampler),
            ("the Prometheus exporter", (lambda: exporter.stop(1.0)) if exporter else _nothing),
            ("the proxies", self.proxies.stop),
            ("the snapshot endpoint", lambda: self.snapshots.stop(1.0)),
            ("the single-instance listener", instance.close if instance else _nothing),
            ("the tray icon", self.tray.hide),
        ]
        for what, step in steps:
            try:
                step()
            except Exception:
                log.exception("stopping %s failed (the rest is stopped all the same)", what)
        self.events.emit("quit")

    def _stop_sampler(self) -> None:
        if not self.runner.stop(5000):
            log.error("the sampler thread did not stop in time")

    # ------------------------------------------------------------------ snapshots

    def on_snapshot(self, snapshot: Snapshot) -> None:
        if self._stopped:
            return  # queued by the sampler just before it stopped: nothing is shown any more
        first = self.last_snapshot is None
        self.last_snapshot = snapshot
        if self.last_error is not None:
            self.last_error = None
        self.tray.update_snapshot(snapshot)
        self.dashboard.update_snapshot(snapshot)
        self.notifier.on_snapshot(snapshot)
        self.snapshots.publish(snapshot)  # a reference swap; its documents are built on its thread
        if self._metrics_state is not None:
            self._metrics_state.observe(snapshot)
        if first:
            log.info("first snapshot: %d server(s)", len(snapshot.servers))
        if self.events.enabled:
            models = [
                {"server": s.url, "model": m.name, "phase": m.phase, "decode_tok_s": m.decode_tok_s}
                for s, m in snapshot.models()
            ]
            self.events.emit("snapshot", servers=len(snapshot.servers), models=models)

    def on_error(self, message: str) -> None:
        if message != self.last_error:
            self.events.emit("error", message=message)
        self.last_error = message
        if self.last_snapshot is None:
            self.tray.tray.setToolTip(f"llm-tray\n{message}")

    def on_warning(self, message: str) -> None:
        """A lasting condition the monitor reported once (e.g. not recording): tell the user once."""
        self.warnings.append(message)
        self.events.emit("warning", message=message)
        self.tray.show_message("llm-tray", message, critical=True)

    def on_store_state(self, error: str | None) -> None:
        """The session log failed to record (a full disk, a locked or broken file, a bug), or records
        again: the menu says what is wrong while it lasts (the text follows the store's), Copy
        diagnostics carries it, and a notification marks each start and end of a failure."""
        failing_before = self.store_error is not None
        self.store_error = error
        self.tray.set_store_error(error)
        self.events.emit("store_state", error=error)
        if error and not failing_before:
            self.tray.show_message("llm-tray: session log", error, critical=True)
        elif not error and failing_before:
            self.tray.show_message("llm-tray: session log", "recording again")

    def _on_icon_changed(self, state: IconState) -> None:
        if self._stopped:
            return  # a throttled redraw firing after quit: nothing is shown any more
        self.events.emit(
            "icon", health=state.health, text=state.text, ring=state.ring, offload=state.offload,
            paused=state.paused, tooltip=state.tooltip,
        )  # fmt: skip

    # ------------------------------------------------------------------ windows

    def show_dashboard(self) -> None:
        self.dashboard.show_and_raise()
        self.events.emit("dashboard_shown")

    def focus_alert(self, alert_id: str) -> None:
        self.dashboard.focus_alert(alert_id)
        self.events.emit("dashboard_shown", alert=alert_id)

    def open_bench(self, url: str, kind: str, model: str) -> None:
        """The "Benchmark this model…" window (loaded on first use); it stores through our store."""
        from trayapp.app.bench_service import endpoint_for, make_bench_runner, store_through
        from trayapp.ui.bench_window import BenchWindow

        if self._bench_window is not None and self._bench_window.isVisible():
            self._bench_window.raise_()
            return
        endpoint = endpoint_for(url, kind, self.settings)
        run = make_bench_runner(self.settings, endpoint, model, store_through(lambda: self.monitor))
        self._bench_window = BenchWindow(model, url, run)
        self._bench_window.finished_bench.connect(lambda done: self.events.emit("bench_done", ok=bool(done)))
        self._bench_window.show()
        self.events.emit("bench_shown", model=model)

    def open_settings(self) -> None:
        dialog = self._settings_dialog
        if dialog is not None and dialog.isVisible():
            dialog.raise_()
            dialog.activateWindow()
            return
        from trayapp.ui.settings_dialog import SettingsDialog

        dialog = SettingsDialog(self.settings, services=settings_services())
        dialog.settings_changed.connect(self.apply_settings)
        self._settings_dialog = dialog
        dialog.show()

    def apply_settings(self, settings: Settings) -> None:
        """New settings from the dialog, applied without a restart."""
        old = self.settings
        self.settings = settings
        self.runner.apply_settings(watched_settings(settings))
        self.notifier.set_config(settings.notifications)
        self.tray.set_thresholds(settings.thresholds)
        self.tray.set_discovery(self.discovery(settings))
        self.snapshots.set_thresholds(settings.thresholds)
        self.dashboard.set_kv_type(settings.hardware.kv_type)
        self.dashboard.set_thresholds(settings.thresholds)
        if settings.exporter != old.exporter:
            self._apply_exporter(settings.exporter)
        if settings.proxies != old.proxies:
            self._apply_proxies(settings.proxies)
        log.info("settings applied")
        self.events.emit("settings_applied")

    def discovery(self, settings: Settings) -> bool:
        """Whether the monitor scans the default ports: `--no-discover` wins over the settings."""
        return settings.monitor.discover if self.discover_override is None else self.discover_override

    def diagnostics(self, snapshot: Snapshot | None) -> str:
        text = diagnostics_text(snapshot, settings_summary(self.settings), self.versions)
        if self.last_error:
            text += f"last monitoring error: {self.last_error}\n"
        if self.store_error:
            text += f"session log: {self.store_error}\n"
        for warning in self.warnings[-5:]:
            text += f"monitor warning: {warning}\n"
        return text

    def _apply_proxies(self, proxies: Sequence[ProxyConfig]) -> None:
        for problem in self.proxies.apply(proxies):
            self.on_warning(problem)
        running = self.proxies.running
        self.tray.set_proxies(running)
        self.events.emit("proxies", running=[p.client_url for p in running])

    # ------------------------------------------------------------------ Prometheus exporter

    def _apply_exporter(self, config: ExporterConfig) -> None:
        """Start or stop the /metrics listener in the background (binding a port is I/O)."""
        old, self._exporter = self._exporter, None
        if not config.enabled:
            self._metrics_state = None
            if old is not None:
                run_in_background(lambda: old.stop(2.0), name="llm-tray-exporter-stop")
            return
        from trayapp.sinks.metrics import MetricsState, start_exporter

        state = self._metrics_state or MetricsState()
        self._metrics_state = state
        if self.last_snapshot is not None:
            state.observe(self.last_snapshot)

        def restart() -> Any:
            if old is not None:
                old.stop(2.0)
            return start_exporter(state, config.address, config.port)

        def started(exporter: Any) -> None:
            if self._stopped or self._metrics_state is not state:
                exporter.stop(1.0)  # turned off (or quit) meanwhile
                return
            self._exporter = exporter
            log.info("Prometheus exporter on %s", exporter.url)
            self.events.emit("exporter", url=exporter.url)

        def failed(exc: BaseException) -> None:
            log.warning("Prometheus exporter: cannot listen on %s:%d: %s", config.address, config.port, exc)
            self.tray.show_message(
                "Prometheus exporter not started",
                f"{config.address}:{config.port}: {exc}. Choose another port in Settings.",
                critical=True,
            )

        run_in_background(restart, started, failed, name="llm-tray-exporter")


def _nothing() -> None:
    """A step with nothing to stop."""
