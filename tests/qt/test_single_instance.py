"""A second start asks the running instance to show itself (a Unix socket, or a QLocalServer, per user
and home)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from trayapp.app.single_instance import (
    InstanceListener,
    LocalServerInstance,
    UnixSocketInstance,
    notify_running,
    server_name,
    socket_path,
)

REPO = Path(__file__).resolve().parents[2]
LISTENERS = [UnixSocketInstance, LocalServerInstance]


@pytest.fixture
def name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A name of this test's own (its own LLM_TRAY_HOME), its socket removed afterwards."""
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))
    yield server_name()
    if os.path.lexists(socket_path(server_name())):
        os.unlink(socket_path(server_name()))


def test_name_depends_on_the_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = server_name()
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "other"))
    assert server_name() != first
    assert server_name().startswith("llm-tray-") and len(server_name()) < 40


def test_nothing_running_means_start(qtbot: QtBot, name: str) -> None:
    assert not notify_running(timeout_ms=300)


@pytest.mark.parametrize("listener", LISTENERS)
def test_second_start_in_another_process_shows_the_first(
    qtbot: QtBot, name: str, listener: type[InstanceListener]
) -> None:
    """Also: today's start finds a running older version (QLocalServer) at the same path."""
    instance = listener()
    assert instance.listen()
    code = (
        "import sys; from trayapp.app.single_instance import notify_running;"
        "sys.exit(0 if notify_running() else 3)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with qtbot.waitSignal(instance.show_requested, timeout=10_000):
        second = subprocess.Popen([sys.executable, "-c", code], env=env)
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=10_000)
    assert second.returncode == 0
    instance.close()
    assert not notify_running(timeout_ms=300)


def test_only_this_user_may_connect_and_close_removes_the_socket(qtbot: QtBot, name: str) -> None:
    instance = UnixSocketInstance()
    assert instance.listen()
    mode = os.stat(socket_path(name)).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    instance.close()
    assert not os.path.lexists(socket_path(name))


@pytest.mark.parametrize("leftover", ["dead socket", "plain file"])
def test_what_a_crash_leaves_is_replaced(qtbot: QtBot, name: str, leftover: str) -> None:
    path = socket_path(name)
    if leftover == "dead socket":  # bound, then its process gone: connecting is refused
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(path)
        dead.close()
    else:
        Path(path).touch()
    assert not notify_running(timeout_ms=300)
    fresh = UnixSocketInstance()
    assert fresh.listen()
    with qtbot.waitSignal(fresh.show_requested, timeout=5000):
        assert notify_running()
    fresh.close()


def test_an_older_instance_closing_leaves_the_newer_ones_socket(qtbot: QtBot, name: str) -> None:
    older, newer = UnixSocketInstance(), UnixSocketInstance()
    assert older.listen()
    assert newer.listen()  # took the path over (as after a hung older one never answered)
    older.close()
    with qtbot.waitSignal(newer.show_requested, timeout=5000):
        assert notify_running()
    newer.close()


def _raw_client(path: str) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(5)
    client.connect(path)
    return client


def test_garbage_is_ignored_and_the_talk_ended(qtbot: QtBot, name: str) -> None:
    instance = UnixSocketInstance()
    assert instance.listen()
    with _raw_client(socket_path(name)) as client:
        with qtbot.assertNotEmitted(instance.show_requested, wait=300):
            client.sendall(b"x" * 100)
        ended: list[bytes] = []
        qtbot.waitUntil(lambda: bool(_closed_by_the_other_side(client, ended)), timeout=5000)
    instance.close()


def _closed_by_the_other_side(client: socket.socket, seen: list[bytes]) -> bool:
    client.setblocking(False)
    try:
        seen.append(client.recv(16))
    except BlockingIOError:
        return False
    except ConnectionResetError:  # closed with our garbage unread: a reset, not an end of stream
        return True
    return seen[-1] == b""


def test_a_silent_client_does_not_stop_the_next_one(qtbot: QtBot, name: str) -> None:
    instance = UnixSocketInstance()
    assert instance.listen()
    silent = _raw_client(socket_path(name))  # connects and says nothing
    with silent, qtbot.waitSignal(instance.show_requested, timeout=5000):
        assert notify_running()
    instance.close()


def test_garbage_is_ignored_by_the_local_server(qtbot: QtBot, name: str) -> None:
    from PySide6.QtNetwork import QLocalSocket

    instance = LocalServerInstance()
    assert instance.listen()
    client = QLocalSocket()
    client.connectToServer(instance.name)
    assert client.waitForConnected(1000)
    with qtbot.assertNotEmitted(instance.show_requested, wait=300):
        client.write(b"x" * 100)
        client.flush()
    client.abort()
    instance.close()
