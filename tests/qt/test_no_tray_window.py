"""No system tray at a start: the app waits for one (TRAY_WAIT_S) and its window says how to get one.

pytest-qt on the offscreen platform (no tray there) with the tray's appearance simulated, and
the real app on a real X display (Xvfb) where a real tray (trayer) appears during the wait.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.support.snapshots import snap
from tests.support.trayapp_process import TrayAppProcess, is_event, wait_value
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing
from trayapp.app import tray_app as app_module
from trayapp.config.settings import Settings
from trayapp.core.model import Snapshot
from trayapp.ui.no_tray_window import NoTrayWindow, current_desktop, tray_tips

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers


class IdleMonitor:
    """The Monitor's methods; no server (the window's behaviour does not depend on readings)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.store_error: str | None = None

    def tick(self) -> Snapshot:
        return snap(0.0)

    def next_interval_s(self) -> float:
        return 0.2

    def activity_seen(self) -> bool:

        return False

    def apply_settings(self, settings: Settings) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def restore_quit_on_close(qapp: QApplication) -> Iterator[None]:
    saved = qapp.quitOnLastWindowClosed()
    yield
    qapp.setQuitOnLastWindowClosed(saved)


def _make(qapp: QApplication, tmp_path: Path, at_login: bool = False) -> app_module.TrayApp:
    events = app_module.TestEvents(str(tmp_path / "events.jsonl"))
    return app_module.TrayApp(qapp, Settings(), IdleMonitor, at_login=at_login, events=events)


def _event_names(tmp_path: Path) -> list[str]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------- the text


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"XDG_CURRENT_DESKTOP": "ubuntu:GNOME"}, "ubuntu:gnome"),
        ({"XDG_CURRENT_DESKTOP": "", "XDG_SESSION_DESKTOP": "KDE"}, "kde"),
        ({"DESKTOP_SESSION": "sway"}, "sway"),
        ({}, ""),
    ],
)
def test_the_desktop_comes_from_the_xdg_variables(environ: dict[str, str], expected: str) -> None:
    assert current_desktop(environ) == expected


@pytest.mark.parametrize(
    ("desktop", "first_words"),
    [
        ("ubuntu:gnome", "GNOME has no tray of its own"),
        ("gnome", "GNOME has no tray of its own"),
        ("kde", "KDE Plasma has a tray"),
        ("xfce", "XFCE has a tray"),
        ("sway", "Waybar"),
        ("hyprland", "Waybar"),
    ],
)
def test_the_desktops_own_tip_comes_first(desktop: str, first_words: str) -> None:
    tips = tray_tips(desktop)
    assert tips[0].startswith(first_words)
    assert len(tips) == 6 and len(set(tips)) == 6  # every tip once, whatever comes first


def test_every_tip_is_there_on_an_unknown_desktop() -> None:
    text = "\n".join(tray_tips(""))
    assert "AppIndicator" in text  # GNOME
    assert "System Tray" in text  # KDE
    assert "Status Tray Plugin" in text  # XFCE
    assert '"tray"' in text and "waybar" in text  # Waybar's tray module
    assert "`llm-tray watch`" in text and "dashboard" in text  # meanwhile
    assert tray_tips("")[0].startswith("GNOME")  # the default order


def test_the_window_counts_down_then_says_it_runs_as_a_window(qtbot: QtBot) -> None:
    window = NoTrayWindow("No system tray is available on this desktop", wait_s=2, desktop="gnome")
    qtbot.addWidget(window)
    window.show()
    assert window.waiting
    assert "Still looking for a tray for 2 s" in window.status.text()
    assert "AppIndicator" in window.body.text()
    qtbot.waitUntil(lambda: "for 1 s" in window.status.text(), timeout=3000)
    qtbot.waitUntil(lambda: not window.waiting, timeout=3000)
    assert "runs as its dashboard window" in window.status.text()
    with qtbot.waitSignal(window.open_dashboard, timeout=1000):
        window.dashboard_button.click()
    with qtbot.waitSignal(window.quit_requested, timeout=1000):
        window.quit_button.click()


# --------------------------------------------------------------------------- the app (offscreen)


