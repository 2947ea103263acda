"""The dashboard window: live decode tok/s against the ceiling, per-model cards, alerts.

Every snapshot goes into a bounded `History` (cheap, also while hidden); the
plots, cards and labels are only redrawn while the window is visible, and
once when it is shown again.
"""

from __future__ import annotations

import logging
from collections import deque

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from trayapp.core.client_usage import UNNAMED, client_summary, client_usage, usage_row
from trayapp.core.energy_summary import energy_line
from trayapp.core.glance import choose_model, host_port, prefill_line
from trayapp.core.history import History
from trayapp.core.loopback import is_this_machine_url
from trayapp.core.machine import ram_bandwidth_change_line
from trayapp.core.model import ModelKey, ModelStatus, RequestRecord, ServerStatus, Snapshot
from trayapp.core.server_kinds import server_label
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import estimate_mark, format_pct, format_rate, format_rate_marked
from trayapp.ui.dashboard.alerts import AlertsPanel
from trayapp.ui.dashboard.cards import ModelCard, hardware_line, ttft_text
from trayapp.ui.dashboard.context_plot import RateContextPlot
from trayapp.ui.dashboard.empty_state import EmptyState
from trayapp.ui.dashboard.time_plot import RateTimePlot

log = logging.getLogger(__name__)

WINDOW_S = 600.0
MAX_CLIENT_REQUESTS = 2000  # finished requests kept for the clients line (the window's, at most)


