"""One llm-tray per user (and per LLM_TRAY_HOME): a second start asks the first to show itself.

The name is derived from the user and the data home, so tests with their own LLM_TRAY_HOME never
collide with a real instance. A second start connects, sends "show", and exits 0; the first emits
`show_requested`.

On Linux and macOS the first instance listens on a Unix socket that only its user may connect to,
at the path Qt's QLocalServer uses for the same name (so a running older version still answers), and
a socket notifier wakes the GUI thread when someone connects. On Windows it is a QLocalServer (a named
pipe): QtNetwork is loaded there only, since it is ~2.5 MiB of a tray's memory.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import socket
import sys
import tempfile
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSocketNotifier, QTimer, Signal, Slot

if TYPE_CHECKING:
    from PySide6.QtNetwork import QLocalSocket

log = logging.getLogger(__name__)

MESSAGE_SHOW = b"show\n"
MAX_MESSAGE_BYTES = 64  # one short line; anything longer is garbage and ends the talk
UNIX_SOCKETS = sys.platform != "win32"


def server_name() -> str:
    """A per-user, per-LLM_TRAY_HOME name, short enough for a Unix socket path."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    home = os.path.abspath(os.path.expanduser(os.environ.get("LLM_TRAY_HOME", "")))
    digest = hashlib.sha256(f"{user}\0{home}".encode()).hexdigest()[:16]
    return f"llm-tray-{digest}"


def socket_path(name: str) -> str:
    """Where the Unix socket of `name` lives: the temporary folder, as QLocalServer puts it."""
    return os.path.join(tempfile.gettempdir(), name)


def notify_running(name: str | None = None, timeout_ms: int = 1000) -> bool:
    """Ask a running instance to show itself; True if one answered (then this process should exit)."""
    name = name or server_name()
    if not UNIX_SOCKETS:
        return _notify_local_server(name, timeout_ms)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout_ms / 1000)
        try:
            client.connect(socket_path(name))
            client.sendall(MESSAGE_SHOW)
        except OSError:  # no socket, a stale one (refused), or nobody reading: no instance to ask
            return False
    return True


def is_show_message(data: bytes) -> bool:
    return data.strip() == MESSAGE_SHOW.strip()


