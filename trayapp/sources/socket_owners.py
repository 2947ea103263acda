"""Which process holds a loopback TCP connection's client end (the proxy names its clients by it:
services/proxy/clients.py). Linux asks the kernel for the socket (sock_diag netlink, as `ss` does;
the text of /proc/net/tcp{,6} where that is refused, ~6 ms of kernel time for a few hundred
sockets), then reads the descriptors of the processes that were clients before (a client sends many
requests) and of the others only for sockets still unowned: usually one process's descriptors, a
fraction of a millisecond. Elsewhere psutil's `net_connections`, which reads every socket of every
process (10-30 ms of Python holding the GIL on a busy host)."""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import time
from collections.abc import Iterable, Iterator

from trayapp.core.loopback import is_loopback
from trayapp.sources import sock_diag

log = logging.getLogger(__name__)

Owner = tuple[bool, int | None]  # (known, pid): see owners_of
CLOSED: Owner = (True, 0)  # the client closed its socket before the lookup: no process holds it
Address = tuple[str, int]

_RECENT_PIDS: dict[int, None] = {}  # processes that were clients lately (newest last), looked at first
_RECENT_PIDS_KEPT = 64


def scan(listen_port: int) -> dict[int, int | None]:
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


def owners_of(pairs: list[tuple[Address, Address]]) -> list[Owner]:
    """(known, pid) of each loopback client at `peer` connected to the listener at `local`: one lookup
    of each socket, then one pass over the descriptors of recent clients first for all of them (50
    connections opened at once cost one pass, not 50). (False, None): this way cannot tell (not
    Linux, sock_diag refused, or an address pair it cannot look up); (True, None): no process this
    user may read holds it; CLOSED: the client has closed it (no pass looks for those, and one that
    found no holder asks again whether the socket is still there: a client closing during the pass
    is not another user's)."""
    if not sys.platform.startswith("linux"):
        return [(False, None)] * len(pairs)
    inodes = inodes_of(pairs)
    holders = _holders({inode for inode in inodes if inode}, reversed(list(_RECENT_PIDS)))
    _remember(holders.values())
    unheld = [at for at, inode in enumerate(inodes) if inode and inode not in holders]
    if unheld:
        for at, now in zip(unheld, inodes_of([pairs[at] for at in unheld]), strict=True):
            if now == 0:
                inodes[at] = 0
    return [
        (False, None) if inode is None else CLOSED if not inode else (True, holders.get(inode))
        for inode in inodes
    ]


def inodes_of(pairs: list[tuple[Address, Address]]) -> list[int | None]:
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
        _RECENT_PIDS.pop(next(iter(_RECENT_PIDS)), None)


def _holders(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
    """Socket inode → the pid holding it, for those of `inodes` a process this user may read holds:
    `first_pids` first, then the rest of /proc newest first, this one among them (a client never seen
    is most often a process just started, a script or a `curl`, which from the oldest came after
    every descriptor of every process had been read), only while some are unfound."""
    wanted = set(inodes)
    found: dict[int, int] = {}
    if not wanted:
        return found
    for pid in _unique(list(first_pids), _all_newest_first()):
        if not wanted:
            break
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's
            _RECENT_PIDS.pop(pid, None)  # a client that has exited is not looked at first again
            continue
        for inode in _sockets_among(pid, fds, wanted):
            found[inode] = pid
    return found


def _all_newest_first() -> Iterator[int]:
    """Every process, newest first; /proc listed only once the recent clients have been read."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    yield from newest_first(pids, _last_pid(pids))


def newest_first(pids: list[int], last_pid: int) -> list[int]:
    """`pids`, the newest process first: pids count up to `last_pid`, the last one given, and wrap at
    the kernel's pid_max, so those above it are older than those below."""
    return sorted(pids, key=lambda pid: (pid <= last_pid, pid), reverse=True)


def _last_pid(pids: list[int]) -> int:
    """The pid the kernel gave last (/proc/loadavg's last field); the highest of `pids` without it."""
    try:
        with open("/proc/loadavg", encoding="ascii") as loadavg:
            return int(loadavg.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return max(pids, default=0)


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


def owners_if_the_last_client(pairs: list[tuple[Address, Address]]) -> list[Owner] | None:
    """`owners_of` when the process that was the last client holds every socket — a burst of
    connections usually comes from one process: one sock_diag lookup each, and that process's
    descriptors, at most QUICK_LOOKUP_MAX_FDS, read once for the burst (~1 ms for 50 connections,
    cheap enough for the event loop, where a worker thread contending for the GIL added ~6 ms to 50
    streams' first tokens). None: not so (or not Linux), ask `owners_of` on a thread."""
    # (read once: a worker thread's pass, for another listener, may drop an exited client meanwhile)
    pid = next(reversed(_RECENT_PIDS), None) if sys.platform.startswith("linux") else None
    if pid is None:
        return None
    inodes = inodes_of(pairs)
    if None in inodes:
        return None
    wanted = {inode for inode in inodes if inode}
    if wanted and not _LAST_CLIENT_SOCKETS.holds(pid, wanted):
        return None
    return [(True, pid) if inode else CLOSED for inode in inodes]


def _scan_proc(listen_port: int, first_pids: Iterable[int]) -> dict[int, int | None]:
    """`scan` from the kernel: the sockets to the listener, then their owners (`first_pids` first)."""
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
