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

from trayapp.config.bugs import BugLog
from trayapp.core.loopback import is_loopback
from trayapp.core.model import FinishedRequest
from trayapp.core.vram_holders import OTHER_USER

log = logging.getLogger(__name__)

CLIENT_NAME_WAIT_S = 2.0  # a record waits at most this for its client's name after the response ends
NAME_KEPT_S = 30.0  # a process's name is read again after this: its pid may belong to another by then
SCAN_FRESH_S = 5.0  # a scan's answers name connections opened up to this long before another scan
_PRODUCT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")

Named = tuple[str | None, int | None]  # (name, pid)
Owner = tuple[bool, int | None]  # (known, pid): see _owners_of
Address = tuple[str, int]


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
        return _diag_sockets_to(listen_port)
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


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_NLMSG_HEAD = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBxI48x")  # family, protocol, extensions, states; any socket id
_DIAG_MESSAGE = struct.Struct("=BBBB2H16s16sI8xIIIII")  # inet_diag_msg (ports big-endian: swapped below)


def _diag_sockets_to(listen_port: int) -> list[tuple[int, int]]:
    """`_sockets_to` by sock_diag netlink (linux/inet_diag.h): every TCP socket, in binary."""
    found: list[tuple[int, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(2.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
            head = _NLMSG_HEAD.pack(
                _NLMSG_HEAD.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
            )
            link.send(head + request)
            done = False
            while not done:
                data = link.recv(1 << 16)
                at = 0
                while at + _NLMSG_HEAD.size <= len(data):
                    length, kind = _NLMSG_HEAD.unpack_from(data, at)[:2]
                    if kind == _NLMSG_DONE:
                        done = True
                        break
                    if kind == _NLMSG_ERROR or length < _NLMSG_HEAD.size:
                        raise OSError("sock_diag answered an error")
                    fields = _DIAG_MESSAGE.unpack_from(data, at + _NLMSG_HEAD.size)
                    sport, dport, src, inode = (
                        socket.ntohs(fields[4]),
                        socket.ntohs(fields[5]),
                        fields[6],
                        fields[-1],
                    )
                    size = 4 if family == socket.AF_INET else 16
                    if dport == listen_port and is_loopback(socket.inet_ntop(family, src[:size])):
                        found.append((sport, inode))
                    at += (length + 3) & ~3
                if not data:
                    raise OSError("sock_diag closed")
    return found


_DIAG_EXACT = struct.Struct("=BBBxI2H16s16sI2I")  # inet_diag_req_v2 naming one socket (ports big-endian)


def _diag_inode(family: int, src: str, sport: int, dst: str, dport: int) -> int | None:
    """The inode of the TCP socket bound to (src, sport) and connected to (dst, dport), by one
    sock_diag lookup (a hash lookup in the kernel); None when there is none (gone meanwhile)."""
    size = 4 if family == socket.AF_INET else 16
    ids = (socket.inet_pton(family, src).ljust(16, b"\0"), socket.inet_pton(family, dst).ljust(16, b"\0"))
    no_cookie = (0xFFFFFFFF, 0xFFFFFFFF)
    request = _DIAG_EXACT.pack(
        family,
        socket.IPPROTO_TCP,
        0,
        0xFFFFFFFF,
        socket.htons(sport),
        socket.htons(dport),
        *ids,
        0,
        *no_cookie,
    )
    head = _NLMSG_HEAD.pack(_NLMSG_HEAD.size + len(request), _SOCK_DIAG_BY_FAMILY, 0x1, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(2.0)
        link.send(head + request)
        data = link.recv(1 << 12)
    kind = _NLMSG_HEAD.unpack_from(data)[1]
    if kind == _NLMSG_ERROR:
        return None  # ENOENT: no such socket
    fields = _DIAG_MESSAGE.unpack_from(data, _NLMSG_HEAD.size)
    if socket.ntohs(fields[4]) != sport or fields[6][:size] != ids[0][:size]:
        raise OSError("sock_diag answered another socket")
    inode: int = fields[-1]
    return inode or None


def _owners_of(pairs: list[tuple[Address, Address]]) -> list[Owner]:
    """(known, pid) of each loopback client at `peer` connected to the listener at `local`: one lookup
    of each socket, then one pass over the descriptors of recent clients first for all of them (50
    connections opened at once cost one pass, not 50). (False, None): this way cannot tell (not
    Linux, sock_diag refused, or an address pair it cannot look up); (True, None): no process this
    user may read holds it."""
    if not sys.platform.startswith("linux"):
        return [(False, None)] * len(pairs)
    inodes = [_inode_of(peer, local) for peer, local in pairs]
    holders = _holders({inode for inode in inodes if inode is not None}, reversed(list(_RECENT_PIDS)))
    _remember(holders.values())
    return [(False, None) if inode is None else (True, holders.get(inode)) for inode in inodes]


def _inode_of(peer: Address, local: Address) -> int | None:
    """The inode of the client's socket, by one sock_diag lookup; None when gone, or when this way
    cannot tell (asked in the wrong family for a v4-mapped address, sock_diag refused)."""
    src, dst = peer[0].split("%")[0], local[0].split("%")[0]
    if src.startswith("::ffff:") and dst.startswith("::ffff:"):  # an IPv4 client of a dual-stack listener
        src, dst = src[7:], dst[7:]
    family = socket.AF_INET6 if ":" in src else socket.AF_INET
    try:
        return _diag_inode(family, src, peer[1], dst, local[1])
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
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor, for one)
            continue
        if link.startswith("socket:[") and (inode := int(link[8:-1])) in wanted:
            wanted.discard(inode)
            held.append(inode)
            if not wanted:
                break
    return held


QUICK_LOOKUP_MAX_FDS = 256  # the last client's descriptors are read on the event loop up to this many


def _owners_if_the_last_client(pairs: list[tuple[Address, Address]]) -> list[Owner] | None:
    """`_owners_of` when the process that was the last client holds every socket — a burst of
    connections usually comes from one process: one sock_diag lookup each, and that process's
    descriptors, at most QUICK_LOOKUP_MAX_FDS (~1 ms for 50 connections, cheap enough for the event
    loop, where a worker thread contending for the GIL added ~6 ms to 50 streams' first tokens).
    None: not so (or not Linux), ask `_owners_of` on a thread."""
    if not sys.platform.startswith("linux") or not _RECENT_PIDS:
        return None
    pid = next(reversed(_RECENT_PIDS))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    if len(fds) > QUICK_LOOKUP_MAX_FDS:
        return None
    inodes = [_inode_of(peer, local) for peer, local in pairs]
    wanted = {inode for inode in inodes if inode is not None}
    if len(wanted) < len(inodes) or len(_sockets_among(pid, fds, set(wanted))) < len(wanted):
        return None
    return [(True, pid)] * len(pairs)


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
        self._asked: list[
            tuple[tuple[str, int], tuple[str, int], asyncio.Future[tuple[bool, int | None]]]
        ] = []
        self._owners_task: asyncio.Task[None] | None = None

    async def name(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> Named:
        """(name, pid) of the client at `peer` (the connection's peer address; `local`: its address
        on this side, for a lookup of that one socket where the system allows it)."""
        port = _loopback_port(peer)
        if port is None:
            return user_agent_product(user_agent), None
        if _loopback_port(local) is not None:
            assert isinstance(peer, tuple) and isinstance(local, tuple)
            known, pid = await self._owner(peer[:2], local[:2])
            if known:
                return await self._named_pid(pid)
        asked_mono_s = time.monotonic()
        for _ in range(2):  # a scan already running may have begun before this connection existed
            if port in self._ports and self._scanned_mono_s >= asked_mono_s - SCAN_FRESH_S:
                break
            await self._rescan(listen_port)
            if self._scanned_mono_s >= asked_mono_s:
                break
        if port not in self._ports:
            return user_agent_product(user_agent), None
        return await self._named_pid(self._ports[port])

    async def _owner(self, peer: Address, local: Address) -> Owner:
        """`_owners_of` for one connection: those asked while a lookup runs go together in the next
        (one thread hop and one pass over /proc for a burst of connections, not one each)."""
        answer: asyncio.Future[Owner] = asyncio.get_running_loop().create_future()
        self._asked.append((peer, local, answer))
        if self._owners_task is None or self._owners_task.done():
            self._owners_task = asyncio.ensure_future(self._look_up_owners())
        return await answer

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

    async def _named_pid(self, pid: int | None) -> Named:
        if pid is None:
            return OTHER_USER, None
        known = self._names.get(pid)
        if known is None or time.monotonic() - known[1] > NAME_KEPT_S:  # a pid is reused by another process
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
    start (`lookup`), and a record waits at most CLIENT_NAME_WAIT_S for it once its response ended."""

    def __init__(self, emit: Callable[[FinishedRequest], None]) -> None:
        self._emit = emit
        self._namer = ClientNamer()
        self._waiting: set[asyncio.Task[None]] = set()
        self._bugs = BugLog(log)

    def lookup(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> asyncio.Future[Named]:
        return asyncio.ensure_future(self._namer.name(peer, listen_port, user_agent, local))

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
        except asyncio.TimeoutError:  # a client unnamed is a record all the same
            naming.cancel()
        except Exception as exc:  # a bug in the naming: logged once, the record goes out unnamed
            self._bugs.report(exc, "proxy client naming")
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
