"""Desktop notifications for new alerts: once per episode, never repeated.

`NotificationGate` (no Qt) decides; `Notifier` shows the message through the
tray icon and, when the user clicks it, asks for the dashboard focused on that
alert. Each alert id (one per episode) is considered once: shown, or
suppressed by do-not-disturb / a per-kind mute / notifications off. A
suppressed alert is not shown later either, so turning DND off does not bring
a burst of stale news.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QSystemTrayIcon

from trayapp.config.settings import NotificationConfig
from trayapp.core.alert_kinds import ALERT_KINDS
from trayapp.core.glance import first_command
from trayapp.core.model import Alert, Snapshot

log = logging.getLogger(__name__)

NOTIFY_SEVERITIES = ("warning", "critical")  # "info" alerts stay in the dashboard
MAX_REMEMBERED = 2000
TITLE_MAX_CHARS = 90
COPY_FIX_HINT = "“Copy fix” in the tray menu"  # a tray message has no buttons on any platform


def alert_headline(alert: Alert) -> str:
    """A short headline naming the cause (a notification bubble cuts long titles; the tray menu's
    "Copy fix" entries use it too)."""
    cpu_share = alert.evidence.get("cpu_share") if alert.evidence else None
    # A short headline per kind (core.alert_kinds): a notification bubble cuts long titles.
    known = ALERT_KINDS.get(alert.kind)
    template = known.headline if known else None
    if template is not None and (alert.model or "{model}" not in template):
        if isinstance(cpu_share, (int, float)):
            title = template.format(model=alert.model or "", cpu_pct=f"{float(cpu_share) * 100:.0f}")
        else:
            title = template.replace(" ({cpu_pct} %)", "").format(model=alert.model or "")
    else:
        title = alert.message.strip()
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title


def notification_text(alert: Alert) -> tuple[str, str]:
    """(title, body): a short headline naming the cause; the full message (effect, numbers) and the
    fix, with its first command when it has some (all of them: the tray menu's "Copy fix")."""
    title = alert_headline(alert)
    message = alert.message.strip()
    body = [message] if title != message else []
    if alert.cause and alert.cause.strip() not in message:
        body.append(alert.cause.strip())
    body.append(f"Fix: {alert.fix.strip()}")
    command = first_command(alert)
    if command:
        body.append(f"{COPY_FIX_HINT}: {command}")
    return title, "\n".join(body)


class NotificationGate:
    """Pure decision: which alerts of a snapshot deserve a notification now."""

    def __init__(self, config: NotificationConfig | None = None) -> None:
        self.config = config or NotificationConfig()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def why_not(self, alert: Alert) -> str | None:
        """None if `alert` should be shown, else the reason it is not (already seen, muted, …)."""
        if alert.id in self._seen:
            return "already notified for this episode"
        if alert.ended_wall_s is not None:
            return "already ended"
        if not self.config.enabled:
            return "notifications are off"
        if self.config.do_not_disturb:
            return "do not disturb"
        if alert.kind in self.config.muted_kinds:
            return f"{alert.kind} is muted"
        if alert.severity not in NOTIFY_SEVERITIES:
            return f"{alert.severity} alerts are not notified"
        return None

    def select(self, alerts: Iterable[Alert]) -> list[Alert]:
        """The alerts to show; every alert passed is remembered, shown or not."""
        chosen = []
        for alert in alerts:
            if alert.id in self._seen:
                continue
            if self.why_not(alert) is None:
                chosen.append(alert)
            self._remember(alert.id)
        return chosen

    def _remember(self, alert_id: str) -> None:
        self._seen[alert_id] = None
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)


class Notifier(QObject):
    """Shows new alerts through `tray.showMessage`; a click asks for the dashboard on that alert."""

    alert_clicked = Signal(str)  # alert id
    notified = Signal(object)  # Alert, after showMessage

    def __init__(
        self, tray: QSystemTrayIcon, config: NotificationConfig | None = None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.tray = tray
        self.gate = NotificationGate(config)
        self.last_alert_id: str | None = None
        tray.messageClicked.connect(self._on_message_clicked)

    def set_config(self, config: NotificationConfig) -> None:
        self.gate.config = config

    def on_snapshot(self, snapshot: Snapshot) -> list[Alert]:
        """Notify the alerts that are new in this snapshot; returns those shown."""
        shown = self.gate.select(snapshot.alerts)
        if shown:
            self._show(shown)
        return shown

    def _show(self, alerts: list[Alert]) -> None:
        # One bubble per tick (a new bubble replaces the last on most desktops): the worst
        # alert in full, the others named in the body. A click opens the worst one.
        alerts = sorted(alerts, key=lambda a: (a.severity != "critical", -a.since_wall_s))
        worst = alerts[0]
        title, body = notification_text(worst)
        if len(alerts) > 1:
            title = f"{title} (+{len(alerts) - 1} more)"
            body += "\nAlso: " + "; ".join(a.message for a in alerts[1:])
        critical = any(a.severity == "critical" for a in alerts)
        icon = QSystemTrayIcon.MessageIcon.Critical if critical else QSystemTrayIcon.MessageIcon.Warning
        self.last_alert_id = worst.id
        self.tray.showMessage(title, body, icon, 15_000)
        for alert in alerts:
            log.info("notified: %s %s on %s", alert.kind, alert.id, alert.model or alert.server)
            self.notified.emit(alert)

    def _on_message_clicked(self) -> None:
        if self.last_alert_id is not None:
            self.alert_clicked.emit(self.last_alert_id)
