"""The dashboard window: live decode tok/s against the ceiling, per-model cards, alerts.

Every snapshot goes into a bounded `History` (cheap, also while hidden); the
curves, cards and labels are only redrawn while the window is visible, and
once when it is shown again. Plots show what is true: gaps while idle (nan with
connect="finite"), polled rates (estimated) as a line, finished requests as
points (filled: exact server timings, hollow: estimated).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from urllib.parse import urlsplit

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from trayapp.core.glance import choose_model, format_pct, format_tokens, host_port, kind_label
from trayapp.core.history import History, ModelKey, expected_ceiling_curve
from trayapp.core.model import Alert, HardwareSnapshot, ModelStatus, ServerStatus, Snapshot
from trayapp.core.physics import REALISTIC_BAND

log = logging.getLogger("trayapp.dashboard")

READING_BAND_TOK_S = (5.0, 10.0)  # human reading speed
FLOOR_TOK_S = 3.0  # below this interactive use feels broken
WINDOW_S = 600.0
MIN_SPAN_S = 120.0  # the time axis shows at least this much, more as history grows (up to WINDOW_S)
RIGHT_PAD = 0.03  # room right of "now" so the newest points are not cut by the plot's edge
HEADROOM = 1.25  # y range above the data: the one-row legend sits there, clear of the curves
CONTEXT_HEADROOM = 1.4  # the same for the (shorter) context plot
GB = 1_000_000_000
# Series are re-set on each redraw anyway: no recomputing them on every view-range change (by default
# pyqtgraph re-filters each series whenever the y range moves, for its dynamic range limit).
STATIC_ITEM: dict[str, object] = {"dynamicRangeLimit": None}


def _ms(values: np.ndarray) -> np.ndarray:
    """tok/s → ms/token; nan where the rate is nan or not positive."""
    out = np.full(values.shape, np.nan)
    positive = np.isfinite(values) & (values > 0)
    np.divide(1000.0, values, out=out, where=positive)
    return out


def _finite_max(*arrays: np.ndarray) -> float | None:
    values = [float(a[np.isfinite(a)].max()) for a in arrays if a.size and np.isfinite(a).any()]
    return max(values) if values else None


def rate_text(tok_s: float) -> str:
    """A rate for the window, where there is room: '9.4', '42', '1,008' (the icon's '1k' is too coarse)."""
    return f"{max(tok_s, 0.0):.1f}" if tok_s < 9.95 else f"{tok_s:,.0f}"


def time_span_s(first_t_wall_s: float | None, now_s: float, window_s: float) -> float:
    """How much time the plot shows: the history there is, at least MIN_SPAN_S, at most the window."""
    seen = now_s - first_t_wall_s if first_t_wall_s is not None else 0.0
    return min(max(seen, MIN_SPAN_S), window_s)


def _legend(plot: pg.PlotWidget, columns: int) -> None:
    """A one-row legend at the top right on a dark, opaque-enough box (curves pass under it)."""
    plot.addLegend(
        offset=(-8, 4),
        colCount=columns,
        brush=pg.mkBrush(16, 16, 16, 215),
        pen=pg.mkPen(70, 70, 70),
        horSpacing=14,
    )


def _points(
    plot: pg.PlotWidget, name: str, size: float, brush: object, pen: object = None
) -> pg.PlotDataItem:
    """A scatter series; its look is also set on the scatter now, so the legend draws it right
    before the first data arrives (pyqtgraph copies symbol options only with data)."""
    item = plot.plot(
        name=name, pen=None, symbol="o", symbolSize=size, symbolBrush=brush, symbolPen=pen, **STATIC_ITEM
    )
    item.scatter.setSize(size)
    item.scatter.setBrush(pg.mkBrush(brush))
    item.scatter.setPen(pg.mkPen(pen))
    return item


class ModelCard(QFrame):
    """One loaded model: server, quantization, size, GPU/CPU share, context fill, prompt stats."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        self.title = QLabel()
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.PlainText)
        self.gpu_bar = QProgressBar()
        self.gpu_bar.setRange(0, 100)
        self.context_bar = QProgressBar()
        self.context_bar.setRange(0, 1000)
        self.stats = QLabel()
        for label in (self.title, self.details, self.stats):
            label.setContentsMargins(0, 0, 0, 2)  # room for underscores below the descent (Q4_K_M)
        for widget in (self.title, self.details, self.gpu_bar, self.context_bar, self.stats):
            layout.addWidget(widget)

    def update_model(self, server: ServerStatus, model: ModelStatus, no_gpu: bool = False) -> None:
        """Show `model`; `no_gpu`: this machine has no GPU and the server is local (all in RAM)."""
        self.title.setText(f"{model.name} · {model.phase}")
        self.title.setToolTip(server.url)
        details = [model.quantization or "quantization —"]
        if model.size_bytes is not None:
            details.append(f"{model.size_bytes / GB:.1f} GB")
        if model.parameter_count:
            details.append(f"{model.parameter_count / 1e9:.1f}B params")
        if model.bytes_per_token is not None:
            exact = "exact" if model.bytes_per_token_exact else "estimated"
            details.append(f"{model.bytes_per_token / GB:.2f} GB/token ({exact})")
        where = f"{kind_label(server.kind)} {host_port(server.url)}"
        self.details.setText(where + "\n" + " · ".join(details))
        if model.gpu_fraction is None and no_gpu:
            self.gpu_bar.setValue(0)
            self.gpu_bar.setFormat("no GPU · in system RAM")
        elif model.gpu_fraction is None:
            self.gpu_bar.setValue(0)
            self.gpu_bar.setFormat("GPU share unknown")
        else:
            gpu = min(max(model.gpu_fraction, 0.0), 1.0)
            self.gpu_bar.setValue(round(gpu * 100))
            cpu = f" · CPU {format_pct(1 - gpu)} ⚠" if gpu < 0.98 else ""
            self.gpu_bar.setFormat(f"GPU {format_pct(gpu)}{cpu}")
        if model.context_length and model.context_tokens is not None:
            fill = min(model.context_tokens / model.context_length, 1.0)
            self.context_bar.setValue(round(fill * 1000))
            tokens = f"{format_tokens(model.context_tokens)}/{format_tokens(model.context_length)}"
            self.context_bar.setFormat(f"context {tokens} ({format_pct(fill)})")
        else:
            self.context_bar.setValue(0)
            size = format_tokens(model.context_length) if model.context_length else "—"
            self.context_bar.setFormat(f"context —/{size}")
        stats = [ttft_text(model)]
        stats.append(
            f"prompt {model.prompt_tok_s:,.0f} tok/s" if model.prompt_tok_s is not None else "prompt —"
        )
        if model.draft_acceptance is not None:
            stats.append(f"draft acceptance {format_pct(model.draft_acceptance)}")
        if model.ceiling_tok_s is not None:
            stats.append(f"ceiling {rate_text(model.ceiling_tok_s)} tok/s")
        if model.live_rate_reason:
            stats.append(f"live rate unavailable: {model.live_rate_reason}")
        self.stats.setText(" · ".join(stats))


class Dashboard(QWidget):
    """The live window. `update_snapshot` is cheap while hidden; drawing happens only when visible."""

    redrawn = Signal(dict)  # {"model": name | None, "points": finite decode points, "total": all points}
    alert_selected = Signal(str)

    def __init__(
        self, kv_type: str = "f16", window_s: float = WINDOW_S, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("llm-tray")
        self.resize(980, 760)
        self.kv_type = kv_type
        self.window_s = window_s
        self.history = History(window_s=window_s)
        self.snapshot: Snapshot | None = None
        self.redraw_count = 0
        self.ms_per_token = False
        self._dirty = False
        self._auto_key: ModelKey | None = None
        self._combo_keys: list[ModelKey] = []
        self._alerts: OrderedDict[str, Alert] = OrderedDict()
        self._alert_rows: list[tuple[str, str, str]] = []  # what the alert list shows now
        self._plot_texts: dict[tuple[int, str], str] = {}
        self.cards: dict[ModelKey, ModelCard] = {}
        self._build()

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

        splitter = QSplitter(Qt.Orientation.Vertical)
        root.addWidget(splitter, 1)
        self.time_plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem()})
        self.time_plot.setTitle("decode tok/s, last 10 min")
        self.time_plot.setMouseEnabled(x=False, y=True)
        # No grid: with its minor lines it was most of the cost of each repaint (~60 %); the ceiling,
        # band and floor lines are the references that matter here.
        _legend(self.time_plot, 3)
        # No clip-to-view / downsampling: History holds at most 1,800 points, cheap to draw, and
        # with them every scroll of the time axis recomputed every series.
        self.reading_band = pg.LinearRegionItem(
            READING_BAND_TOK_S,
            orientation="horizontal",
            movable=False,
            brush=pg.mkBrush(90, 160, 255, 35),
            pen=pg.mkPen(None),
        )
        self.realistic_band = pg.LinearRegionItem(
            (0, 0),
            orientation="horizontal",
            movable=False,
            brush=pg.mkBrush(80, 200, 120, 45),
            pen=pg.mkPen(None),
        )
        self.realistic_band.hide()
        pg.InfLineLabel(
            self.reading_band.lines[1],
            "reading speed 5–10",
            position=0.01,
            anchors=[(0, 1), (0, 1)],
            color=(150, 190, 255),
        )
        self.realistic_label = pg.InfLineLabel(
            self.realistic_band.lines[1],
            "realistic 60–75 %",
            position=0.01,
            anchors=[(0, 1), (0, 1)],
            color=(120, 210, 140),
        )
        self.realistic_label.setText("realistic 60–75 %")  # made while its band is hidden: no text yet
        self.floor_line = pg.InfiniteLine(
            FLOOR_TOK_S,
            angle=0,
            movable=False,
            pen=pg.mkPen((220, 80, 80), style=Qt.PenStyle.DotLine),
            label="floor 3",  # right end: at the left it would overlap "reading speed" on a big y scale
            labelOpts={"position": 0.99, "color": (220, 120, 120), "anchors": [(1, 1), (1, 1)]},
        )
        self.ceiling_line = pg.InfiniteLine(
            0,
            angle=0,
            movable=False,
            pen=pg.mkPen((230, 230, 230), width=1.5),
            label="ceiling {value:.0f}",
            labelOpts={"position": 0.01, "color": (230, 230, 230), "anchors": [(0, 1), (0, 1)]},
        )
        self.ceiling_line.hide()
        for band in (self.reading_band, self.realistic_band, self.floor_line, self.ceiling_line):
            self.time_plot.addItem(band, ignoreBounds=True)
        self.decode_curve = self.time_plot.plot(
            name="polled (estimated)", connect="finite", pen=pg.mkPen((255, 190, 60), width=2), **STATIC_ITEM
        )
        self.exact_points = _points(self.time_plot, "finished request (exact)", 7, (255, 255, 255))
        self.estimated_points = _points(
            self.time_plot, "finished request (estimated)", 7, None, pg.mkPen((255, 255, 255), width=1.5)
        )
        splitter.addWidget(self.time_plot)

        lower = QWidget()
        lower_layout = QHBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        self.context_plot = pg.PlotWidget()
        self.context_plot.setTitle("tok/s vs context depth")
        self.context_plot.setLabel("bottom", "context tokens")
        _legend(self.context_plot, 3)
        self.expected_curve = self.context_plot.plot(
            name="ceiling (KV model)",
            pen=pg.mkPen((200, 200, 200), width=1.5, style=Qt.PenStyle.DashLine),
            **STATIC_ITEM,
        )
        self.context_points = _points(self.context_plot, "polled", 5, (255, 190, 60, 190))
        self.context_exact_points = _points(self.context_plot, "finished requests", 7, (255, 255, 255))
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

        self.alert_list = QListWidget()
        self.alert_list.setWordWrap(True)
        self.alert_list.setMinimumHeight(60)
        self.alert_list.itemActivated.connect(
            lambda it: self.alert_selected.emit(it.data(Qt.ItemDataRole.UserRole))
        )
        splitter.addWidget(self.alert_list)
        splitter.setSizes([360, 240, 120])

        footer = QGridLayout()
        self.hardware_label = QLabel("hardware —")
        self.hardware_label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        footer.addWidget(self.hardware_label, 0, 0)
        root.addLayout(footer)

    # ------------------------------------------------------------------ public API

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Record the snapshot; redraw only if the window is visible."""
        self.snapshot = snapshot
        self.history.add(snapshot)
        for alert in snapshot.alerts + snapshot.ended_alerts:
            self._alerts[alert.id] = alert
            self._alerts.move_to_end(alert.id)
        while len(self._alerts) > 50:
            self._alerts.popitem(last=False)
        if self.isVisible():
            self.redraw()
        else:
            self._dirty = True

    def set_banner(self, text: str | None) -> None:
        self.banner.setText(text or "")
        self.banner.setVisible(bool(text))

    def set_kv_type(self, kv_type: str) -> None:
        self.kv_type = kv_type

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
        self._redraw_alerts()
        for row in range(self.alert_list.count()):
            item = self.alert_list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == alert_id:
                self.alert_list.setCurrentItem(item)
                self.alert_list.scrollToItem(item)
                self.alert_list.setFocus()
                return True
        return False

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
        points, total = self._redraw_time_plot(key, current[1] if current else None)
        self._redraw_context_plot(key, current[1] if current else None)
        self._redraw_header(current)
        self._redraw_cards()
        self._redraw_alerts()
        if snapshot is not None:
            self.hardware_label.setText(hardware_line(snapshot.hardware))
        for plot in (self.time_plot, self.context_plot):
            # Apply the new view ranges now: left to the paint, they would schedule a second paint.
            plot.getViewBox().updateMatrix()
        self.redrawn.emit({"model": key[1] if key else None, "points": points, "total": total})

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
            self.model_combo.addItem(f"{kind_label(kinds.get(url, 'unknown'))} {host_port(url)} ▸ {name}")
        self._combo_keys = keys
        self.model_combo.setCurrentIndex(keys.index(selected) + 1 if selected in keys else 0)
        self.model_combo.blockSignals(False)

    def _set_text(self, plot: pg.PlotWidget, where: str, text: str) -> None:
        """Set a plot's title or axis label only when it changes (each set re-lays out rich text)."""
        if self._plot_texts.get((id(plot), where)) == text:
            return
        self._plot_texts[(id(plot), where)] = text
        if where == "title":
            plot.setTitle(text)
        else:
            plot.setLabel(where, text)

    def _y(self, values: np.ndarray) -> np.ndarray:
        return _ms(values) if self.ms_per_token else values

    def _redraw_time_plot(self, key: ModelKey | None, model: ModelStatus | None) -> tuple[int, int]:
        unit = "ms/token" if self.ms_per_token else "tok/s"
        self._set_text(self.time_plot, "left", unit)
        if key is None:
            self._set_text(self.time_plot, "title", f"decode {unit}")
            for curve in (self.decode_curve, self.exact_points, self.estimated_points):
                curve.setData([], [])
            self.ceiling_line.hide()
            self.realistic_band.hide()
            return 0, 0
        arrays = self.history.arrays(key)
        y = self._y(arrays.decode_tok_s)
        self.decode_curve.setData(arrays.t_wall_s, y, connect="finite")
        request_y = self._y(arrays.request_tok_s)
        exact = arrays.request_exact
        self.exact_points.setData(arrays.request_t_wall_s[exact], request_y[exact])
        self.estimated_points.setData(arrays.request_t_wall_s[~exact], request_y[~exact])

        ceiling = model.ceiling_tok_s if model is not None else None
        if ceiling is None:
            finite = arrays.ceiling_tok_s[np.isfinite(arrays.ceiling_tok_s)]
            ceiling = float(finite[-1]) if finite.size else None
        if ceiling:
            # Shown before they move: a pyqtgraph line label ignores moves while hidden (stale text).
            self.ceiling_line.show()
            self.realistic_band.show()
            low, high = ceiling * REALISTIC_BAND[0], ceiling * REALISTIC_BAND[1]
            if self.ms_per_token:
                self.ceiling_line.setValue(1000 / ceiling)
                self.realistic_band.setRegion((1000 / high, 1000 / low))
            else:
                self.ceiling_line.setValue(ceiling)
                self.realistic_band.setRegion((low, high))
            self.ceiling_line.label.setFormat(
                "fastest {value:.1f} ms/token" if self.ms_per_token else "ceiling {value:.0f}"
            )
        else:
            self.ceiling_line.hide()
            self.realistic_band.hide()
        if self.ms_per_token:
            self.reading_band.setRegion((1000 / READING_BAND_TOK_S[1], 1000 / READING_BAND_TOK_S[0]))
            self.floor_line.setValue(1000 / FLOOR_TOK_S)
            self.floor_line.label.setFormat("floor 333 ms")
        else:
            self.reading_band.setRegion(READING_BAND_TOK_S)
            self.floor_line.setValue(FLOOR_TOK_S)
            self.floor_line.label.setFormat("floor 3")

        now = self.history.latest_t_wall_s or 0.0
        starts = [float(a[0]) for a in (arrays.t_wall_s, arrays.request_t_wall_s) if a.size]
        span = time_span_s(min(starts) if starts else None, now, self.window_s)
        self._set_text(self.time_plot, "title", f"decode {unit}, last {span / 60:.0f} min")
        self.time_plot.setXRange(now - span, now + span * RIGHT_PAD, padding=0)
        top = _finite_max(y, request_y)
        if self.ms_per_token:  # zoom on the data: a fast model's 2 ms/token must not sit flat on 0
            fastest = 1000 / ceiling if ceiling else 0.0
            limit = max(top or 0.0, fastest) * HEADROOM or 1000 / FLOOR_TOK_S * HEADROOM
        else:
            limit = max(top or 0.0, ceiling or 0.0, READING_BAND_TOK_S[1]) * HEADROOM
        self.time_plot.setYRange(0, limit, padding=0)
        return int(np.isfinite(arrays.decode_tok_s).sum()), len(arrays.decode_tok_s)

    def _redraw_context_plot(self, key: ModelKey | None, model: ModelStatus | None) -> None:
        self._set_text(self.context_plot, "left", "ms/token" if self.ms_per_token else "tok/s")
        if key is None:
            for item in (self.expected_curve, self.context_points, self.context_exact_points):
                item.setData([], [])
            return
        arrays = self.history.arrays(key)
        polled = np.isfinite(arrays.decode_tok_s) & np.isfinite(arrays.context_tokens)
        self.context_points.setData(arrays.context_tokens[polled], self._y(arrays.decode_tok_s[polled]))
        done = np.isfinite(arrays.request_context_tokens)
        self.context_exact_points.setData(
            arrays.request_context_tokens[done], self._y(arrays.request_tok_s[done])
        )
        curve: Sequence[tuple[float, float]] = []
        if model is not None:
            seen = arrays.context_tokens[np.isfinite(arrays.context_tokens)]
            deepest = float(seen.max()) if seen.size else 0.0
            limit = model.context_length or int(deepest * 1.25) or 8192
            curve = [(float(c), r) for c, r in expected_ceiling_curve(model, int(limit), self.kv_type)]
        if not curve:
            curve = self.history.ceiling_points(key)  # no model facts: the ceilings seen at each depth
        xs = np.array([c for c, _ in curve], dtype=float)
        ys = self._y(np.array([r for _, r in curve], dtype=float))
        self.expected_curve.setData(xs, ys)
        top = _finite_max(ys, self._y(arrays.decode_tok_s[polled]), self._y(arrays.request_tok_s[done]))
        self.context_plot.setYRange(0, (top or READING_BAND_TOK_S[1]) * CONTEXT_HEADROOM, padding=0)

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
        if rate is None:
            self.rate_label.setText(model.phase)
        elif self.ms_per_token and rate > 0:
            self.rate_label.setText(f"{1000 / rate:.1f} ms/token")
        else:
            self.rate_label.setText(f"{rate_text(rate)} tok/s")
        if model.ceiling_tok_s:
            share = f"{format_pct(rate / model.ceiling_tok_s)} of " if rate is not None else ""
            self.share_label.setText(f"{share}{rate_text(model.ceiling_tok_s)} tok/s ceiling")
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
            card.update_model(server, model, no_gpu=no_gpu and _is_local(server.url))

    def _redraw_alerts(self) -> None:
        """Rebuild the alert list, only when what it shows changed (word-wrapped text is costly)."""
        active = {a.id for a in (self.snapshot.alerts if self.snapshot else ())}
        alerts = sorted(self._alerts.values(), key=lambda a: (a.id not in active, -a.since_wall_s))
        rows = [
            (alert.id, alert_text(alert, ended=alert.id not in active), evidence_text(alert))
            for alert in alerts
        ]
        if rows == self._alert_rows and self.alert_list.count():
            return
        self._alert_rows = rows
        selected = self.alert_list.currentItem()
        selected_id = selected.data(Qt.ItemDataRole.UserRole) if selected is not None else None
        self.alert_list.clear()
        for alert_id, text, tooltip in rows:
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, alert_id)
            if tooltip:
                item.setToolTip(tooltip)
            self.alert_list.addItem(item)
            if alert_id == selected_id:
                self.alert_list.setCurrentItem(item)
        if not rows:
            placeholder = QListWidgetItem("No alerts: nothing is slowing your models down right now.")
            placeholder.setFlags(Qt.ItemFlag.NoItemFlags)
            self.alert_list.addItem(placeholder)


