"""The dashboard's alert list: active alerts first, then the ones that ended, newest first."""

from __future__ import annotations

from collections import OrderedDict

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from trayapp.core.model import Alert, Snapshot

MAX_ALERTS = 50  # alerts remembered (active or ended) for the list
PLACEHOLDER = "No alerts: nothing is slowing your models down right now."


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


class AlertsPanel(QListWidget):
    """Alerts with cause and fix; each item carries its alert id (Qt.ItemDataRole.UserRole)."""

    alert_selected = Signal(str)  # alert id, when an item is activated

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setMinimumHeight(60)
        self._alerts: OrderedDict[str, Alert] = OrderedDict()
        self._active: set[str] = set()
        self._rows: list[tuple[str, str, str]] = []  # what the list shows now
        self.itemActivated.connect(lambda it: self.alert_selected.emit(it.data(Qt.ItemDataRole.UserRole)))

    def remember(self, snapshot: Snapshot) -> None:
        """Keep the snapshot's alerts (cheap; the list is rebuilt by `redraw`)."""
        self._active = {a.id for a in snapshot.alerts}
        for alert in snapshot.alerts + snapshot.ended_alerts:
            self._alerts[alert.id] = alert
            self._alerts.move_to_end(alert.id)
        while len(self._alerts) > MAX_ALERTS:
            self._alerts.popitem(last=False)

    def redraw(self) -> None:
        """Rebuild the list, only when what it shows changed (word-wrapped text is costly)."""
        active = self._active
        alerts = sorted(self._alerts.values(), key=lambda a: (a.id not in active, -a.since_wall_s))
        rows = [
            (alert.id, alert_text(alert, ended=alert.id not in active), evidence_text(alert))
            for alert in alerts
        ]
        if rows == self._rows and self.count():
            return
        self._rows = rows
        selected = self.currentItem()
        selected_id = selected.data(Qt.ItemDataRole.UserRole) if selected is not None else None
        self.clear()
        for alert_id, text, tooltip in rows:
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, alert_id)
            if tooltip:
                item.setToolTip(tooltip)
            self.addItem(item)
            if alert_id == selected_id:
                self.setCurrentItem(item)
        if not rows:
            placeholder = QListWidgetItem(PLACEHOLDER)
            placeholder.setFlags(Qt.ItemFlag.NoItemFlags)
            self.addItem(placeholder)

    def select_alert(self, alert_id: str) -> bool:
        """Select and focus that alert; False if it is not in the list."""
        self.redraw()
        for row in range(self.count()):
            item = self.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == alert_id:
                self.setCurrentItem(item)
                self.scrollToItem(item)
                self.setFocus()
                return True
        return False
