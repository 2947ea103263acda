"""The settings dialog's Proxies tab: the recording proxies to run, each with its listen address,
upstream and kind, and the address clients use (with a Copy button).

Pure widgets: nothing here touches the network; the dialog reads `proxies()` when it saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from trayapp.config.settings import ProxyConfig
from trayapp.core.glance import kind_label
from trayapp.core.model import SERVER_KINDS


def proxy_item(proxy: ProxyConfig) -> str:
    """The list's line: '127.0.0.1:11435 → http://127.0.0.1:11434' (marked when turned off)."""
    return f"{proxy.listen or '?'} → {proxy.upstream or '?'}{'' if proxy.enabled else '  (off)'}"


class ProxiesTab(QWidget):
    """The list of proxies on the left, the selected one's fields on the right."""

    def __init__(self, proxies: Sequence[ProxyConfig], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._proxies: list[ProxyConfig] = list(proxies)
        self._loading = False
        layout = QHBoxLayout(self)
        left = QVBoxLayout()
        self.proxy_list = QListWidget()
        self.proxy_list.addItems([proxy_item(p) for p in self._proxies])
        self.proxy_list.currentRowChanged.connect(self._select_proxy)
        left.addWidget(QLabel("Recording proxies: exact numbers for every request sent through them"))
        left.addWidget(self.proxy_list)
        row = QHBoxLayout()
        self.proxy_add_button = QPushButton("Add")
        self.proxy_add_button.clicked.connect(lambda: self.add_proxy())
        self.proxy_remove_button = QPushButton("Remove")
        self.proxy_remove_button.clicked.connect(self.remove_proxy)
        row.addWidget(self.proxy_add_button)
        row.addWidget(self.proxy_remove_button)
        left.addLayout(row)
        layout.addLayout(left, 1)
        self.proxy_box = QGroupBox("Proxy")
        form = QFormLayout(self.proxy_box)
        self.proxy_enabled_check = QCheckBox("Run this proxy")
        self.proxy_listen_edit = QLineEdit()
        self.proxy_listen_edit.setPlaceholderText("127.0.0.1:11435")
        self.proxy_upstream_edit = QLineEdit()
        self.proxy_upstream_edit.setPlaceholderText("http://127.0.0.1:11434")
        self.proxy_kind_combo = QComboBox()
        self.proxy_kind_combo.addItem("OpenAI-compatible", None)
        for kind in SERVER_KINDS:
            if kind not in ("unknown", "openai"):
                self.proxy_kind_combo.addItem(kind_label(kind), kind)
        self.proxy_address = QLabel()
        self.proxy_copy_button = QPushButton("Copy")
        self.proxy_copy_button.clicked.connect(self.copy_proxy_address)
        address_row = QHBoxLayout()
        address_row.addWidget(self.proxy_address, 1)
        address_row.addWidget(self.proxy_copy_button)
        form.addRow(self.proxy_enabled_check)
        form.addRow("Listen on (host:port)", self.proxy_listen_edit)
        form.addRow("Server (upstream URL)", self.proxy_upstream_edit)
        form.addRow("Server kind", self.proxy_kind_combo)
        form.addRow("Clients use", address_row)
        form.addRow(QLabel("Listening beyond this machine needs allow_remote and a token: see the README."))
        for edit in (self.proxy_listen_edit, self.proxy_upstream_edit):
            edit.textEdited.connect(self._store_proxy)
        self.proxy_kind_combo.currentIndexChanged.connect(self._store_proxy)
        self.proxy_enabled_check.toggled.connect(self._store_proxy)
        layout.addWidget(self.proxy_box, 2)
        self._select_proxy(0 if self._proxies else -1)

    def proxies(self) -> tuple[ProxyConfig, ...]:
        """The proxies as the widgets show them."""
        return tuple(self._proxies)

    def _select_proxy(self, row: int) -> None:
        valid = 0 <= row < len(self._proxies)
        self.proxy_box.setEnabled(valid)
        self.proxy_remove_button.setEnabled(valid)
        self._loading = True
        proxy = self._proxies[row] if valid else ProxyConfig(listen="", upstream="", enabled=False)
        self.proxy_enabled_check.setChecked(proxy.enabled)
        self.proxy_listen_edit.setText(proxy.listen)
        self.proxy_upstream_edit.setText(proxy.upstream)
        self.proxy_kind_combo.setCurrentIndex(max(self.proxy_kind_combo.findData(proxy.kind), 0))
        self._loading = False
        self._show_proxy_address(proxy)
        if valid and self.proxy_list.currentRow() != row:
            self.proxy_list.setCurrentRow(row)

    def _show_proxy_address(self, proxy: ProxyConfig) -> None:
        ok = proxy.listen.rpartition(":")[2].isdigit()
        self.proxy_address.setText(proxy.client_url if ok else "(enter host:port)")
        self.proxy_copy_button.setEnabled(ok)

    def _store_proxy(self, *_args: object) -> None:
        row = self.proxy_list.currentRow()
        if self._loading or not 0 <= row < len(self._proxies):
            return
        proxy = replace(
            self._proxies[row],
            enabled=self.proxy_enabled_check.isChecked(),
            listen=self.proxy_listen_edit.text().strip(),
            upstream=self.proxy_upstream_edit.text().strip(),
            kind=self.proxy_kind_combo.currentData(),
        )
        self._proxies[row] = proxy
        self.proxy_list.item(row).setText(proxy_item(proxy))
        self._show_proxy_address(proxy)

    def add_proxy(
        self, listen: str = "", upstream: str = "http://127.0.0.1:11434", kind: str | None = "ollama"
    ) -> None:
        """A new proxy (by default in front of Ollama, on the first free port from 11435)."""
        if not listen:
            taken = {p.listen for p in self._proxies}
            listen = next(
                f"127.0.0.1:{port}" for port in range(11435, 65536) if f"127.0.0.1:{port}" not in taken
            )
        self._proxies.append(ProxyConfig(listen=listen, upstream=upstream, kind=kind))
        self.proxy_list.addItem(proxy_item(self._proxies[-1]))
        self._select_proxy(len(self._proxies) - 1)

    def remove_proxy(self) -> None:
        row = self.proxy_list.currentRow()
        if not 0 <= row < len(self._proxies):
            return
        del self._proxies[row]
        self.proxy_list.takeItem(row)
        self._select_proxy(min(row, len(self._proxies) - 1))

    def copy_proxy_address(self) -> None:
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None:
            clipboard.setText(self.proxy_address.text())