def _is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def ttft_text(model: ModelStatus) -> str:
    """Time to first token; "~" marks an estimate (prompt tokens ÷ the server's prompt speed)."""
    if model.ttft_s is None:
        return "TTFT —"
    approx = "~" if model.ttft_exact is False else ""
    return f"TTFT {approx}{model.ttft_s:.2f} s"


def evidence_text(alert: Alert) -> str:
    return "\n".join(f"{k}: {v}" for k, v in alert.evidence.items()) if alert.evidence else ""


def alert_text(alert: Alert, ended: bool = False) -> str:
    # Glyphs present in common UI fonts (DejaVu, Segoe UI, SF): a missing one renders as a box.
    mark = "✓ ended · " if ended else ("✖ " if alert.severity == "critical" else "⚠ ")
    lines = [f"{mark}{alert.message}"]
    if alert.cause and alert.cause not in alert.message:
        lines.append(f"    Cause: {alert.cause}")
    lines.append(f"    Fix: {alert.fix}")
    return "\n".join(lines)


def hardware_line(hardware: HardwareSnapshot) -> str:
    parts = []
    for gpu in hardware.gpus:
        text = f"GPU {gpu.name}"
        if gpu.vram_used_bytes is not None and gpu.vram_total_bytes:
            text += f" · {gpu.vram_used_bytes / GB:.1f}/{gpu.vram_total_bytes / GB:.0f} GB"
        if gpu.util_gpu_pct is not None:
            text += f" · {gpu.util_gpu_pct:.0f} % busy"
        if gpu.temperature_c is not None:
            text += f" · {gpu.temperature_c:.0f} °C"
        if gpu.throttle_reasons:
            text += " · throttled: " + ", ".join(gpu.throttle_reasons)
        parts.append(text)
    if not hardware.gpus:
        parts.append(f"GPU — ({hardware.gpu_reason})" if hardware.gpu_reason else "GPU —")
    host = hardware.host
    if host.ram_total_bytes and host.ram_available_bytes is not None:
        used = host.ram_total_bytes - host.ram_available_bytes
        parts.append(f"RAM {used / GB:.1f}/{host.ram_total_bytes / GB:.0f} GB")
    else:
        parts.append("RAM —")
    return "      ".join(parts)
