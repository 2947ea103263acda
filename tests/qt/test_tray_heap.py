"""The tray's start-up objects are left out of Python's later collections once start-up is done, at
the first hand-back of free memory (sources/malloc.settle_the_heap; issue #26), and only then."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from trayapp.app import tray_main


def test_the_first_release_settles_the_heap_and_the_later_ones_only_release(
    qapp: QApplication, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(tray_main, "settle_the_heap", lambda: calls.append("settle"))
    monkeypatch.setattr(tray_main, "release_free_memory", lambda: calls.append("release") or True)
    monkeypatch.setattr(tray_main, "RELEASE_FIRST_MS", 20)
    monkeypatch.setattr(tray_main, "RELEASE_EVERY_MS", 30)
    timer = tray_main._release_free_memory_now_and_then(qapp)
    try:
        qtbot.waitUntil(lambda: calls.count("release") >= 3, timeout=5000)
    finally:
        timer.stop()
    assert calls[:2] == ["settle", "release"] and calls.count("settle") == 1
