"""The window shown when the desktop has no system tray: why, how to get one, what to use meanwhile.

Qt shows the icon on an XEmbed tray (X11 panels, trayer, stalonetray) and on a
StatusNotifierItem host (KDE Plasma, XFCE's Status Tray, GNOME with the AppIndicator
extension, Waybar's `tray` module, …). When neither is there the app runs as its dashboard
window and this window says how to get a tray on the desktop it runs on. While the app still
waits for a tray (`wait_s`), it says so: a tray that appears then gets the icon, and the app
closes this window.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

GNOME_TIP = (
    "GNOME has no tray of its own: install and turn on the “AppIndicator and KStatusNotifierItem "
    "Support” extension (Ubuntu ships it on as “Ubuntu AppIndicators”; elsewhere the package "
    "gnome-shell-extension-appindicator, then log out and in)."
)
KDE_TIP = "KDE Plasma has a tray: if the panel lacks it, right-click the panel → Add Widgets… → System Tray."
XFCE_TIP = (
    "XFCE has a tray: Panel → Panel Preferences → Items → + → “Status Tray Plugin” (or “Notification Area”)."
)
WAYBAR_TIP = 'Waybar (sway, Hyprland, river, …): add "tray" to a modules list in ~/.config/waybar/config.'
OTHER_TIP = (
    "Other panels: turn on their system tray or notification area (XEmbed or StatusNotifierItem), "
    "or run a standalone tray such as trayer or stalonetray."
)
MEANWHILE_TIP = (
    "Meanwhile the dashboard shows everything the icon would; in a terminal, `llm-tray watch` "
    "follows it live and `llm-tray status` prints it once."
)


def current_desktop(environ: Mapping[str, str] | None = None) -> str:
    """The desktop's name as XDG_CURRENT_DESKTOP (or the session's) says, lower case ('' if unknown)."""
    env = os.environ if environ is None else environ
    for name in ("XDG_CURRENT_DESKTOP", "XDG_SESSION_DESKTOP", "DESKTOP_SESSION"):
        value = env.get(name, "").strip()
        if value:
            return value.lower()
    return ""


def tray_tips(desktop: str) -> list[str]:
    """Tips to get a tray, `desktop`'s first; the last one says what to use meanwhile."""
    desktop = desktop.lower()
    tips = [GNOME_TIP, KDE_TIP, XFCE_TIP, WAYBAR_TIP]
    if any(name in desktop for name in ("gnome", "ubuntu", "unity", "pop")):
        first = GNOME_TIP
    elif "kde" in desktop or "plasma" in desktop:
        first = KDE_TIP
    elif "xfce" in desktop:
        first = XFCE_TIP
    elif any(name in desktop for name in ("sway", "hyprland", "river", "wlroots", "niri", "wayfire")):
        first = WAYBAR_TIP
    else:
        first = None
    if first is not None:
        tips.remove(first)
        tips.insert(0, first)
    return [*tips, OTHER_TIP, MEANWHILE_TIP]


class NoTrayWindow(QWidget):
    """'No system tray': the reason, a countdown while the app still waits for one, and the tips."""

    open_dashboard = Signal()
    quit_requested = Signal()

    def __init__(
        self, why: str, wait_s: float = 0.0, desktop: str | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("llm-tray: no system tray")
        self.desktop = current_desktop() if desktop is None else desktop
        self.tips = tray_tips(self.desktop)
        self._left_s = max(round(wait_s), 0)
        layout = QVBoxLayout(self)
        self.headline = QLabel(f"<b>{html.escape(why)}</b>, so llm-tray's icon has nowhere to go.")
        self.headline.setWordWrap(True)
        self.status = QLabel()
        self.status.setWordWrap(True)
        items = "".join(f"<li>{html.escape(tip)}</li>" for tip in self.tips[:-1])
        self.body = QLabel(f"<p>To get a tray:</p><ul>{items}</ul><p>{html.escape(self.tips[-1])}</p>")
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QHBoxLayout()
        self.dashboard_button = QPushButton("Open dashboard")
        self.dashboard_button.clicked.connect(self.open_dashboard)
        self.quit_button = QPushButton("Quit llm-tray")
        self.quit_button.clicked.connect(self.quit_requested)
        buttons.addStretch(1)
        buttons.addWidget(self.dashboard_button)
        buttons.addWidget(self.quit_button)
        for widget in (self.headline, self.status, self.body):
            layout.addWidget(widget)
        layout.addLayout(buttons)
        self.resize(560, 420)
        self._countdown = QTimer(self)
        self._countdown.setObjectName("no-tray-countdown")
        self._countdown.setInterval(1000)
        self._countdown.timeout.connect(self._tick)
        self._show_status()
        if self._left_s > 0:
            self._countdown.start()

    @property
    def waiting(self) -> bool:
        """Whether the window still says the app waits for a tray."""
        return self._left_s > 0

    def text(self) -> str:
        """Everything the window says, as plain text (tests, diagnostics)."""
        return "\n".join([self.headline.text(), self.status.text(), *self.tips])

    def _tick(self) -> None:
        self._left_s -= 1
        if self._left_s <= 0:
            self._countdown.stop()
        self._show_status()

    def _show_status(self) -> None:
        if self._left_s > 0:
            self.status.setText(
                f"Still looking for a tray for {self._left_s} s: if one appears, the icon goes there "
                "and this window closes."
            )
        else:
            self.status.setText(
                "llm-tray runs as its dashboard window for now (closing the windows quits it); "
                "start it again once the desktop has a tray."
            )
