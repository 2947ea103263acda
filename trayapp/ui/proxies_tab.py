"""The settings dialog's Proxies tab: the recording proxies to run, each with its listen address,
upstream and kind, and the address clients use (with a Copy button).

Pure widgets: nothing here touches the network; the dialog reads `proxies()` when it saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from trayapp.config.settings import ProxyConfig
from trayapp.core.server_kinds import USER_SERVER_KINDS, server_label
from trayapp.ui.list_editor import ListEditor

DEFAULT_UPSTREAM = "http://127.0.0.1:11434"  # a new proxy stands in front of Ollama


def proxy_item(proxy: ProxyConfig) -> str:
    """The list's line: '127.0.0.1:11435 → http://127.0.0.1:11434' (marked when turned off)."""
    return f"{proxy.listen or '?'} → {proxy.upstream or '?'}{'' if proxy.enabled else '  (off)'}"


class ProxiesTab(ListEditor[ProxyConfig]):
    """The list of proxies on the left, the selected one's fields on the right."""

    def __init__(self, proxies: Sequence[ProxyConfig], parent: QWidget | None = None) -> None:
        super().__init__(
            proxies,
            caption="Recording proxies: exact numbers for every request sent through them",
            title="Proxy",
            blank=ProxyConfig(listen="", upstream="", enabled=False),
            item_text=proxy_item,
            fill_form=self._fill_form_fields,
            read_form=self._read_form_fields,
            new_item=self._new_proxy,
            parent=parent,
        )
        form = self.form
        self.proxy_enabled_check = QCheckBox("Run this proxy")
        self.proxy_listen_edit = QLineEdit()
        self.proxy_listen_edit.setPlaceholderText("127.0.0.1:11435")
        self.proxy_upstream_edit = QLineEdit()
        self.proxy_upstream_edit.setPlaceholderText(DEFAULT_UPSTREAM)
        self.proxy_kind_combo = QComboBox()
        self.proxy_kind_combo.addItem("OpenAI-compatible", None)
        for kind in USER_SERVER_KINDS:
            if kind != "openai":  # the first item above
                self.proxy_kind_combo.addItem(server_label(kind), kind)
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
            edit.textEdited.connect(self._store)
        self.proxy_kind_combo.currentIndexChanged.connect(self._store)
        self.proxy_enabled_check.toggled.connect(self._store)
        self.select(0 if self.items else -1)

    def proxies(self) -> tuple[ProxyConfig, ...]:
        """The proxies as the widgets show them."""
        return tuple(self.items)

    def _fill_form_fields(self, proxy: ProxyConfig) -> None:
        self.proxy_enabled_check.setChecked(proxy.enabled)
        self.proxy_listen_edit.setText(proxy.listen)
        self.proxy_upstream_edit.setText(proxy.upstream)
        self.proxy_kind_combo.setCurrentIndex(max(self.proxy_kind_combo.findData(proxy.kind), 0))
        self._show_proxy_address(proxy)

    def _read_form_fields(self, proxy: ProxyConfig) -> ProxyConfig:
        return replace(
            proxy,
            enabled=self.proxy_enabled_check.isChecked(),
            listen=self.proxy_listen_edit.text().strip(),
            upstream=self.proxy_upstream_edit.text().strip(),
            kind=self.proxy_kind_combo.currentData(),
        )

    def _store(self, *_signal_args: object) -> None:
        proxy = self.store_form()
        if proxy is not None:
            self._show_proxy_address(proxy)

    def _show_proxy_address(self, proxy: ProxyConfig) -> None:
        ok = proxy.listen.rpartition(":")[2].isdigit()
        self.proxy_address.setText(proxy.client_url if ok else "(enter host:port)")
        self.proxy_copy_button.setEnabled(ok)

    def _new_proxy(
        self, listen: str = "", upstream: str = DEFAULT_UPSTREAM, kind: str | None = "ollama"
    ) -> ProxyConfig:
        """A proxy (by default in front of Ollama, on the first free port from 11435)."""
        if not listen:
            taken = {p.listen for p in self.items}
            listen = next(
                f"127.0.0.1:{port}" for port in range(11435, 65536) if f"127.0.0.1:{port}" not in taken
            )
        return ProxyConfig(listen=listen, upstream=upstream, kind=kind)

    def add_proxy(
        self, listen: str = "", upstream: str = DEFAULT_UPSTREAM, kind: str | None = "ollama"
    ) -> None:
        self.add(self._new_proxy(listen, upstream, kind))

    def remove_proxy(self) -> None:
        self.remove()

    def copy_proxy_address(self) -> None:
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None:
            clipboard.setText(self.proxy_address.text())
