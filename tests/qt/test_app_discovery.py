"""The app tells the tray whether discovery is on (#24): from `[monitor] discover`, or `--no-discover`
(run_tray's `discover`), which wins; a settings change updates it. The idle tooltip (no endpoint, no
server found) says 'discovery is off' exactly when it is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QApplication

from tests.support.snapshots import snap
from trayapp.app import tray_app as app_module
from trayapp.app import tray_main
from trayapp.config.settings import MonitorConfig, Settings
from trayapp.core.model import Snapshot

OFF = "nothing probed: no endpoints configured and discovery is off"
ON = "no endpoint configured; nothing answers on the default ports"


class NoServers:
    """A monitor (never started here) that finds nothing."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.store_error: str | None = None

    def tick(self) -> Snapshot:
        return snap(1.0)

    def next_interval_s(self) -> float:
        return 0.05

    def activity_seen(self) -> bool:

        return False

    def apply_settings(self, settings: Settings) -> None:
        pass

    def close(self) -> None:
        pass


def settings(discover: bool) -> Settings:
    return Settings(monitor=MonitorConfig(discover=discover))


@pytest.fixture
def make(qapp: QApplication) -> Iterator[Any]:
    made: list[app_module.TrayApp] = []

    def build(config: Settings, discover: bool | None = None) -> app_module.TrayApp:
        made.append(app_module.TrayApp(qapp, config, NoServers, discover=discover))
        return made[-1]

    yield build
    for tray_app in made:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


def idle_tooltip(tray_app: app_module.TrayApp) -> str:
    tray_app.on_snapshot(snap(1.0))  # no endpoint configured, no server found
    return tray_app.tray.tray.toolTip()


def test_the_idle_tooltip_follows_the_discover_setting(make: Any) -> None:
    assert idle_tooltip(make(settings(discover=False))) == f"No LLM server found\n{OFF}"
    on = idle_tooltip(make(settings(discover=True)))
    assert on == f"No LLM server found\n{ON}" and "discovery is off" not in on


def test_no_discover_on_the_command_line_wins_over_the_settings(make: Any) -> None:
    assert idle_tooltip(make(settings(discover=True), discover=False)) == f"No LLM server found\n{OFF}"
    assert idle_tooltip(make(settings(discover=True), discover=None)) == f"No LLM server found\n{ON}"


def test_a_settings_change_updates_the_tooltip(make: Any) -> None:
    tray_app = make(settings(discover=True))
    assert idle_tooltip(tray_app).endswith(ON)
    tray_app.apply_settings(settings(discover=False))
    assert tray_app.tray.tray.toolTip().endswith(OFF)  # at once, from the last snapshot
    tray_app.apply_settings(settings(discover=True))
    assert tray_app.tray.tray.toolTip().endswith(ON)
    overridden = make(settings(discover=True), discover=False)
    overridden.apply_settings(settings(discover=True))  # --no-discover still holds
    assert idle_tooltip(overridden).endswith(OFF)


def test_run_tray_hands_its_discover_to_the_app(
    qapp: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_tray(discover=False), as `llm-tray --no-discover` calls it, reaches the TrayApp."""
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_app(*args: Any, **kw: Any) -> None:
        seen.update(kw)
        kw["instance"].close()
        raise Stop

    monkeypatch.setattr(tray_main, "TrayApp", fake_app)
    monkeypatch.setattr(tray_main, "setup_logging", lambda: tmp_path / "llm-tray.log")
    monkeypatch.setattr(tray_main, "install_excepthook", lambda: None)
    quit_on_close = qapp.quitOnLastWindowClosed()
    try:
        with pytest.raises(Stop):
            tray_main.run_tray(settings(discover=True), discover=False, monitor_factory=NoServers)
    finally:
        qapp.setQuitOnLastWindowClosed(quit_on_close)  # run_tray sets it for the app's lifetime
    assert seen["discover"] is False
