"""The tray icon, its tooltip and its menu, driven by Snapshots.

The icon is redrawn only when what it shows changes (IconState equality, with
rounding and hysteresis in trayapp.core.glance), at most twice a second. The
menu is rebuilt each time it opens, from the latest snapshot (this machine's
servers first, then each remote machine's under its name), and lists the
running recording proxies with the address clients should use. Slow actions
(export, start-at-login files) run off the GUI thread.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QFileDialog, QMenu, QSystemTrayIcon

from trayapp.config.settings import ProxyConfig
from trayapp.core.diagnostics import diagnostics_text
from trayapp.core.glance import (
    GlanceTracker,
    IconState,
    fix_clipboard_text,
    host_port,
    icon_state,
    paused_state,
)
from trayapp.core.model import Alert, ModelStatus, ServerStatus, Snapshot
from trayapp.core.phases import is_loaded
from trayapp.core.thresholds import Thresholds
from trayapp.ui.icons import make_icon
from trayapp.ui.menu_text import machine_line, model_line, proxy_line, server_line
from trayapp.ui.notifier import alert_headline
from trayapp.ui.worker import run_in_background

log = logging.getLogger(__name__)

MIN_REDRAW_INTERVAL_S = 0.5


class Pausable(Protocol):
    """What the tray pauses: the sampler (ui/worker.py WorkerThread)."""

    def set_paused(self, paused: bool) -> None: ...


class TrayController(QObject):
    """Owns the QSystemTrayIcon: icon and tooltip from snapshots, the menu, the menu's actions."""

    open_dashboard = Signal()
    open_settings = Signal()
    quit_requested = Signal()
    pause_changed = Signal(bool)
    icon_changed = Signal(object)  # IconState, each time the drawn icon changes
    export_finished = Signal(str)
    export_failed = Signal(str)
    bench_requested = Signal(str, str, str)  # server URL, server kind, model: "Benchmark this model…"

    def __init__(
        self,
        worker: Pausable | None = None,
        *,
        export_callback: Callable[[Path], object] | None = None,
        diagnostics: Callable[[Snapshot | None], str] | None = None,
        autostart_enabled: bool = False,
        set_autostart: Callable[[bool], object] | None = None,
        thresholds: Thresholds | None = None,
        template: bool | None = None,
        min_redraw_interval_s: float = MIN_REDRAW_INTERVAL_S,
        discovery: bool | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._worker = worker
        self._export_callback = export_callback
        self._diagnostics = diagnostics or (lambda snapshot: diagnostics_text(snapshot, "(not given)"))
        self._set_autostart = set_autostart
        self.autostart_enabled = autostart_enabled
        self.template = sys.platform == "darwin" if template is None else template
        self.min_redraw_interval_s = min_redraw_interval_s
        self.thresholds = thresholds or Thresholds()
        self.tracker = GlanceTracker(self.thresholds, discovery)
        self.snapshot: Snapshot | None = None
        self.paused = False
        self.proxies: list[ProxyConfig] = []  # the running recording proxies
        self.store_error: str | None = None  # why the session is not recorded now (the menu says it)
        self.proxy_copy_actions: list[QAction] = []
        self.fix_copy_actions: list[QAction] = []  # "Copy fix: …", one per active alert with commands
        self.shown_state: IconState | None = None  # what the icon shows now
        self._pending: IconState | None = None
        self._last_draw_s = -math.inf  # never drawn
        self.icon_draws = 0
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setObjectName("tray-icon-throttle")
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.timeout.connect(self._apply_pending)

        self.tray = QSystemTrayIcon(self)
        self.menu = QMenu()
        self.menu.setToolTipsVisible(True)
        self.menu.aboutToShow.connect(self.rebuild_menu)
        self.tray.setContextMenu(self.menu)
        self.tray.activated.connect(self._on_activated)
        self._show(icon_state(None))
        self.rebuild_menu()

    # ------------------------------------------------------------------ state

    def update_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        if self.paused:
            return
        self._show(self.tracker.update(snapshot))

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """The user's thresholds: the icon's health (low efficiency) and the menu's offload mark."""
        self.thresholds = thresholds
        self.tracker.thresholds = thresholds

    def set_discovery(self, discovery: bool | None) -> None:
        """Whether the default ports are scanned (None: not known): the no-server tooltip says which."""
        self.tracker.discovery = discovery
        if self.snapshot is not None and not self.paused:
            self._show(self.tracker.update(self.snapshot))

    def set_store_error(self, error: str | None) -> None:
        """Why the session is not recorded now (None: it is): the menu's first line while it lasts."""
        self.store_error = error
        self.rebuild_menu()

    def set_proxies(self, proxies: Sequence[ProxyConfig]) -> None:
        """The recording proxies now running (the menu lists them the next time it opens)."""
        self.proxies = list(proxies)
        self.rebuild_menu()

    def _show(self, state: IconState) -> None:
        if state.tooltip != self.tray.toolTip():
            self.tray.setToolTip(state.tooltip)
        if state == self.shown_state and self._pending is None:
            return
        self._pending = state
        wait_s = self._last_draw_s + self.min_redraw_interval_s - time.monotonic()
        if wait_s > 0:
            if not self._redraw_timer.isActive():
                self._redraw_timer.start(max(round(wait_s * 1000), 1))
            return
        self._apply_pending()

    def _apply_pending(self) -> None:
        state = self._pending
        self._pending = None
        if state is None or state == self.shown_state:
            return
        previous = self.shown_state
        self.tray.setIcon(make_icon(state, self.template))
        self.shown_state = state
        self._last_draw_s = time.monotonic()
        self.icon_draws += 1
        if previous is None or previous.health != state.health:
            log.info("icon: %s → %s", previous.health if previous else "start", state.health)
        self.icon_changed.emit(state)

    def flush(self) -> None:
        """Draw a throttled state now (tests, shutdown)."""
        self._redraw_timer.stop()
        self._apply_pending()

    def show(self) -> None:
        self.tray.show()

    def hide(self) -> None:
        self.tray.hide()

    def show_message(self, title: str, body: str, critical: bool = False) -> None:
        icon = QSystemTrayIcon.MessageIcon.Warning if critical else QSystemTrayIcon.MessageIcon.Information
        if self.tray.isVisible():
            self.tray.showMessage(title, body, icon, 10_000)
        else:
            log.info("%s: %s", title, body)

    # ------------------------------------------------------------------ menu

    def rebuild_menu(self) -> None:
        """Rebuild the whole menu from the latest snapshot (called as it opens)."""
        menu = self.menu
        menu.clear()
        self._add_server_lines(menu)
        menu.addSeparator()
        self._add_fix_lines(menu)
        self._add_proxy_lines(menu)
        self.dashboard_action = menu.addAction("Open dashboard")
        self.dashboard_action.triggered.connect(self.open_dashboard)
        self.pause_action = menu.addAction("Pause monitoring")
        self.pause_action.setCheckable(True)
        self.pause_action.setChecked(self.paused)
        self.pause_action.toggled.connect(self.set_paused)
        target = self.bench_target()
        bench_label = f"Benchmark {target[1].name}…" if target else "Benchmark this model…"
        self.bench_action = menu.addAction(bench_label)
        self.bench_action.setEnabled(target is not None)
        self.bench_action.setToolTip(
            f"Measure it through {host_port(target[0].url)}: decode, TTFT, a context sweep, as the baseline"
            if target
            else "No model of this machine is loaded"
        )
        self.bench_action.triggered.connect(self._request_bench)
        self.export_action = menu.addAction("Export session log…")
        self.export_action.setEnabled(self._export_callback is not None)
        self.export_action.triggered.connect(self.export_session_log)
        self.diagnostics_action = menu.addAction("Copy diagnostics")
        self.diagnostics_action.setToolTip("A redacted summary for bug reports: no API keys, no prompts")
        self.diagnostics_action.triggered.connect(self.copy_diagnostics)
        menu.addSeparator()
        self.settings_action = menu.addAction("Settings…")
        self.settings_action.triggered.connect(self.open_settings)
        self.autostart_action = menu.addAction("Start at login")
        self.autostart_action.setCheckable(True)
        self.autostart_action.setChecked(self.autostart_enabled)
        self.autostart_action.setEnabled(self._set_autostart is not None)
        self.autostart_action.toggled.connect(self.set_start_at_login)
        menu.addSeparator()
        self.quit_action = menu.addAction("Quit")
        self.quit_action.triggered.connect(self.quit_requested)

    def _info(self, menu: QMenu, text: str) -> QAction:
        action = menu.addAction(text)
        action.setEnabled(False)
        return action

    def _add_server_lines(self, menu: QMenu) -> None:
        snapshot = self.snapshot
        if self.store_error:
            self._info(menu, f"⚠ Session log: {self.store_error}")
        if self.paused:
            self._info(menu, "Monitoring paused")
        if snapshot is None:
            self._info(menu, "Looking for LLM servers…")
            return
        local = [s for s in snapshot.servers if s.machine is None]
        shown = [s for s in local if s.status != "unreachable"]
        if not shown and not snapshot.machines:
            self._info(menu, "No LLM server found")
            probed = [host_port(s.url) for s in local]
            if probed:
                self._info(menu, "   probed " + ", ".join(probed[:6]))
            return
        self._add_servers(menu, shown)
        for machine in snapshot.machines:  # then each remote machine, in the config's order
            self._info(menu, machine_line(machine))
            remote = [s for s in snapshot.servers if s.machine == machine.name and s.status != "unreachable"]
            self._add_servers(menu, remote)

    def _add_servers(self, menu: QMenu, servers: Sequence[ServerStatus]) -> None:
        for server in servers:
            self._info(menu, server_line(server))
            for model in server.models:
                self._info(menu, model_line(model, self.thresholds.offload_gpu_fraction))

    def _add_fix_lines(self, menu: QMenu) -> None:
        """ "Copy fix: <headline>" for each active alert whose fix has commands: the notification's
        action (a tray message has no buttons on Linux, macOS or Windows; the menu is there on all)."""
        self.fix_copy_actions = []
        alerts = [a for a in (self.snapshot.alerts if self.snapshot else ()) if a.ended_wall_s is None]
        for alert in alerts:
            if not alert.fix_commands:
                continue
            where = f"{alert.machine}: " if alert.machine else ""
            action = menu.addAction(f"Copy fix: {where}{alert_headline(alert)}")
            action.setToolTip(fix_clipboard_text(alert))
            action.triggered.connect(lambda _checked=False, alert=alert: self.copy_fix(alert))
            self.fix_copy_actions.append(action)
        if self.fix_copy_actions:
            menu.addSeparator()

    def _add_proxy_lines(self, menu: QMenu) -> None:
        self.proxy_copy_actions = []
        for proxy in self.proxies:
            url = proxy.client_url
            self._info(menu, proxy_line(proxy)).setToolTip(f"Point clients at {url}")
            action = menu.addAction("   Copy address")
            action.setToolTip(f"Copy {url}")
            action.triggered.connect(lambda _checked=False, url=url: self.copy_proxy_address(url))
            self.proxy_copy_actions.append(action)
        if self.proxies:
            menu.addSeparator()

    def server_lines(self) -> list[str]:
        """The menu's server/model lines as they read now (for tests and the e2e check)."""
        texts = []
        for action in self.menu.actions():
            if action.isSeparator():
                break
            texts.append(action.text())
        return texts

    # ------------------------------------------------------------------ actions

    def _on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.open_dashboard.emit()

    def set_paused(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        if self._worker is not None:
            self._worker.set_paused(paused)
        self.pause_changed.emit(paused)
        if paused:
            self._show(paused_state(self.shown_state))
        else:
            self._show(self.tracker.update(self.snapshot) if self.snapshot else icon_state(None))

    def copy_diagnostics(self) -> str:
        text = self._diagnostics(self.snapshot)
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None:
            clipboard.setText(text)
        self.show_message(
            "Diagnostics copied", "A redacted summary is on the clipboard, ready for a bug report."
        )
        return text

    def copy_fix(self, alert: Alert) -> str:
        """Put the alert's fix commands on the clipboard (one per line); llm-tray never runs them."""
        text = fix_clipboard_text(alert)
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None and text:
            clipboard.setText(text)
        lines = len(alert.fix_commands)
        self.show_message(
            "Fix copied",
            f"{lines} line{'s' if lines != 1 else ''} on the clipboard for {alert.model or alert.server}: "
            "paste where the server is started or configured.",
        )
        return text

    def copy_proxy_address(self, url: str) -> None:
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None:
            clipboard.setText(url)
        self.show_message("Proxy address copied", f"Point clients at {url} to record their requests.")

    def ask_export_path(self) -> Path | None:
        """Ask where to export (a modal file dialog; tests replace this method)."""
        default = Path.home() / f"llm-tray-sessions-{time.strftime('%Y%m%d')}.csv"
        name, _filter = QFileDialog.getSaveFileName(
            None,
            "Export session log",
            str(default),
            "CSV (*.csv);;JSON Lines (*.jsonl);;Parquet (*.parquet)",
        )
        return Path(name) if name else None

    def bench_target(self) -> tuple[ServerStatus, ModelStatus] | None:
        """The model "Benchmark this model…" benches: the one the icon speaks for when it is loaded
        on this machine, else this machine's first loaded model (a remote one is benched there)."""
        if self.snapshot is None:
            return None
        loaded = [
            (s, m)
            for s, m in self.snapshot.models()
            if s.machine is None and s.status == "ok" and is_loaded(m.phase)
        ]
        shown = self.tracker.state.model_key if self.tracker.state is not None else None
        return next((p for p in loaded if (p[0].url, p[1].name) == shown), loaded[0] if loaded else None)

    def _request_bench(self) -> None:
        target = self.bench_target()
        if target is not None:
            self.bench_requested.emit(target[0].url, target[0].kind, target[1].name)

    def export_session_log(self) -> None:
        callback = self._export_callback
        if callback is None:
            return
        path = self.ask_export_path()
        if path is None:
            return
        log.info("export requested")

        def done(result: object) -> None:
            message = str(result) if result is not None else f"Saved {path.name}"
            self.show_message("Session log exported", message)
            self.export_finished.emit(message)

        def failed(exc: BaseException) -> None:
            message = f"{type(exc).__name__}: {exc}"
            log.error("export failed: %s", message)
            self.show_message("Export failed", message, critical=True)
            self.export_failed.emit(message)

        run_in_background(lambda: callback(path), done, failed, name="llm-tray-export")

    def set_start_at_login(self, enabled: bool) -> None:
        setter = self._set_autostart
        if setter is None or enabled == self.autostart_enabled:
            return
        self.autostart_enabled = enabled

        def failed(exc: BaseException) -> None:
            self.autostart_enabled = not enabled
            log.error("start at login: %s", exc)
            self.show_message("Start at login", f"Could not change it: {exc}", critical=True)

        def done(_result: object) -> None:
            log.info("start at login %s", "on" if enabled else "off")

        run_in_background(lambda: setter(enabled), done, failed, name="llm-tray-autostart")