class UnixSocketInstance(QObject):
    """The first instance's listener on a Unix socket. Call `listen()` after `notify_running()` said
    False; a socket left there by a crashed instance is replaced."""

    show_requested = Signal()

    def __init__(self, name: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name or server_name()
        self.path = socket_path(self.name)
        self._server: socket.socket | None = None
        self._server_inode: int | None = None
        self._notifier: QSocketNotifier | None = None
        self._talks: dict[QSocketNotifier, tuple[socket.socket, bytes]] = {}

    def listen(self) -> bool:
        try:
            server = _bind_private(self.path)
            server.listen(8)
            server.setblocking(False)
        except OSError as exc:
            log.warning("single instance: cannot listen on %s: %s", self.path, exc)
            return False
        self._server = server
        self._server_inode = os.stat(self.path).st_ino
        notifier = QSocketNotifier(server.fileno(), QSocketNotifier.Type.Read, self)
        notifier.activated.connect(self._accept)
        self._notifier = notifier
        return True

    def close(self) -> None:
        for talk in list(self._talks):
            self._end(talk)
        server, self._server = self._server, None
        listening, self._notifier = self._notifier, None
        if listening is not None:
            listening.setEnabled(False)
            listening.deleteLater()
        if server is None:
            return
        server.close()
        try:
            if os.stat(self.path).st_ino == self._server_inode:  # still ours, not a newer instance's
                os.unlink(self.path)
        except OSError:
            pass

    @Slot()
    def _accept(self) -> None:
        while self._server is not None:
            try:
                conn, _ = self._server.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("single instance: accept failed: %s", exc)
                return
            conn.setblocking(False)
            notifier = QSocketNotifier(conn.fileno(), QSocketNotifier.Type.Read, self)
            self._talks[notifier] = (conn, b"")
            notifier.activated.connect(self._on_data)

    @Slot()
    def _on_data(self) -> None:
        notifier = self.sender()
        if not isinstance(notifier, QSocketNotifier) or notifier not in self._talks:
            return
        conn, data = self._talks[notifier]
        try:
            chunk = conn.recv(MAX_MESSAGE_BYTES + 1)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        data += chunk
        if chunk and not data.endswith(b"\n") and len(data) <= MAX_MESSAGE_BYTES:
            self._talks[notifier] = (conn, data)
            return
        self._end(notifier)  # a line, the other side gone, or garbage: this talk is over
        if is_show_message(data):
            log.info("another start asked this instance to show itself")
            QTimer.singleShot(0, self, self.show_requested.emit)

    def _end(self, notifier: QSocketNotifier) -> None:
        conn, _ = self._talks.pop(notifier)
        notifier.setEnabled(False)
        notifier.deleteLater()
        conn.close()


def _bind_private(path: str) -> socket.socket:
    """A Unix socket bound at `path` that only this user may connect to, with no moment at which
    another could: bound in a private folder, restricted, then moved into place (over a stale one)."""
    folder = tempfile.mkdtemp(prefix=".llm-tray-", dir=os.path.dirname(path))
    private = os.path.join(folder, "socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(private)
        os.chmod(private, 0o600)
        os.replace(private, path)
    except OSError:
        server.close()
        raise
    finally:
        if os.path.lexists(private):
            os.unlink(private)
        os.rmdir(folder)
    return server


def _notify_local_server(name: str, timeout_ms: int) -> bool:
    from PySide6.QtNetwork import QLocalSocket

    client = QLocalSocket()
    client.connectToServer(name)
    if not client.waitForConnected(timeout_ms):
        return False
    client.write(MESSAGE_SHOW)
    client.flush()
    client.waitForBytesWritten(timeout_ms)
    client.disconnectFromServer()
    if client.state() != QLocalSocket.LocalSocketState.UnconnectedState:
        client.waitForDisconnected(timeout_ms)
    return True


class LocalServerInstance(QObject):
    """The first instance's listener on a QLocalServer (Windows: a named pipe)."""

    show_requested = Signal()

    def __init__(self, name: str | None = None, parent: QObject | None = None) -> None:
        from PySide6.QtNetwork import QLocalServer

        super().__init__(parent)
        self.name = name or server_name()
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._on_connection)
        self._buffers: dict[QLocalSocket, bytes] = {}

    def listen(self) -> bool:
        """Start listening; a stale socket left by a crashed instance is removed first."""
        from PySide6.QtNetwork import QAbstractSocket, QLocalServer

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
            conn = self.server.nextPendingConnection()
            if conn is None:
                return
            # The socket stays a child of the server (deleted with it); no lambdas hold it.
            self._buffers[conn] = b""
            conn.readyRead.connect(self._on_data)
            conn.disconnected.connect(self._on_data)
            if conn.bytesAvailable():
                self._read(conn)

    @Slot()
    def _on_data(self) -> None:
        from PySide6.QtNetwork import QLocalSocket

        conn = self.sender()
        if isinstance(conn, QLocalSocket):
            self._read(conn)

    def _read(self, conn: QLocalSocket) -> None:
        from PySide6.QtNetwork import QLocalSocket

        if conn not in self._buffers:
            return
        data = self._buffers[conn] + bytes(conn.readAll().data())
        complete = data.endswith(b"\n") or conn.state() != QLocalSocket.LocalSocketState.ConnectedState
        if len(data) > MAX_MESSAGE_BYTES or complete:  # one short line, or garbage: this talk is over
            del self._buffers[conn]
            conn.readyRead.disconnect(self._on_data)
            conn.disconnected.disconnect(self._on_data)
            conn.abort()
            if is_show_message(data):
                log.info("another start asked this instance to show itself")
                QTimer.singleShot(0, self, self.show_requested.emit)
            return
        self._buffers[conn] = data


InstanceListener = UnixSocketInstance | LocalServerInstance


def single_instance(name: str | None = None) -> InstanceListener:
    """This system's listener (not yet listening)."""
    return UnixSocketInstance(name) if UNIX_SOCKETS else LocalServerInstance(name)
