"""One llm-tray per user (and per LLM_TRAY_HOME): a second start asks the first to show itself.

The first instance listens on a QLocalServer (a Unix socket / Windows named
pipe) whose name is derived from the user and the data home, so tests with
their own LLM_TRAY_HOME never collide with a real instance. A second start
connects, sends "show", and exits 0; the first emits `show_requested`.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtNetwork import QAbstractSocket, QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

MESSAGE_SHOW = b"show\n"


def server_name() -> str:
    """A per-user, per-LLM_TRAY_HOME name, short enough for a Unix socket path."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    home = os.path.abspath(os.path.expanduser(os.environ.get("LLM_TRAY_HOME", "")))
    digest = hashlib.sha256(f"{user}\0{home}".encode()).hexdigest()[:16]
    return f"llm-tray-{digest}"


def notify_running(name: str | None = None, timeout_ms: int = 1000) -> bool:
    """Ask a running instance to show itself; True if one answered (then this process should exit)."""
    socket = QLocalSocket()
    socket.connectToServer(name or server_name())
    if not socket.waitForConnected(timeout_ms):
        return False
    socket.write(MESSAGE_SHOW)
    socket.flush()
    socket.waitForBytesWritten(timeout_ms)
    socket.disconnectFromServer()
    if socket.state() != QLocalSocket.LocalSocketState.UnconnectedState:
        socket.waitForDisconnected(timeout_ms)
    return True


class SingleInstance(QObject):
    """The first instance's listener. Call `listen()` after `notify_running()` returned False."""

    show_requested = Signal()

    def __init__(self, name: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name or server_name()
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._on_connection)
        self._buffers: dict[QLocalSocket, bytes] = {}

    def listen(self) -> bool:
        """Start listening; a stale socket left by a crashed instance is removed first."""
        if self.server.listen(self.name):
            return True
        if self.server.serverError() == QAbstractSocket.SocketError.AddressInUseError:
            QLocalServer.removeServer(self.name)  # nobody answered notify_running: it is stale
            if self.server.listen(self.name):
                return True
        log.warning("single instance: cannot listen on %s: %s", self.name, self.server.errorString())
        return False

    def close(self) -> None:
        self.server.close()

    def _on_connection(self) -> None:
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            if socket is None:
                return
            # The socket stays a child of the server (deleted with it); no lambdas hold it.
            self._buffers[socket] = b""
            socket.readyRead.connect(self._on_data)
            socket.disconnected.connect(self._on_data)
            if socket.bytesAvailable():
                self._read(socket)

    @Slot()
    def _on_data(self) -> None:
        socket = self.sender()
        if isinstance(socket, QLocalSocket):
            self._read(socket)

    def _read(self, socket: QLocalSocket) -> None:
        if socket not in self._buffers:
            return
        data = self._buffers[socket] + bytes(socket.readAll().data())
        complete = data.endswith(b"\n") or socket.state() != QLocalSocket.LocalSocketState.ConnectedState
        if len(data) > 64 or complete:  # one short line, or garbage: either way this talk is over
            del self._buffers[socket]
            socket.readyRead.disconnect(self._on_data)
            socket.disconnected.disconnect(self._on_data)
            socket.abort()
            if data.strip() == MESSAGE_SHOW.strip():
                log.info("another start asked this instance to show itself")
                QTimer.singleShot(0, self, self.show_requested.emit)
            return
        self._buffers[socket] = data
