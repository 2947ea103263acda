"""The one guarded HTTP listener under the snapshot endpoint and `/metrics` (docs/security.md).

Every limit a client meets is here, with its value set by the listener that uses it (the constants
live in sinks/snapshot_server.py and sinks/metrics.py):

* a whole request (line, headers and body) must arrive within `request_timeout_s` of the moment the
  listener starts waiting for it (after connecting, or after the previous answer): an idle or a
  trickling connection is closed then, however slowly it keeps sending;
* every write must finish within `send_timeout_s` (a client that does not read is dropped);
* at most `max_connections` connections at once. At the cap a new connection takes the slot of the
  connection that has waited longest for a request *with nothing sent to read* (an idle or trickling
  one: it is shut down), as the proxy does (services/proxy/admission.py); when every held connection
  is serving a request or has one arriving, the new one gets `503` at once, from the accept thread,
  and is closed (no thread is started for it);
* a listener bound to loopback answers only a `Host` of `localhost`, `127.0.0.1` or `[::1]` (any port)
  or a name the user allowed, so a web page whose name is rebound to 127.0.0.1 reads nothing (DNS
  rebinding); any listener refuses a request with an `Origin` header (a browser's) unless allowed;
* the accept loop sleeps until a client connects or `shutdown` wakes it (a socket pair): an idle
  listener never polls (the snapshot endpoint's 50 ms poll was most of an idle tray's CPU, #26);
* an accept that fails (EMFILE at the file-descriptor limit, ENFILE, ENOBUFS, ENOMEM) is logged at
  most once a minute and retried after a short pause, and a failure to start a client's thread is logged
  once: nothing a client does ends the listener.
"""

from __future__ import annotations

import array
import contextlib
import errno
import io
import json
import logging
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trayapp.core.loopback import LOOPBACK_HOST_NAMES, is_loopback

log = logging.getLogger(__name__)

ACCEPT_BACKOFF_S = 0.1  # after a failed accept (fd limit): no busy loop on a socket that stays ready
ACCEPT_LOG_EVERY_S = 60.0  # a failing accept is logged at most this often
REQUEST_QUEUE = 128  # the listen backlog
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

try:  # FIONREAD: bytes the kernel holds for a socket (POSIX)
    import fcntl
    import termios

    _FIONREAD: int | None = termios.FIONREAD
except ImportError:  # Windows: a connection's unread bytes cannot be counted
    _FIONREAD = None


def kernel_bytes_waiting(fileno: int) -> int:
    """Bytes the kernel holds unread for this socket; 0 where that cannot be asked."""
    if _FIONREAD is None or fileno < 0:
        return 0
    count = array.array("i", [0])
    with contextlib.suppress(OSError):
        fcntl.ioctl(fileno, _FIONREAD, count, True)
        return count[0]
    return 0


def host_name(host_header: str) -> str:
    """`Host`'s name without its port, lower case: `[::1]:9464` → `[::1]`, `LOCALHOST:80` → `localhost`."""
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    return host.rpartition(":")[0] if ":" in host else host


def normal_host(name: str) -> str:
    """A configured host name as `host_name` gives it (an IPv6 address in brackets)."""
    name = name.strip().lower()
    return f"[{name}]" if ":" in name and not name.startswith("[") else name


class _DeadlineReader(io.RawIOBase):
    """The request side of a connection: every read ends by the handler's deadline."""

    def __init__(self, sock: socket.socket, handler: GuardedHandler) -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._handler.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _DeadlineWriter(io.BufferedIOBase):
    """The answer side: each write must be sent within the handler's `send_timeout_s`."""

    def __init__(self, sock: socket.socket, handler: GuardedHandler) -> None:
        self._sock = sock
        self._handler = handler

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.settimeout(self._handler.send_timeout_s)
        self._sock.sendall(data)  # the timeout bounds the whole sendall (Python ≥ 3.5)
        return len(data)


class GuardedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections`; see the module's docstring."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = REQUEST_QUEUE

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
        name: str,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.max_connections = max_connections
        self.name = name
        # each held connection → when it began to wait for a request (None: serving one)
        self._held: dict[socket.socket, float | None] = {}
        self._active_lock = threading.Lock()
        self.evicted = 0  # waiting connections shut down to make room at the cap
        self._accept_failures = 0
        self._accept_logged_s = -ACCEPT_LOG_EVERY_S
        self._logged: set[str] = set()
        self._stop_requested = False
        self._stopped = threading.Event()
        self._stopped.set()
        self._wake_read, self._wake_write = socket.socketpair()  # `shutdown` writes, the loop wakes
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """socketserver's accept loop, asleep until a client connects or `shutdown` wakes it
        (`poll_interval` is unused: nothing needs polling)."""
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                while not self._stop_requested:
                    ready = [key.fileobj for key, _ in selector.select()]
                    if self._wake_read in ready:
                        self._wake_read.recv(64)
                    if self._stop_requested:
                        break
                    if self in ready:
                        self._handle_request_noblock()  # type: ignore[attr-defined]  # as socketserver does
                    self.service_actions()
        finally:
            self._stop_requested = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait for it (from another thread), at once."""
        self._stop_requested = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_read.close()
        self._wake_write.close()

    @property
    def active_connections(self) -> int:
        return len(self._held)

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRNOS:
                now = time.monotonic()
                self._accept_failures += 1
                if now - self._accept_logged_s >= ACCEPT_LOG_EVERY_S:
                    self._accept_logged_s = now
                    log.warning(
                        "%s: cannot accept a connection: %s (%d time(s) since the last such line; "
                        "retrying, clients wait)", self.name, exc, self._accept_failures,
                    )  # fmt: skip
                    self._accept_failures = 0
                time.sleep(ACCEPT_BACKOFF_S)  # the socket stays readable: no busy loop
            raise  # socketserver drops this accept and serves on

    def process_request(self, request: Any, client_address: Any) -> None:
        victim = None
        with self._active_lock:
            if len(self._held) >= self.max_connections:
                victim = self._longest_waiting()
                if victim is not None:
                    del self._held[victim]  # its slot is free now; its thread ends and closes it
                    self.evicted += 1
            full = len(self._held) >= self.max_connections
            if not full:
                self._held[request] = time.monotonic()
        if victim is not None:
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)  # its thread's blocked read returns at once
        if full:
            self._refuse_full(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._release(request)
            raise  # socketserver: handle_error, then closes the connection

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def waiting(self, connection: socket.socket, for_request: bool) -> None:
        """The handler of `connection` waits for a request (it may give up its slot at the cap), or
        has one to serve (it may not)."""
        with self._active_lock:
            if connection in self._held:
                self._held[connection] = time.monotonic() if for_request else None

    def _longest_waiting(self) -> socket.socket | None:
        """The connection that has waited longest for a request with nothing sent to read; None when
        every one serves a request or has one arriving (called with the lock held)."""
        waiting = sorted((since, id(sock), sock) for sock, since in self._held.items() if since is not None)
        for _, _, sock in waiting:
            if kernel_bytes_waiting(sock.fileno()) == 0:
                return sock
        return None

    def _release(self, request: socket.socket) -> None:
        with self._active_lock:
            self._held.pop(request, None)

    def _refuse_full(self, request: socket.socket) -> None:
        """`503` at once, without a thread and without waiting on the client."""
        body = json.dumps({"error": f"too many connections ({self.max_connections}): try again"}).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        ).encode()
        try:
            request.setblocking(False)
            with contextlib.suppress(OSError):
                request.recv(65536)  # what the client sent already: closing over unread data resets
            request.send(head + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failure of one connection (its thread could not start, a handler's bug): logged once per
        kind, never a traceback on stderr per connection; the listener serves on."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client went away, reset, or stopped reading
            log.debug("%s: a connection ended: %s", self.name, exc)
            return
        key = type(exc).__name__
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s: a connection failed (logged once per kind)", self.name, exc_info=exc)


class GuardedHandler(BaseHTTPRequestHandler):
    """Deadlines on both sides, Host and Origin checks. Subclasses set the class attributes."""

    request_timeout_s = 10.0
    send_timeout_s = 10.0
    allowed_hosts: frozenset[str] = frozenset()  # beyond LOOPBACK_HOST_NAMES (normal_host form)
    allowed_origins: frozenset[str] = frozenset()
    server_version = "llm-tray"
    sys_version = ""
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + self.request_timeout_s
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))
        self.wfile = _DeadlineWriter(self.connection, self)

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + self.request_timeout_s  # idle wait + the whole request
        self._note_waiting(True)
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        """No access log."""

    def reply_error(self, status: int, message: str) -> None:
        """A short JSON error (subclasses may answer in their own type)."""
        body = json.dumps({"error": message}, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _note_waiting(self, for_request: bool) -> None:
        if isinstance(self.server, GuardedServer):
            self.server.waiting(self.connection, for_request)

    def parse_request(self) -> bool:
        self._note_waiting(False)  # a request line arrived: this connection keeps its slot now
        if not super().parse_request():
            return False
        refusal = self.refusal()
        if refusal is None:
            return True
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.reply_error(*refusal)
        return False

    def refusal(self) -> tuple[int, str] | None:
        """(status, message) when the request's Host or Origin is refused, else None."""
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            return 400, "more than one Host header"
        address = self.server.server_address
        bound = str(address[0]) if isinstance(address, tuple) else ""
        if hosts and is_loopback(bound):
            name = host_name(hosts[0])
            if name not in LOOPBACK_HOST_NAMES and name not in self.allowed_hosts:
                return 403, (
                    f"Host {hosts[0]!r} refused: this listener is on loopback and answers only localhost, "
                    "127.0.0.1 and [::1] (a name of your own: --allow-host NAME; docs/security.md)"
                )
        for origin in self.headers.get_all("Origin") or []:
            if origin.strip().lower() not in self.allowed_origins:
                return 403, (
                    f"Origin {origin!r} refused: requests from web pages are not answered "
                    "(allow one with --allow-origin ORIGIN; docs/security.md)"
                )
        return None
