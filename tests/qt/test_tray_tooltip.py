"""The tray's tooltip as the system tray gets it: wrapped lines, and the no-server text per discovery."""

from __future__ import annotations

from dataclasses import replace

from pytestqt.qtbot import QtBot

from tests.support.snapshots import alert, model, server, snap
from trayapp.core.glance import TOOLTIP_WIDTH_CHARS
from trayapp.ui.tray import TrayController

LONG_ALERT = (
    "qwen3:30b spilled to the CPU (52 %): decode runs at system-RAM speed, about 9 tok/s instead of "
    "48 tok/s; unload another model or pick a smaller quantization"
)  # 156 characters


class FakeWorker:
    def set_paused(self, paused: bool) -> None:
        pass


def test_a_long_alert_tooltip_wraps(qtbot: QtBot) -> None:
    tray = TrayController(FakeWorker(), min_redraw_interval_s=0.0, template=False)
    tray.update_snapshot(snap(1.0, server(model(rate=42.0)), alerts=(replace(alert(), message=LONG_ALERT),)))
    lines = tray.tray.toolTip().split("\n")
    assert max(len(line) for line in lines) <= TOOLTIP_WIDTH_CHARS == 60
    assert lines[-3:] == [
        "⚠ qwen3:30b spilled to the CPU (52 %): decode runs at",  # 53; + " system-RAM" would be 64
        "  system-RAM speed, about 9 tok/s instead of 48 tok/s;",  # 54; + " unload" would be 61
        "  unload another model or pick a smaller quantization",  # 53
    ]


def test_the_no_server_tooltip_says_whether_discovery_is_on(qtbot: QtBot) -> None:
    tray = TrayController(FakeWorker(), min_redraw_interval_s=0.0, template=False, discovery=True)
    tray.update_snapshot(snap(1.0))  # no endpoint configured, the scan found nothing
    assert tray.tray.toolTip() == (
        "No LLM server found\nno endpoint configured; nothing answers on the default ports"
    )
    tray.set_discovery(False)  # the user turned the scan off: the shown tooltip follows at once
    assert tray.tray.toolTip() == (
        "No LLM server found\nnothing probed: no endpoints configured and discovery is off"
    )
    unknown = TrayController(FakeWorker(), min_redraw_interval_s=0.0, template=False)
    unknown.update_snapshot(snap(1.0))
    assert "discovery is off" not in unknown.tray.toolTip()
