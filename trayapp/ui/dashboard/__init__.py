"""The dashboard window (`Dashboard`) and its parts: the rate-vs-time and rate-vs-context plots,
the model cards and the alerts panel.

The parts (pyqtgraph, numpy, `core.history`) load only when first used: the names below are
resolved on first access (PEP 562), and the tray app holds a `LazyDashboard`, which keeps the
snapshots a hidden dashboard is fed (plain Python, bounded like the window's `History`) and
builds the real window, replaying them, when it is first opened. A tray that is never opened
never pays for the plotting stack.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict, deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from trayapp.core.model import Alert, Snapshot
from trayapp.core.thresholds import Thresholds

if TYPE_CHECKING:
    from trayapp.ui.dashboard.alerts import AlertsPanel, alert_text, evidence_text
    from trayapp.ui.dashboard.cards import ModelCard, hardware_line, ttft_text
    from trayapp.ui.dashboard.context_plot import RateContextPlot
    from trayapp.ui.dashboard.time_plot import RateTimePlot, floor_label, time_span_s
    from trayapp.ui.dashboard.window import WINDOW_S, Dashboard

__all__ = [
    "HIDDEN_WINDOW_S",
    "MAX_HIDDEN_SNAPSHOTS",
    "WINDOW_S",
    "AlertsPanel",
    "Dashboard",
    "LazyDashboard",
    "ModelCard",
    "RateContextPlot",
    "RateTimePlot",
    "alert_text",
    "evidence_text",
    "floor_label",
    "hardware_line",
    "time_span_s",
    "ttft_text",
]

_LAZY = {
    "WINDOW_S": "window",
    "Dashboard": "window",
    "AlertsPanel": "alerts",
    "alert_text": "alerts",
    "evidence_text": "alerts",
    "ModelCard": "cards",
    "hardware_line": "cards",
    "ttft_text": "cards",
    "RateContextPlot": "context_plot",
    "RateTimePlot": "time_plot",
    "floor_label": "time_plot",
    "time_span_s": "time_plot",
}

HIDDEN_WINDOW_S = 600.0  # the window's WINDOW_S (a test checks they agree)
MAX_HIDDEN_SNAPSHOTS = 1800  # History's max_points: no more than the window would keep
MAX_EARLIER_ALERTS = 50  # alerts.MAX_ALERTS (a test checks they agree)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


class LazyDashboard(QObject):
    """The tray app's dashboard: the real `Dashboard` is built (and its plotting stack imported)
    on first use; until then snapshots are kept, bounded by time and count, and replayed into it.

    Any attribute it does not define itself is the real window's (which builds it).
    """

    redrawn = Signal(dict)  # the window's, forwarded
    alert_selected = Signal(str)

    def __init__(
        self,
        kv_type: str = "f16",
        thresholds: Thresholds | None = None,
        window_s: float = HIDDEN_WINDOW_S,
    ) -> None:
        super().__init__()
        self._kv_type = kv_type
        self._thresholds = thresholds
        self._window_s = window_s
        self._banner: str | None = None
        self._real: Dashboard | None = None
        self._pending: deque[Snapshot] = deque()
        self._earlier_alerts: OrderedDict[str, Alert] = OrderedDict()  # from snapshots dropped

    @property
    def loaded(self) -> bool:
        """Whether the real window exists (and pyqtgraph, numpy are imported)."""
        return self._real is not None

    @property
    def pending_count(self) -> int:
        """Snapshots kept for the window not built yet."""
        return len(self._pending)

    @property
    def window(self) -> Dashboard:
        """The real window, built on first access from what it was fed so far."""
        if self._real is None:
            self._real = self._build()
        return self._real

    def _build(self) -> Dashboard:
        from trayapp.ui.dashboard.window import Dashboard

        real = Dashboard(kv_type=self._kv_type, window_s=self._window_s, thresholds=self._thresholds)
        real.redrawn.connect(self.redrawn)
        real.alert_selected.connect(self.alert_selected)
        if self._earlier_alerts and self._pending:
            earlier = tuple(self._earlier_alerts.values())
            real.alert_list.remember(replace(self._pending[0], alerts=(), ended_alerts=earlier))
        for snapshot in self._pending:
            real.update_snapshot(snapshot)  # cheap while hidden: history and alerts only
        self._pending.clear()
        self._earlier_alerts.clear()
        if self._banner:
            real.set_banner(self._banner)
        return real

    def _drop_oldest(self) -> None:
        old = self._pending.popleft()
        for alert in old.alerts + old.ended_alerts:
            self._earlier_alerts[alert.id] = alert
            self._earlier_alerts.move_to_end(alert.id)
        while len(self._earlier_alerts) > MAX_EARLIER_ALERTS:
            self._earlier_alerts.popitem(last=False)

    # ------------------------------------------------------------------ the window's API

    def update_snapshot(self, snapshot: Snapshot) -> None:
        if self._real is not None:
            self._real.update_snapshot(snapshot)
            return
        self._pending.append(snapshot)
        oldest_s = snapshot.t_wall_s - self._window_s
        while self._pending and (
            len(self._pending) > MAX_HIDDEN_SNAPSHOTS or self._pending[0].t_wall_s < oldest_s
        ):
            self._drop_oldest()

    def set_banner(self, text: str | None) -> None:
        self._banner = text
        if self._real is not None:
            self._real.set_banner(text)

    def set_kv_type(self, kv_type: str) -> None:
        self._kv_type = kv_type
        if self._real is not None:
            self._real.set_kv_type(kv_type)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self._thresholds = thresholds
        if self._real is not None:
            self._real.set_thresholds(thresholds)

    def show_and_raise(self) -> None:
        self.window.show_and_raise()

    def focus_alert(self, alert_id: str) -> bool:
        return self.window.focus_alert(alert_id)

    def isVisible(self) -> bool:  # the QWidget name: callers treat this as the window
        return self._real is not None and self._real.isVisible()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "window":
            raise AttributeError(name)
        return getattr(self.window, name)
