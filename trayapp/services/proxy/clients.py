"""Who sent a proxied request (#22): the process at the other end of a loopback connection, else the
client's `User-Agent` product token. Never anything of the request's body.

A loopback client's process is found by its socket: the connection whose local address is the
client's end (127.0.0.1, its port) and whose remote address is the proxy's listener. It runs on a
worker thread, one scan at a time, only for recorded requests, and one scan names every connection
open at that moment (its answers are kept a few seconds); lookups asked while one runs go together in
the next. Another user's process cannot be read
without privileges: it is then "another user's process". Forwarding never waits on any of this.

On Linux the scan asks the kernel for the TCP sockets (sock_diag netlink, as `ss` does; the text of
/proc/net/tcp{,6} where that is refused, ~6 ms of kernel time for a few hundred sockets), keeps those
to the listener, then reads the descriptors of the processes that were clients before (a client
sends many requests) and of the others only for sockets still unowned: usually one process's
descriptors, a fraction of a millisecond. psutil's `net_connections` (elsewhere) reads every socket
of every process, 10-30 ms of Python holding the GIL on a busy host, which the proxy's event loop
waited on mid-stream (issue #26's profile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from trayapp.config.bugs import BugLog
from trayapp.core.loopback import is_loopback
from trayapp.core.model import FinishedRequest
from trayapp.core.vram_holders import OTHER_USER
from trayapp.sources import sock_diag

log = logging.getLogger(__name__)

CLIENT_NAME_WAIT_S = 2.0  # a record waits at most this for its client's name after the response ends
NAME_KEPT_S = 30.0  # a process's name is read again after this: its pid may belong to another by then
SCAN_FRESH_S = 5.0  # a scan's answers name connections opened up to this long before another scan
_PRODUCT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")

Named = tuple[str | None, int | None]  # (name, pid)
Owner = tuple[bool, int | None]  # (known, pid): see _owners_of
CLOSED: Owner = (True, 0)  # the client closed its socket before the lookup: no process holds it
Address = tuple[str, int]
_T = TypeVar("_T")


def user_agent_product(user_agent: str | None) -> str | None:
    """The product token a `User-Agent` starts with (`aider/0.86 python-httpx/0.28` → `aider`), or None."""
    if not user_agent:
        return None
    found = _PRODUCT_RE.match(user_agent.strip())
    return found.group(0) if found else None


_RECENT_PIDS: dict[int, None] = {}  # processes that were clients lately (newest last), looked at first
_RECENT_PIDS_KEPT = 64


def _scan(listen_port: int) -> dict[int, int | None]:
    """Client port → pid (None: a process this user may not read) of every TCP connection to
    `listen_port` on this machine."""
    if sys.platform.startswith("linux"):
        try:
            table = _scan_proc(listen_port, reversed(list(_RECENT_PIDS)))
        except OSError as exc:  # no /proc (a sandbox): psutil's way
            log.debug("client scan of /proc failed: %s", exc)
        else:
            _remember(table.values())
            return table
    return _scan_psutil(listen_port)


def _sockets_to(listen_port: int) -> list[tuple[int, int]]:
    """(client port, socket inode) of each loopback TCP connection to `listen_port`."""
    try:
        return sock_diag.sockets_to(listen_port)
    except OSError as exc:  # no sock_diag here (a sandbox): the text listing
        log.debug("sock_diag refused (%s): reading /proc/net/tcp", exc)
    found: list[tuple[int, int]] = []
    needle = f":{listen_port:04X} "
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(path, encoding="ascii") as listing:
                lines = [line for line in listing if needle in line]
        except FileNotFoundError:  # no IPv6
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], int(fields[9])
            address, _, port = local.partition(":")
            if int(remote.rpartition(":")[2], 16) == listen_port and is_loopback(
                _proc_address(address, family)
            ):
                found.append((int(port, 16), inode))
    return found


def _owners_of(pairs: list[tuple[Address, Address]]) -> list[Owner]:
    """(known, pid) of each loopback client at `peer` connected to the listener at `local`: one lookup
    of each socket, then one pass over the descriptors of recent clients first for all of them (50
    connections opened at once cost one pass, not 50). (False, None): this way cannot tell (not
    Linux, sock_diag refused, or an address pair it cannot look up); (True, None): no process this
    user may read holds it; CLOSED: the client has closed it (no pass looks for those, and one that
    found no holder asks again whether the socket is still there: a client closing during the pass
    is not another user's)."""
    if not sys.platform.startswith("linux"):
        return [(False, None)] * len(pairs)
    inodes = _inodes_of(pairs)
    holders = _holders({inode for inode in inodes if inode}, reversed(list(_RECENT_PIDS)))
    _remember(holders.values())
    unheld = [at for at, inode in enumerate(inodes) if inode and inode not in holders]
    if unheld:
        for at, now in zip(unheld, _inodes_of([pairs[at] for at in unheld]), strict=True):
            if now == 0:
                inodes[at] = 0
    return [
        (False, None) if inode is None else CLOSED if not inode else (True, holders.get(inode))
        for inode in inodes
    ]


def _inodes_of(pairs: list[tuple[Address, Address]]) -> list[int | None]:
    """The inode of each client's socket, by one sock_diag lookup each on one netlink socket; 0 when
    no process holds it any more (the client closed it), None when this way cannot tell (sock_diag
    refused, an address it cannot parse)."""
    try:
        with sock_diag.Link() as link:
            return [_inode_of(link, peer, local) for peer, local in pairs]
    except OSError as exc:
        log.debug("sock_diag refused: %s", exc)
        return [None] * len(pairs)


def _inode_of(link: sock_diag.Link, peer: Address, local: Address) -> int | None:
    src, dst = peer[0].split("%")[0], local[0].split("%")[0]
    try:
        if src.startswith("::ffff:") and dst.startswith("::ffff:"):
            # an IPv4 client of a dual-stack listener (its socket is AF_INET), else an IPv6 socket
            # that connected to the mapped address itself
            inode = link.inode_of(socket.AF_INET, src[7:], peer[1], dst[7:], local[1])
            return inode or link.inode_of(socket.AF_INET6, src, peer[1], dst, local[1])
        family = socket.AF_INET6 if ":" in src else socket.AF_INET
        return link.inode_of(family, src, peer[1], dst, local[1])
    except (OSError, ValueError, struct.error) as exc:
        log.debug("sock_diag lookup failed: %s", exc)
        return None


def _remember(pids: Iterable[int | None]) -> None:
    """Clients' processes, newest last, looked at first by the next lookups."""
    for pid in pids:
        if pid is not None:
            _RECENT_PIDS.pop(pid, None)
            _RECENT_PIDS[pid] = None
    while len(_RECENT_PIDS) > _RECENT_PIDS_KEPT:
        _RECENT_PIDS.pop(next(iter(_RECENT_PIDS)))


def _holders(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
    """Socket inode → the pid holding it, for those of `inodes` a process this user may read holds:
    `first_pids` and this process first, the rest of /proc only while some are still unfound."""
    wanted = set(inodes)
    found: dict[int, int] = {}
    if not wanted:
        return found
    pids = (int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in _unique([*first_pids, os.getpid()], pids):
        if not wanted:
            break
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's
            continue
        for inode in _sockets_among(pid, fds, wanted):
            found[inode] = pid
    return found


def _sockets_among(pid: int, fds: list[str], wanted: set[int]) -> list[int]:
    """Those of `wanted` (socket inodes) that `pid` holds among its descriptors `fds`, taken out of
    `wanted` as they are found."""
    held: list[int] = []
    for fd in fds:
        if (inode := _socket_inode(pid, fd)) is not None and inode in wanted:
            wanted.discard(inode)
            held.append(inode)
            if not wanted:
                break
    return held


def _socket_inode(pid: int, fd: str) -> int | None:
    """The inode of the socket `pid` holds as descriptor `fd`; None for anything else, or when gone."""
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile (the listing's own descriptor, for one)
        return None
    return int(link[8:-1]) if link.startswith("socket:[") else None


QUICK_LOOKUP_MAX_FDS = 256  # the last client's descriptors are read on the event loop up to this many
LAST_CLIENT_SOCKETS_KEPT_S = 0.5  # one pass over them answers the lookups of a burst this long


class _SocketsSeen:
    """The sockets one pass over a process's descriptors found: the lookups of a burst that come one
    by one (each stream's at its first text) read the last client's descriptors once, not once each
    (issue #26). A socket not among them (opened since) makes a new pass."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._read_mono_s = float("-inf")
        self._inodes: frozenset[int] = frozenset()

    def holds(self, pid: int, wanted: set[int]) -> bool | None:
        """Whether `pid` holds every socket of `wanted` (inodes); None when its descriptors are not
        read here (gone, or more than QUICK_LOOKUP_MAX_FDS)."""
        now = time.monotonic()
        if (
            pid == self._pid
            and now - self._read_mono_s <= LAST_CLIENT_SOCKETS_KEPT_S
            and wanted <= self._inodes
        ):
            return True
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return None
        if len(fds) > QUICK_LOOKUP_MAX_FDS:
            return None
        self._pid, self._read_mono_s, self._inodes = pid, now, frozenset(_socket_inodes(pid, fds))
        return wanted <= self._inodes


_LAST_CLIENT_SOCKETS = _SocketsSeen()


def _socket_inodes(pid: int, fds: list[str]) -> list[int]:
    """The inodes of the sockets among `pid`'s descriptors `fds`."""
    return [inode for fd in fds if (inode := _socket_inode(pid, fd)) is not None]


def _owners_if_the_last_client(pairs: list[tuple[Address, Address]]) -> list[Owner] | None:
    """`_owners_of` when the process that was the last client holds every socket — a burst of
    connections usually comes from one process: one sock_diag lookup each, and that process's
    descriptors, at most QUICK_LOOKUP_MAX_FDS, read once for the burst (~1 ms for 50 connections,
    cheap enough for the event loop, where a worker thread contending for the GIL added ~6 ms to 50
    streams' first tokens). None: not so (or not Linux), ask `_owners_of` on a thread."""
    if not sys.platform.startswith("linux") or not _RECENT_PIDS:
        return None
    pid = next(reversed(_RECENT_PIDS))
    inodes = _inodes_of(pairs)
    if None in inodes:
        return None
    wanted = {inode for inode in inodes if inode}
    if wanted and not _LAST_CLIENT_SOCKETS.holds(pid, wanted):
        return None
    return [(True, pid) if inode else CLOSED for inode in inodes]


def _scan_proc(listen_port: int, first_pids: Iterable[int]) -> dict[int, int | None]:
    """`_scan` from the kernel: the sockets to the listener, then their owners (`first_pids` first)."""
    table: dict[int, int | None] = {}
    port_of: dict[int, int] = {}  # socket inode → client port
    for port, inode in _sockets_to(listen_port):
        table[port] = None  # unowned until a process holding it is found
        if inode:
            port_of[inode] = port
    for inode, pid in _holders(set(port_of), first_pids).items():
        table[port_of[inode]] = pid
    return table


def _unique(first: list[int], rest: Iterable[int]) -> Iterable[int]:
    seen = set(first)
    yield from first
    yield from (pid for pid in rest if pid not in seen)


def _proc_address(text: str, family: int) -> str:
    """An address as /proc/net/tcp writes it (hex, each 32-bit word in host order) → its text."""
    raw = bytes.fromhex(text)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, raw)


def _scan_psutil(listen_port: int) -> dict[int, int | None]:
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
    from trayapp.sources.processes import process_name  # psutil loads when a client is first named

    return process_name(pid) or f"pid {pid}"


class ClientNamer:
    """Names the clients of one listener."""

    def __init__(self) -> None:
        self._ports: dict[int, int | None] = {}  # from the last scan
        self._scanned_mono_s = float("-inf")
        self._scan_task: asyncio.Task[None] | None = None
        self._names: dict[int, tuple[str, float]] = {}  # pid → (process name, when read: monotonic s)
        self._reading: dict[int, asyncio.Future[Named]] = {}  # pid → its name being read
        self._asked: list[
            tuple[tuple[str, int], tuple[str, int], asyncio.Future[tuple[bool, int | None]]]
        ] = []
        self._owners_task: asyncio.Task[None] | None = None

    def name(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> asyncio.Future[Named]:
        """(name, pid) of the client at `peer` (the connection's peer address; `local`: its address
        on this side, for a lookup of that one socket where the system allows it). Answered from
        callbacks where that lookup tells (no task a request, issue #26), else by a scan's task."""
        port = _loopback_port(peer)
        if port is None:
            return _answered((user_agent_product(user_agent), None))
        if _loopback_port(local) is None:
            return asyncio.ensure_future(self._name_by_scan(port, listen_port, user_agent))
        assert isinstance(peer, tuple) and isinstance(local, tuple)
        named: asyncio.Future[Named] = asyncio.get_running_loop().create_future()

        def owned(owner: Owner) -> None:
            if owner == CLOSED:  # gone before its lookup (a short answer read at once): no scan finds it
                named.set_result((user_agent_product(user_agent), None))
                return
            known, pid = owner
            then = self._named_pid(pid) if known else self._name_by_scan(port, listen_port, user_agent)
            _chain(asyncio.ensure_future(then), named, named.set_result)

        _chain(self._owner(peer[:2], local[:2]), named, owned)
        return named

    async def _name_by_scan(self, port: int, listen_port: int, user_agent: str | None) -> Named:
        """`name` from a scan of every connection to the listener."""
        asked_mono_s = time.monotonic()
        for _ in range(2):  # a scan already running may have begun before this connection existed
            if port in self._ports and self._scanned_mono_s >= asked_mono_s - SCAN_FRESH_S:
                break
            await self._rescan(listen_port)
            if self._scanned_mono_s >= asked_mono_s:
                break
        if port not in self._ports:
            return user_agent_product(user_agent), None
        return await asyncio.shield(self._named_pid(self._ports[port]))  # shared: never cancelled by one

    def _owner(self, peer: Address, local: Address) -> asyncio.Future[Owner]:
        """`_owners_of` for one connection: those asked while a lookup runs go together in the next
        (one thread hop and one pass over /proc for a burst of connections, not one each)."""
        answer: asyncio.Future[Owner] = asyncio.get_running_loop().create_future()
        self._asked.append((peer, local, answer))
        if self._owners_task is None or self._owners_task.done():
            self._owners_task = asyncio.ensure_future(self._look_up_owners())
        return answer

    async def _look_up_owners(self) -> None:
        while self._asked:
            batch, self._asked = self._asked, []
            pairs = [(peer, local) for peer, local, _ in batch]
            try:
                owners = _owners_if_the_last_client(pairs)
                if owners is None:
                    owners = await asyncio.to_thread(_owners_of, pairs)
            except Exception as exc:  # a bug: every lookup of the batch raises it (NamedRecords logs it)
                for *_, answer in batch:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for (*_, answer), owner in zip(batch, owners, strict=True):
                if not answer.done():  # not given up meanwhile
                    answer.set_result(owner)

    def _named_pid(self, pid: int | None) -> asyncio.Future[Named]:
        if pid is None:
            return _answered((OTHER_USER, None))
        known = self._names.get(pid)
        if known is not None and time.monotonic() - known[1] <= NAME_KEPT_S:  # later, the pid may be reused
            return _answered((known[0], pid))
        reading = self._reading.get(pid)
        if reading is None:  # one read for a burst of connections from one process, not one each
            reading = self._reading[pid] = asyncio.ensure_future(self._read_name(pid))
            reading.add_done_callback(lambda _: self._reading.pop(pid, None))
        return reading

    async def _read_name(self, pid: int) -> Named:
        read_mono_s = time.monotonic()
        known = (await asyncio.to_thread(_process_name, pid), read_mono_s)
        self._names.pop(pid, None)
        self._names[pid] = known
        if len(self._names) > 1024:  # pids come and go: keep the newest
            self._names.pop(next(iter(self._names)))
        return known[0], pid

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
    start (`lookup`), and a record waits at most CLIENT_NAME_WAIT_S for it once its response ended
    (a callback and a timer: no task a record)."""

    def __init__(self, emit: Callable[[FinishedRequest], None]) -> None:
        self._emit = emit
        self._namer = ClientNamer()
        self._waiting: dict[asyncio.Future[Named], tuple[FinishedRequest, asyncio.TimerHandle]] = {}
        self._bugs = BugLog(log)

    def lookup(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> asyncio.Future[Named]:
        return asyncio.ensure_future(self._namer.name(peer, listen_port, user_agent, local))

    def hand_on(self, record: FinishedRequest, naming: asyncio.Future[Named] | None) -> None:
        if naming is None:
            self._emit(record)
        elif naming.done():
            self._emit_named(record, naming)
        else:
            timer = asyncio.get_running_loop().call_later(CLIENT_NAME_WAIT_S, self._give_up, naming)
            self._waiting[naming] = (record, timer)
            naming.add_done_callback(self._named)

    def _named(self, naming: asyncio.Future[Named]) -> None:
        waiting = self._waiting.pop(naming, None)
        if waiting is not None:  # else given up: its record went out unnamed
            waiting[1].cancel()
            self._emit_named(waiting[0], naming)

    def _give_up(self, naming: asyncio.Future[Named]) -> None:
        """A client unnamed is a record all the same."""
        waiting = self._waiting.pop(naming, None)
        naming.cancel()
        if waiting is not None:
            waiting[1].cancel()
            self._emit(waiting[0])

    def _emit_named(self, record: FinishedRequest, naming: asyncio.Future[Named]) -> None:
        if naming.cancelled():
            pass
        elif (exc := naming.exception()) is not None:  # a bug: logged once, the record goes out unnamed
            self._bugs.report(exc, "proxy client naming")
        else:
            name, pid = naming.result()
            record = dataclasses.replace(record, client_name=name, client_pid=pid)
        self._emit(record)

    async def close(self) -> None:
        """Every record still waiting for its name goes out, named or not."""
        if self._waiting:
            await asyncio.wait(list(self._waiting), timeout=CLIENT_NAME_WAIT_S + 1)
        for naming in list(self._waiting):
            self._give_up(naming)


def _answered(value: Named) -> asyncio.Future[Named]:
    answer: asyncio.Future[Named] = asyncio.get_running_loop().create_future()
    answer.set_result(value)
    return answer


def _chain(
    source: asyncio.Future[_T], target: asyncio.Future[Named], on_result: Callable[[_T], None]
) -> None:
    """Once `source` ends: its result to `on_result`, its failure or cancellation to `target`; nothing
    when `target` was given up on meanwhile."""

    def done(source: asyncio.Future[_T]) -> None:
        if target.done():
            return
        if source.cancelled():
            target.cancel()
        elif (exc := source.exception()) is not None:
            target.set_exception(exc)
        else:
            on_result(source.result())

    source.add_done_callback(done)


def _loopback_port(peer: object) -> int | None:
    """The client's port when `peer` is a loopback address (host, port[, …]), else None."""
    if isinstance(peer, tuple) and len(peer) >= 2 and isinstance(peer[0], str) and isinstance(peer[1], int):
        return peer[1] if is_loopback(peer[0]) else None
    return None