def test_a_normal_start_opens_the_window_and_a_tray_that_appears_gets_the_icon(
    qtbot: QtBot,
    qapp: QApplication,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_quit_on_close: None,
) -> None:
    answers = iter([False, False, False, True])  # the tray appears at the third poll
    monkeypatch.setattr(
        app_module.QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: next(answers, True))
    )
    monkeypatch.setattr(app_module, "TRAY_POLL_MS", 50)
    tray_app = _make(qapp, tmp_path)
    try:
        tray_app.start()
        window = tray_app.no_tray_window
        assert window is not None and window.isVisible()
        assert window.waiting and "Still looking for a tray for 60 s" in window.status.text()
        assert "Waybar" in window.body.text()
        assert tray_app.dashboard.isVisible() and qapp.quitOnLastWindowClosed()
        qtbot.waitUntil(lambda: tray_app.tray_visible, timeout=5000)
        assert tray_app.no_tray_window is None and not window.isVisible()
        assert not tray_app.dashboard.banner.isVisible()
        assert not qapp.quitOnLastWindowClosed()  # the tray holds the app again
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    names = _event_names(tmp_path)
    assert names.index("no_tray") < names.index("no_tray_window") < names.index("tray_shown")


def test_a_normal_start_keeps_the_window_when_no_tray_appears(
    qtbot: QtBot,
    qapp: QApplication,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_quit_on_close: None,
) -> None:
    monkeypatch.setenv(app_module.TRAY_WAIT_ENV, "1")
    monkeypatch.setattr(app_module, "TRAY_POLL_MS", 50)
    tray_app = _make(qapp, tmp_path)
    try:
        tray_app.start()
        window = tray_app.no_tray_window
        assert window is not None and "for 1 s" in window.status.text()
        qtbot.waitUntil(lambda: not tray_app._tray_timer.isActive(), timeout=5000)
        qtbot.waitUntil(lambda: not window.waiting, timeout=5000)
        assert tray_app.no_tray_window is window and window.isVisible()
        assert not tray_app.tray_visible
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    assert not window.isVisible()  # closed on quit
    names = _event_names(tmp_path)
    assert names.count("no_tray") == 1 and names.count("no_tray_window") == 1


def test_at_login_the_window_opens_after_the_wait(
    qtbot: QtBot,
    qapp: QApplication,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_quit_on_close: None,
) -> None:
    monkeypatch.setenv(app_module.TRAY_WAIT_ENV, "0.5")
    tray_app = _make(qapp, tmp_path, at_login=True)
    try:
        tray_app.start()
        assert tray_app.no_tray_window is None  # waiting quietly for the panel
        qtbot.waitUntil(lambda: tray_app.no_tray_window is not None, timeout=5000)
        window = tray_app.no_tray_window
        assert window is not None and window.isVisible() and not window.waiting
        assert "No system tray appeared after login" in window.headline.text()
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


# --------------------------------------------------------------------------- the real app on Xvfb

_missing = xdisplay_tools_missing()


@pytest.mark.xdisplay
@pytest.mark.skipif(bool(_missing), reason=f"X display tools missing: {', '.join(_missing)}")
def test_the_real_app_without_a_tray_docks_when_trayer_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(app_module.TRAY_WAIT_ENV, "40")
    with XDisplay(tray=False) as display:
        app = TrayAppProcess(display, UNREACHABLE, tmp_path)
        trayer: subprocess.Popen[bytes] | None = None
        try:
            shown = app.wait_for("'no_tray_window'", is_event("no_tray_window"), 60.0)
            assert shown["waiting"] is True
            assert "Waybar" in shown["text"] and "llm-tray watch" in shown["text"]
            wait_value("the no-tray window on the display", lambda: _window_named(display, "no system tray"))

            trayer = subprocess.Popen(
                ["trayer", "--edge", "top", "--align", "right", "--width", "10", "--height", "40"],
                env=display.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            app.wait_for("'tray_shown'", is_event("tray_shown"), 30.0)
            wait_value("the icon docked in trayer", lambda: app.window_geometry(small=True), 20.0)
            wait_value("the no-tray window gone", lambda: not _window_named(display, "no system tray"), 10.0)
            assert app.quit() == 0, app.log_tail()
        finally:
            app.stop()
            if trayer is not None:
                trayer.terminate()
                trayer.wait(timeout=10)


def _window_named(display: XDisplay, name: str) -> bool:
    result = subprocess.run(
        ["xdotool", "search", "--onlyvisible", "--name", name],
        env=display.env,
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(result.stdout.split())
