"""The dashboard's alert list: active alerts first, then the ones that ended, newest first.

An alert whose fix has commands (#20: the flags, variable or command for the server that runs the
model) shows them under its text with a "Copy fix" button that puts them on the clipboard, one per
line. llm-tray never runs them: the user applies the fix.
"""

from __future__ import annotations

from collections import OrderedDict

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QPalette, QResizeEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from trayapp.core.glance import fix_clipboard_text
from trayapp.core.model import Alert, Snapshot

MAX_ALERTS = 50  # alerts remembered (active or ended) for the list
PLACEHOLDER = "No alerts: nothing is slowing your models down right now."
COPY_FIX = "Copy fix"
HAS_ROW_WIDGET = Qt.ItemDataRole.UserRole + 1  # the item is drawn by its AlertRow, not the delegate


def evidence_text(alert: Alert) -> str:
    return "\n".join(f"{k}: {v}" for k, v in alert.evidence.items()) if alert.evidence else ""


def alert_text(alert: Alert, ended: bool = False) -> str:
    """The alert in words: message, cause, fix (its commands: `fix_clipboard_text`)."""
    # Glyphs present in common UI fonts (DejaVu, Segoe UI, SF): a missing one renders as a box.
    mark = "✓ ended · " if ended else ("✖ " if alert.severity == "critical" else "⚠ ")
    lines = [f"{mark}{alert.message}"]
    if alert.cause and alert.cause not in alert.message:
        lines.append(f"    Cause: {alert.cause}")
    lines.append(f"    Fix: {alert.fix}")
    return "\n".join(lines)


def copy_fix(alert: Alert) -> bool:
    """Put the alert's fix commands on the clipboard; False when it has none (or no clipboard)."""
    text = fix_clipboard_text(alert)
    clipboard = QGuiApplication.clipboard()
    if not text or clipboard is None:
        return False
    clipboard.setText(text)
    return True


class AlertRow(QWidget):
    """One alert with commands: its text, the commands in a fixed-width font (selectable) and the
    "Copy fix" button. The list item under it keeps the same text for keyboard search and tests."""

    copied = Signal(str)  # alert id, after its commands went to the clipboard

    def __init__(self, alert: Alert, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.alert = alert
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 4)
        layout.setSpacing(2)
        self.text_label = QLabel(text)
        self.text_label.setTextFormat(Qt.TextFormat.PlainText)
        self.text_label.setWordWrap(True)
        layout.addWidget(self.text_label)
        commands = QHBoxLayout()
        commands.setContentsMargins(24, 0, 0, 0)
        self.commands_label = QLabel(fix_clipboard_text(alert))
        self.commands_label.setTextFormat(Qt.TextFormat.PlainText)
        self.commands_label.setWordWrap(True)
        self.commands_label.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.commands_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        commands.addWidget(self.commands_label, 1)
        self.copy_button = QPushButton(COPY_FIX)
        self.copy_button.setToolTip("Copy these lines to the clipboard; llm-tray never runs them")
        self.copy_button.clicked.connect(self._copy)
        commands.addWidget(self.copy_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(commands)

    def set_selected(self, selected: bool) -> None:
        """Text in the list's selected-text colour while its item is selected (as the delegate's)."""
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        colour = self.palette().color(role)
        for label in (self.text_label, self.commands_label):
            palette = label.palette()
            palette.setColor(QPalette.ColorRole.WindowText, colour)
            label.setPalette(palette)

    def _copy(self) -> None:
        if copy_fix(self.alert):
            self.copy_button.setText("Copied ✓")
            self.copied.emit(self.alert.id)


class _RowDelegate(QStyledItemDelegate):
    """Draws an item's selection and focus, but not its text where an AlertRow shows it."""

    def initStyleOption(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        super().initStyleOption(option, index)
        if index.data(HAS_ROW_WIDGET):
            option.text = ""


class AlertsPanel(QListWidget):
    """Alerts with cause and fix; each item carries its alert id (Qt.ItemDataRole.UserRole)."""

    alert_selected = Signal(str)  # alert id, when an item is activated
    fix_copied = Signal(str)  # alert id, after "Copy fix" put its commands on the clipboard

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setMinimumHeight(60)
        self.setItemDelegate(_RowDelegate(self))
        self._alerts: OrderedDict[str, Alert] = OrderedDict()
        self._active: set[str] = set()
        self._rows: list[tuple[str, str, str, tuple[str, ...]]] = []  # what the list shows now
        self.itemActivated.connect(lambda it: self.alert_selected.emit(it.data(Qt.ItemDataRole.UserRole)))
        self.itemSelectionChanged.connect(self._restyle_rows)

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
            (alert.id, alert_text(alert, alert.id not in active), evidence_text(alert), alert.fix_commands)
            for alert in alerts
        ]
        if rows == self._rows and self.count():
            return
        self._rows = rows
        selected = self.currentItem()
        selected_id = selected.data(Qt.ItemDataRole.UserRole) if selected is not None else None
        self.clear()
        for alert_id, text, tooltip, commands in rows:
            full = "\n".join((text, *(f"      {c}" for c in commands)))
            item = QListWidgetItem(full)
            item.setData(Qt.ItemDataRole.UserRole, alert_id)
            if tooltip:
                item.setToolTip(tooltip)
            self.addItem(item)
            if commands:
                row = AlertRow(self._alerts[alert_id], text)
                row.copied.connect(self.fix_copied)
                if tooltip:
                    row.setToolTip(tooltip)
                item.setData(HAS_ROW_WIDGET, True)
                self.setItemWidget(item, row)
            if alert_id == selected_id:
                self.setCurrentItem(item)
        self._fit_rows()
        self._restyle_rows()
        if not rows:
            placeholder = QListWidgetItem(PLACEHOLDER)
            placeholder.setFlags(Qt.ItemFlag.NoItemFlags)
            self.addItem(placeholder)

    def row_widget(self, alert_id: str) -> AlertRow | None:
        """The row showing that alert's fix commands (None: it has none, or it is not listed)."""
        for row in range(self.count()):
            item = self.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == alert_id:
                widget = self.itemWidget(item)
                return widget if isinstance(widget, AlertRow) else None
        return None

    def _restyle_rows(self) -> None:
        for row in range(self.count()):
            item = self.item(row)
            widget = self.itemWidget(item)
            if isinstance(widget, AlertRow):
                widget.set_selected(item.isSelected())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_rows()

    def _fit_rows(self) -> None:
        """Size each AlertRow's item to its word-wrapped height at the list's width."""
        width = max(self.viewport().width(), 120)
        for row in range(self.count()):
            item = self.item(row)
            widget = self.itemWidget(item)
            if widget is not None:
                height = widget.heightForWidth(width) if widget.hasHeightForWidth() else -1
                item.setSizeHint(QSize(width, height if height > 0 else widget.sizeHint().height()))

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
