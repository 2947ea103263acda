"""The settings dialog: endpoints (with connection test and API keys in the OS keyring),
recording proxies, polling, thresholds, notifications, the Prometheus exporter and retention.

Nothing here blocks the GUI thread: the connection test, the keyring write and
the atomic save run in background threads and report back. OK validates the
values the same way the config loader does, saves, then emits
`settings_changed(Settings)` so the app applies them without a restart.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import Shiboken

from trayapp.config.settings import (
    RANGES,
    EndpointConfig,
    MonitorConfig,
    Settings,
    StoreConfig,
    parse_settings,
)
from trayapp.config.settings_file import save_settings, settings_to_toml
from trayapp.core.alert_kinds import ALERT_KINDS
from trayapp.core.server_kinds import USER_SERVER_KINDS, server_label
from trayapp.core.thresholds import THRESHOLD_INFO, Thresholds
from trayapp.ui.agents_tab import AgentsTab
from trayapp.ui.list_editor import ListEditor, SecretField
from trayapp.ui.proxies_tab import ProxiesTab
from trayapp.ui.worker import run_in_background

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SettingsServices:
    """What the dialog needs from outside the UI, given by the app (which owns the sources and services).

    Both calls block (network, OS keyring): the dialog runs them off the GUI thread.
    """

    identify: Callable[[str, str | None], tuple[str | None, str]]  # (url, api key) → (kind | None, why)
    store_api_key: Callable[[str, str], None]  # (url, key) → None; raises with a reason on failure


def validate(settings: Settings) -> list[str]:
    """The errors the config loader would report for these settings (empty: all good)."""
    _parsed, errors = parse_settings(tomllib.loads(settings_to_toml(settings)))
    return errors


def _spin(path: str, value: float, decimals: int = 2, integer: bool = False) -> QDoubleSpinBox | QSpinBox:
    # The loader's own limits, so the dialog cannot save what the loader would reject.
    low, high = RANGES.get(path, (0.0, 1e6))
    if integer:
        box = QSpinBox()
        box.setRange(int(low), int(high))
        box.setValue(int(value))
        return box
    spin = QDoubleSpinBox()
    spin.setDecimals(decimals)
    spin.setRange(low, high)
    spin.setValue(value)
    return spin


class SettingsDialog(QDialog):
    settings_changed = Signal(object)  # Settings, after a successful save

    def __init__(
        self,
        settings: Settings,
        *,
        services: SettingsServices,
        config_path: Path | None = None,
        test_timeout_s: float = 10.0,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("llm-tray settings")
        self.original = settings
        self.config_path = config_path
        self.services = services
        self.test_timeout_s = test_timeout_s
        self._test_token = 0
        self.saving = False

        layout = QVBoxLayout(self)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs)
        self.tabs.addTab(self._endpoints_tab(settings.endpoints), "Servers")
        self.proxies_tab = ProxiesTab(settings.proxies)
        self.tabs.addTab(self.proxies_tab, "Proxies")
        self.agents_tab = AgentsTab(settings.agents, services.store_api_key)
        self.tabs.addTab(self.agents_tab, "Remote machines")
        self.tabs.addTab(self._monitor_tab(settings.monitor), "Monitoring")
        self.tabs.addTab(self._thresholds_tab(settings.thresholds), "Thresholds")
        self.tabs.addTab(self._notifications_tab(settings), "Notifications")
        self.tabs.addTab(self._data_tab(settings), "Data")
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #b00020;")
        self.error_label.hide()
        layout.addWidget(self.error_label)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.endpoint_editor.select(0 if settings.endpoints else -1)
        tab = self.proxies_tab  # its widgets and actions, reachable from the dialog as before
        self.proxy_list, self.proxy_address = tab.list, tab.proxy_address
        self.proxy_listen_edit, self.proxy_upstream_edit = tab.proxy_listen_edit, tab.proxy_upstream_edit
        self.proxy_kind_combo, self.proxy_enabled_check = tab.proxy_kind_combo, tab.proxy_enabled_check
        self.add_proxy, self.remove_proxy = tab.add_proxy, tab.remove_proxy
        self.copy_proxy_address = tab.copy_proxy_address

    # ------------------------------------------------------------------ tabs

    def _endpoints_tab(self, endpoints: tuple[EndpointConfig, ...]) -> ListEditor[EndpointConfig]:
        self.endpoint_editor = editor = ListEditor(
            endpoints,
            caption="Servers to watch besides the default ports:",
            title="Server",
            blank=EndpointConfig(url=""),
            item_text=lambda endpoint: endpoint.url or "(no URL)",
            fill_form=self._fill_endpoint,
            read_form=self._read_endpoint,
            new_item=lambda: EndpointConfig(url="http://127.0.0.1:8080"),
        )
        form = editor.form
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://127.0.0.1:8080")
        self.kind_combo = QComboBox()
        self.kind_combo.addItem("detect automatically", None)
        for kind in USER_SERVER_KINDS:
            self.kind_combo.addItem(server_label(kind), kind)
        self.name_edit = QLineEdit()
        self.env_edit = QLineEdit()
        self.env_edit.setPlaceholderText("e.g. LLAMA_API_KEY")
        self.api_key = SecretField("key", "stored in the OS keyring, never in the config file")
        self.api_key.button.clicked.connect(self.save_api_key)
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test_connection)
        self.test_result = QLabel()
        self.test_result.setWordWrap(True)
        form.addRow("URL", self.url_edit)
        form.addRow("Kind", self.kind_combo)
        form.addRow("Name", self.name_edit)
        form.addRow("API key env var", self.env_edit)
        self.api_key.add_rows(form, "API key")
        form.addRow(self.test_button, self.test_result)
        for edit in (self.url_edit, self.name_edit, self.env_edit):
            edit.textEdited.connect(editor.store_form)
        self.kind_combo.currentIndexChanged.connect(editor.store_form)
        editor.focus_on_add = self.url_edit
        return editor

    def _monitor_tab(self, monitor: MonitorConfig) -> QWidget:
        tab = QWidget()
        form = QFormLayout(tab)
        self.discover_check = QCheckBox("Scan the default local ports (Ollama, llama-server, LM Studio, …)")
        self.discover_check.setChecked(monitor.discover)
        self.poll_active_spin = _spin("monitor.poll_active_s", monitor.poll_active_s, 1)
        self.poll_idle_spin = _spin("monitor.poll_idle_s", monitor.poll_idle_s, 1)
        self.rediscover_spin = _spin("monitor.rediscover_s", monitor.rediscover_s, 0)
        form.addRow(self.discover_check)
        form.addRow("Poll while generating (s)", self.poll_active_spin)
        form.addRow("Poll while idle (s)", self.poll_idle_spin)
        form.addRow("Look for new servers every (s)", self.rediscover_spin)
        return tab

    def _thresholds_tab(self, thresholds: Thresholds) -> QWidget:
        tab = QWidget()
        form = QFormLayout(tab)
        self.threshold_spins: dict[str, QDoubleSpinBox | QSpinBox] = {}
        for name, info in THRESHOLD_INFO.items():
            value = getattr(thresholds, name)
            decimals = 2 if value < 10 else 1
            spin = _spin(f"thresholds.{name}", value, decimals)
            self.threshold_spins[name] = spin
            form.addRow(info.caption, spin)
        return tab

    def _notifications_tab(self, settings: Settings) -> QWidget:
        tab = QWidget()
        layout = QVBoxLayout(tab)
        notifications = settings.notifications
        self.notify_check = QCheckBox("Show a notification when a new alert starts")
        self.notify_check.setChecked(notifications.enabled)
        self.dnd_check = QCheckBox("Do not disturb (alerts still show in the icon and the dashboard)")
        self.dnd_check.setChecked(notifications.do_not_disturb)
        layout.addWidget(self.notify_check)
        layout.addWidget(self.dnd_check)
        box = QGroupBox("Mute these kinds")
        box_layout = QVBoxLayout(box)
        self.mute_checks: dict[str, QCheckBox] = {}
        kinds: dict[str, str] = {name: kind.label for name, kind in ALERT_KINDS.items()}
        for kind in notifications.muted_kinds:
            kinds.setdefault(kind, "")
        for kind, description in kinds.items():
            check = QCheckBox(f"{kind}: {description}" if description else kind)
            check.setChecked(kind in notifications.muted_kinds)
            self.mute_checks[kind] = check
            box_layout.addWidget(check)
        layout.addWidget(box)
        layout.addStretch(1)
        return tab

    def _data_tab(self, settings: Settings) -> QWidget:
        tab = QWidget()
        form = QFormLayout(tab)
        exporter = settings.exporter
        self.exporter_check = QCheckBox(f"Serve Prometheus metrics on {exporter.address}")
        self.exporter_check.setChecked(exporter.enabled)
        self.port_spin = _spin("exporter.port", exporter.port, integer=True)
        store: StoreConfig = settings.store
        self.retention_spin = _spin("store.retention_days", store.retention_days, 1)
        self.max_size_spin = _spin("store.max_size_mb", store.max_size_mb, 0)
        form.addRow(self.exporter_check)
        form.addRow("Exporter port", self.port_spin)
        form.addRow("Keep the session log (days)", self.retention_spin)
        form.addRow("Session log size limit (MB)", self.max_size_spin)
        return tab

    # ------------------------------------------------------------------ endpoints

    def _fill_endpoint(self, endpoint: EndpointConfig) -> None:
        self.url_edit.setText(endpoint.url)
        self.kind_combo.setCurrentIndex(max(self.kind_combo.findData(endpoint.kind), 0))
        self.name_edit.setText(endpoint.name or "")
        self.env_edit.setText(endpoint.api_key_env or "")
        self.api_key.edit.clear()
        self.api_key.status.setText("A key is stored in the OS keyring." if endpoint.use_keyring else "")
        self.test_result.clear()

    def _read_endpoint(self, endpoint: EndpointConfig) -> EndpointConfig:
        return replace(
            endpoint,
            url=self.url_edit.text().strip(),
            kind=self.kind_combo.currentData(),
            name=self.name_edit.text().strip() or None,
            api_key_env=self.env_edit.text().strip() or None,
        )

    def add_endpoint(self, url: str = "http://127.0.0.1:8080") -> None:
        self.endpoint_editor.add(EndpointConfig(url=url))

    def remove_endpoint(self) -> None:
        self.endpoint_editor.remove()

    # ------------------------------------------------------------------ connection test

    def test_connection(self) -> None:
        """Identify the server at the URL in the background; the answer (or a timeout) shows below."""
        url = self.url_edit.text().strip()
        if not url.startswith(("http://", "https://")):
            self.test_result.setText("Enter a URL starting with http:// or https://")
            return
        self._test_token += 1
        token = self._test_token
        key = self.api_key.edit.text() or None
        self.test_result.setText(f"Testing {url}…")
        self.test_button.setEnabled(False)

        def finish(text: str) -> None:
            if not Shiboken.isValid(self) or token != self._test_token:
                return  # a newer test, or the timeout, already answered
            self._test_token += 1
            self.test_button.setEnabled(True)
            self.test_result.setText(text)

        def done(result: object) -> None:
            kind, why = cast(tuple[str | None, str], result)
            if kind:
                finish(f"✓ {server_label(kind)} ({why})")
            else:
                finish(f"✗ no LLM server recognised: {why}")

        def failed(exc: BaseException) -> None:
            finish(f"✗ {type(exc).__name__}: {exc}")

        run_in_background(
            lambda: self.services.identify(url, key), done, failed, name="llm-tray-test-connection"
        )
        seconds = self.test_timeout_s
        QTimer.singleShot(round(seconds * 1000), self, lambda: finish(f"✗ no answer within {seconds:g} s"))

    def save_api_key(self) -> None:
        """Store the typed key in the OS keyring (in the background); on failure say why and what to do."""
        key, url = self.api_key.edit.text(), self.url_edit.text().strip()
        if self.endpoint_editor.current() is None or not key or not url:
            self.api_key.status.setText("Type the server URL and its key first.")
            return

        def mark_keyring() -> None:  # the endpoint with that URL now has its key in the keyring
            editor = self.endpoint_editor
            for row, endpoint in enumerate(editor.items):
                if endpoint.url == url:
                    editor.set_item(row, replace(endpoint, use_keyring=True))

        self.api_key.save(self.services.store_api_key, url, key, on_saved=mark_keyring)

    # ------------------------------------------------------------------ result

    def settings(self) -> Settings:
        """Settings as the widgets show them (fields the dialog does not edit are kept)."""
        s = self.original
        thresholds = replace(
            s.thresholds,
            **{name: float(spin.value()) for name, spin in self.threshold_spins.items()},
        )
        return replace(
            s,
            endpoints=tuple(self.endpoint_editor.items),
            proxies=self.proxies_tab.proxies(),
            agents=self.agents_tab.agents(),
            monitor=replace(
                s.monitor,
                discover=self.discover_check.isChecked(),
                poll_active_s=self.poll_active_spin.value(),
                poll_idle_s=self.poll_idle_spin.value(),
                rediscover_s=self.rediscover_spin.value(),
            ),
            thresholds=thresholds,
            notifications=replace(
                s.notifications,
                enabled=self.notify_check.isChecked(),
                do_not_disturb=self.dnd_check.isChecked(),
                muted_kinds=tuple(k for k, check in self.mute_checks.items() if check.isChecked()),
            ),
            exporter=replace(
                s.exporter, enabled=self.exporter_check.isChecked(), port=int(self.port_spin.value())
            ),
            store=replace(
                s.store, retention_days=self.retention_spin.value(), max_size_mb=self.max_size_spin.value()
            ),
        )

    def show_error(self, text: str | None) -> None:
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))

    def accept(self) -> None:
        """Validate, save atomically in the background, then emit settings_changed and close."""
        if self.saving:
            return
        new = self.settings()
        errors = validate(new)
        if errors:
            self.show_error("Please fix: " + "; ".join(errors))
            return
        self.show_error(None)
        self.saving = True
        self.buttons.setEnabled(False)
        path = self.config_path

        def done(saved_to: object) -> None:
            self.saving = False
            self.buttons.setEnabled(True)
            log.info("settings saved to %s", saved_to)
            self.original = new
            self.settings_changed.emit(new)
            super(SettingsDialog, self).accept()

        def failed(exc: BaseException) -> None:
            self.saving = False
            self.buttons.setEnabled(True)
            self.show_error(f"Could not save the settings: {exc}")
            log.error("saving settings failed: %s", exc)

        run_in_background(lambda: save_settings(new, path), done, failed, name="llm-tray-save-settings")