class Dashboard(QWidget):
    """The live window. `update_snapshot` is cheap while hidden; drawing happens only when visible."""

    redrawn = Signal(dict)  # {"model": name | None, "points": finite decode points, "total": all points}
    alert_selected = Signal(str)

    def __init__(
        self,
        kv_type: str = "f16",
        window_s: float = WINDOW_S,
        thresholds: Thresholds | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("llm-tray")
        self.resize(980, 760)
        self.kv_type = kv_type
        self.window_s = window_s
        self.thresholds = thresholds or Thresholds()
        self.history = History(window_s=window_s)
        self.snapshot: Snapshot | None = None
        self.redraw_count = 0
        self.ms_per_token = False
        self._dirty = False
        self._auto_key: ModelKey | None = None
        self._combo_keys: list[ModelKey] = []
        self.cards: dict[ModelKey, ModelCard] = {}
        self._requests: deque[RequestRecord] = deque(maxlen=MAX_CLIENT_REQUESTS)  # for the clients line
        self._build()
        self.time_plot.set_floor_tok_s(self.thresholds.below_floor_tok_s)

    # ------------------------------------------------------------------ layout

    def _build(self) -> None:
        root = QVBoxLayout(self)
        self.banner = QLabel()
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background: #fff3cd; color: #5c4400; padding: 6px; border-radius: 4px;")
        self.banner.hide()
        root.addWidget(self.banner)

        header = QHBoxLayout()
        self.model_combo = QComboBox()
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.model_combo.addItem("Follow the active model")
        self.model_combo.currentIndexChanged.connect(lambda _i: self.redraw())
        self.rate_label = QLabel("—")
        font = self.rate_label.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.rate_label.setFont(font)
        self.share_label = QLabel()
        self.ttft_label = QLabel()
        self.ms_toggle = QCheckBox("ms/token")
        self.ms_toggle.setToolTip("Show time per token: the honest view of stutter")
        self.ms_toggle.toggled.connect(self.set_ms_per_token)
        for widget in (self.model_combo, self.rate_label, self.share_label, self.ttft_label):
            header.addWidget(widget)
        header.addStretch(1)
        header.addWidget(self.ms_toggle)
        root.addLayout(header)
        self.empty_state = EmptyState()  # first run: no server answers
        root.addWidget(self.empty_state)

        splitter = QSplitter(Qt.Orientation.Vertical)
        root.addWidget(splitter, 1)
        self.time_plot = RateTimePlot(self.window_s)
        splitter.addWidget(self.time_plot)

        lower = QWidget()
        lower_layout = QHBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        self.context_plot = RateContextPlot()
        lower_layout.addWidget(self.context_plot, 3)
        cards_scroll = QScrollArea()
        cards_scroll.setWidgetResizable(True)
        cards_host = QWidget()
        self.cards_layout = QVBoxLayout(cards_host)
        self.cards_layout.setSizeConstraint(QLayout.SizeConstraint.SetMinimumSize)  # scroll, never squeeze
        self.cards_layout.addStretch(1)
        cards_scroll.setWidget(cards_host)
        lower_layout.addWidget(cards_scroll, 2)
        splitter.addWidget(lower)

        self.alert_list = AlertsPanel()
        self.alert_list.alert_selected.connect(self.alert_selected)
        splitter.addWidget(self.alert_list)
        splitter.setSizes([360, 240, 120])

        footer = QGridLayout()
        self.hardware_label = QLabel("hardware —")
        self.hardware_label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        footer.addWidget(self.hardware_label, 0, 0)
        self.ram_change_label = QLabel()  # "ceiling changed 28.4 → 31.3 GB/s RAM at 14:02 UTC: …"
        self.ram_change_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.ram_change_label.hide()
        footer.addWidget(self.ram_change_label, 1, 0)
        self.clients_label = QLabel()  # "Clients, last 10 min: aider: 12 requests, … · code: …"
        self.clients_label.setWordWrap(True)
        self.clients_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.clients_label.hide()
        footer.addWidget(self.clients_label, 2, 0)
        root.addLayout(footer)

    # ------------------------------------------------------------------ public API

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Record the snapshot; redraw only if the window is visible."""
        self.snapshot = snapshot
        self.history.add(snapshot)
        self._requests.extend(snapshot.requests)
        self.alert_list.remember(snapshot)
        if self.isVisible():
            self.redraw()
        else:
            self._dirty = True

    def set_banner(self, text: str | None) -> None:
        self.banner.setText(text or "")
        self.banner.setVisible(bool(text))

    def set_kv_type(self, kv_type: str) -> None:
        self.kv_type = kv_type

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """The user's thresholds (the floor line, the offload mark), applied at once."""
        self.thresholds = thresholds
        self.time_plot.set_floor_tok_s(thresholds.below_floor_tok_s)
        self.redraw()

    def set_ms_per_token(self, on: bool) -> None:
        if on != self.ms_per_token:
            self.ms_per_token = on
            if self.ms_toggle.isChecked() != on:
                self.ms_toggle.setChecked(on)
            self.redraw()

    def show_and_raise(self) -> None:
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def focus_alert(self, alert_id: str) -> bool:
        """Bring the window forward with that alert selected; False if the alert is unknown."""
        self.show_and_raise()
        return self.alert_list.select_alert(alert_id)

    def selected_key(self) -> ModelKey | None:
        """The model on show: the one picked in the selector, or the active one."""
        index = self.model_combo.currentIndex()
        if index <= 0 or index > len(self._combo_keys):
            return self._auto_key
        return self._combo_keys[index - 1]

    def select_model(self, key: ModelKey | None) -> None:
        """Pin the selector to a model (None: follow the active model)."""
        self.model_combo.setCurrentIndex(self._combo_keys.index(key) + 1 if key in self._combo_keys else 0)

    # ------------------------------------------------------------------ drawing

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._dirty or self.redraw_count == 0:
            self.redraw()

    def redraw(self) -> None:
        if not self.isVisible():
            self._dirty = True
            return
        self._dirty = False
        self.redraw_count += 1
        snapshot = self.snapshot
        if snapshot is not None:
            chosen = choose_model(snapshot, self._auto_key)
            self._auto_key = (chosen[0].url, chosen[1].name) if chosen else self._auto_key
            self._update_combo(snapshot)
        key = self.selected_key()
        current = self._find(key)
        model = current[1] if current else None
        for plot in (self.time_plot, self.context_plot):
            plot.ms_per_token = self.ms_per_token
        if key is None:
            self.time_plot.clear_model()
            self.context_plot.clear_model()
            points, total = 0, 0
        else:
            arrays = self.history.arrays(key)
            ceiling = model.ceiling_tok_s if model is not None else None
            now_s = self.history.latest_t_wall_s or 0.0
            calibration = model.calibrated_efficiency if model is not None else None
            bench = model.bench_decode_tok_s if model is not None else None
            peers = model.peer_band if model is not None else None
            points, total = self.time_plot.show_model(arrays, ceiling, now_s, calibration, bench, peers)
            self.context_plot.show_model(arrays, model, self.kv_type, self.history.ceiling_points(key))
        self._redraw_header(current)
        self.empty_state.update_snapshot(snapshot)
        self._redraw_cards()
        self.alert_list.redraw()
        if snapshot is not None:
            energy = energy_line(snapshot.energy)
            self.hardware_label.setText(hardware_line(snapshot.hardware) + (f"\n{energy}" if energy else ""))
            change = snapshot.hardware.host.ram_bandwidth_change
            changed = ram_bandwidth_change_line(change, snapshot.t_wall_s)
            self.ram_change_label.setText(changed or "")
            self.ram_change_label.setVisible(changed is not None)
            clients = self.clients_line(snapshot.t_wall_s)
            self.clients_label.setText(clients or "")
            self.clients_label.setVisible(clients is not None)
        for plot in (self.time_plot, self.context_plot):
            plot.apply_ranges()
        self.redrawn.emit({"model": key[1] if key else None, "points": points, "total": total})

    def clients_line(self, now_wall_s: float) -> str | None:
        """Who used the servers in the window (the proxy names them), or None when no proxy did."""
        since = now_wall_s - self.window_s
        recent = [usage_row(r) for r in self._requests if r.finished_wall_s >= since]
        usage = [u for u in client_usage(recent) if u.client != UNNAMED]
        if not usage:
            return None
        minutes = round(self.window_s / 60)
        return f"Clients, last {minutes} min: " + " · ".join(client_summary(u) for u in usage)

    def _find(self, key: ModelKey | None) -> tuple[ServerStatus, ModelStatus] | None:
        if self.snapshot is None or key is None:
            return None
        for server, model in self.snapshot.models():
            if (server.url, model.name) == key:
                return server, model
        return None

    def _update_combo(self, snapshot: Snapshot) -> None:
        keys = [(s.url, m.name) for s, m in snapshot.models()]
        keys += [key for key in self.history.model_keys() if key not in keys]
        if keys == self._combo_keys:
            return
        index = self.model_combo.currentIndex()
        selected = self._combo_keys[index - 1] if index > 0 else None
        self.model_combo.blockSignals(True)
        while self.model_combo.count() > 1:
            self.model_combo.removeItem(1)
        kinds = {s.url: s.kind for s in snapshot.servers}
        for url, name in keys:
            self.model_combo.addItem(f"{server_label(kinds.get(url, 'unknown'))} {host_port(url)} ▸ {name}")
        self._combo_keys = keys
        self.model_combo.setCurrentIndex(keys.index(selected) + 1 if selected in keys else 0)
        self.model_combo.blockSignals(False)

    def _redraw_header(self, current: tuple[ServerStatus, ModelStatus] | None) -> None:
        if current is None:
            self.rate_label.setText("—")
            self.share_label.setText(
                "no model selected" if self.snapshot else "waiting for the first reading…"
            )
            self.ttft_label.setText("")
            return
        _server, model = current
        rate = model.decode_tok_s if model.phase == "decoding" else None
        if model.phase == "prefill":
            self.rate_label.setText(prefill_line(model))  # the tooltip's words: tokens so far, speed
        elif rate is None:
            self.rate_label.setText(model.phase)
        elif self.ms_per_token and rate > 0:
            self.rate_label.setText(f"{estimate_mark(model.decode_exact)}{1000 / rate:.1f} ms/token")
        else:
            self.rate_label.setText(format_rate_marked(rate, model.decode_exact))
        if model.ceiling_tok_s:
            share = f"{format_pct(rate / model.ceiling_tok_s)} of " if rate is not None else ""
            self.share_label.setText(f"{share}{format_rate(model.ceiling_tok_s)} tok/s ceiling")
        else:
            self.share_label.setText("ceiling unknown")
        self.ttft_label.setText(ttft_text(model))

    def _redraw_cards(self) -> None:
        if self.snapshot is None:
            return
        pairs = self.snapshot.models()
        no_gpu = not self.snapshot.hardware.gpus
        keys = [(s.url, m.name) for s, m in pairs]
        for key in list(self.cards):
            if key not in keys:
                gone = self.cards.pop(key)
                self.cards_layout.removeWidget(gone)
                gone.deleteLater()
        for server, model in pairs:
            key = (server.url, model.name)
            card = self.cards.get(key)
            if card is None:
                card = ModelCard()
                self.cards[key] = card
                self.cards_layout.insertWidget(self.cards_layout.count() - 1, card)
            card.update_model(
                server,
                model,
                no_gpu=no_gpu and is_this_machine_url(server.url),
                offload_gpu_fraction=self.thresholds.offload_gpu_fraction,
            )
