"""Who sent a proxied request (#22): the process at the other end of a loopback connection, else the
client's `User-Agent` product token. Never anything of the request's body.

A loopback client's process is found by its socket: the connection whose local address is the
client's end (127.0.0.1, its port) and whose remote address is the proxy's listener. psutil reads
every process's sockets for that, which costs milliseconds to tens of them, so it runs on a worker
thread, one scan at a time, only for recorded requests, and one scan names every connection open
at that moment (its answers are kept a few seconds). Another user's process cannot be read without
privileges: it is then "another user's process". Forwarding never waits on any of this.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable

from trayapp.core.loopback import is_loopback
from trayapp.core.model import FinishedRequest

log = logging.getLogger(__name__)

CLIENT_NAME_WAIT_S = 2.0  # a record waits at most this for its client's name after the response ends
SCAN_FRESH_S = 5.0  # a scan's answers name connections opened up to this long before another scan
OTHER_USER = "another user's process"
_PRODUCT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")

Named = tuple[str | None, int | None]  # (name, pid)


def user_agent_product(user_agent: str | None) -> str | None:
    """The product token a `User-Agent` starts with (`aider/0.86 python-httpx/0.28` → `aider`), or None."""
    if not user_agent:
        return None
    found = _PRODUCT_RE.match(user_agent.strip())
    return found.group(0) if found else None


def _scan(listen_port: int) -> dict[int, int | None]:
    """Client port → pid (None: a process this user may not read) of every TCP connection to
    `listen_port` on this machine."""
    import psutil

    table: dict[int, int | None] = {}
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as exc:  # e.g. macOS without privileges
        log.debug("client scan failed: %s", exc)
        return table
    for conn in connections:
        if conn.raddr and conn.raddr.port == listen_port and conn.laddr and is_loopback(conn.laddr.ip):
            table[conn.laddr.port] = conn.pid
    return table


def _process_name(pid: int) -> str:
    import psutil

    try:
        return str(psutil.Process(pid).name())
    except psutil.AccessDenied:
        return OTHER_USER
    except psutil.Error:
        return f"pid {pid}"


class ClientNamer:
    """Names the clients of one listener."""

    def __init__(self) -> None:
        self._ports: dict[int, int | None] = {}  # from the last scan
        self._scanned_mono_s = float("-inf")
        self._scan_task: asyncio.Task[None] | None = None
        self._names: dict[int, str] = {}  # pid → process name

    async def name(self, peer: object, listen_port: int, user_agent: str | None) -> Named:
        """(name, pid) of the client at `peer` (the connection's peer address)."""
        port = _loopback_port(peer)
        if port is None:
            return user_agent_product(user_agent), None
        asked_mono_s = time.monotonic()
        for _ in range(2):  # a scan already running may have begun before this connection existed
            if port in self._ports and self._scanned_mono_s >= asked_mono_s - SCAN_FRESH_S:
                break
            await self._rescan(listen_port)
            if self._scanned_mono_s >= asked_mono_s:
                break
        if port not in self._ports:
            return user_agent_product(user_agent), None
        pid = self._ports[port]
        if pid is None:
            return OTHER_USER, None
        if pid not in self._names:
            self._names[pid] = await asyncio.to_thread(_process_name, pid)
            if len(self._names) > 1024:  # pids come and go: keep the newest
                self._names.pop(next(iter(self._names)))
        return self._names[pid], pid

    async def _rescan(self, listen_port: int) -> None:
        if self._scan_task is None or self._scan_task.done():
            self._scan_task = asyncio.ensure_future(self._run_scan(listen_port))
        await asyncio.shield(self._scan_task)

    async def _run_scan(self, listen_port: int) -> None:
        started = time.monotonic()
        self._ports = await asyncio.to_thread(_scan, listen_port)
        self._scanned_mono_s = started


class NamedRecords:
    """Hands each record on (`emit`) with its client's name: the name is looked up from the request's
    start (`lookup`), and a record waits at most CLIENT_NAME_WAIT_S for it once its response ended."""

    def __init__(self, emit: Callable[[FinishedRequest], None]) -> None:
        self._emit = emit
        self._namer = ClientNamer()
        self._waiting: set[asyncio.Task[None]] = set()

    def lookup(self, peer: object, listen_port: int, user_agent: str | None) -> asyncio.Future[Named]:
        return asyncio.ensure_future(self._namer.name(peer, listen_port, user_agent))

    def hand_on(self, record: FinishedRequest, naming: asyncio.Future[Named] | None) -> None:
        if naming is None:
            self._emit(record)
            return
        task = asyncio.ensure_future(self._named(record, naming))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _named(self, record: FinishedRequest, naming: asyncio.Future[Named]) -> None:
        try:
            name, pid = await asyncio.wait_for(asyncio.shield(naming), CLIENT_NAME_WAIT_S)
            record = dataclasses.replace(record, client_name=name, client_pid=pid)
        except (asyncio.TimeoutError, Exception):  # a client unnamed is a record all the same
            naming.cancel()
        self._emit(record)

    async def close(self) -> None:
        """Every record still waiting for its name goes out, named or not."""
        if self._waiting:
            await asyncio.wait(self._waiting, timeout=CLIENT_NAME_WAIT_S + 1)


def _loopback_port(peer: object) -> int | None:
    """The client's port when `peer` is a loopback address (host, port[, …]), else None."""
    if isinstance(peer, tuple) and len(peer) >= 2 and isinstance(peer[0], str) and isinstance(peer[1], int):
        return peer[1] if is_loopback(peer[0]) else None
    return None
