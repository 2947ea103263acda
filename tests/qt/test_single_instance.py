"""A second start asks the running instance to show itself (QLocalServer per user and home)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from trayapp.ui.single_instance import SingleInstance, notify_running, server_name

REPO = Path(__file__).resolve().parents[2]


def test_name_depends_on_the_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = server_name()
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "other"))
    assert server_name() != first
    assert server_name().startswith("llm-tray-") and len(server_name()) < 40


def test_nothing_running_means_start(qtbot: QtBot) -> None:
    assert not notify_running(timeout_ms=300)


def test_second_start_in_another_process_shows_the_first(qtbot: QtBot) -> None:
    instance = SingleInstance()
    assert instance.listen()
    code = (
        "import sys; from PySide6.QtCore import QCoreApplication; app = QCoreApplication([]);"
        "from trayapp.ui.single_instance import notify_running; sys.exit(0 if notify_running() else 3)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with qtbot.waitSignal(instance.show_requested, timeout=10_000):
        second = subprocess.Popen([sys.executable, "-c", code], env=env)
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=10_000)
    assert second.returncode == 0
    instance.close()
    assert not notify_running(timeout_ms=300)


def test_stale_socket_from_a_crash_is_replaced(qtbot: QtBot) -> None:
    crashed = SingleInstance()
    assert crashed.listen()
    path = crashed.server.fullServerName()
    crashed.server.close()
    Path(path).touch()  # what a killed instance leaves behind on Unix
    fresh = SingleInstance()
    assert fresh.listen()
    with qtbot.waitSignal(fresh.show_requested, timeout=5000):
        assert notify_running()
    fresh.close()


def test_garbage_is_ignored(qtbot: QtBot) -> None:
    from PySide6.QtNetwork import QLocalSocket

    instance = SingleInstance()
    assert instance.listen()
    socket = QLocalSocket()
    socket.connectToServer(instance.name)
    assert socket.waitForConnected(1000)
    with qtbot.assertNotEmitted(instance.show_requested, wait=300):
        socket.write(b"x" * 100)
        socket.flush()
    socket.abort()
    instance.close()
