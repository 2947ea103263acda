"""TCP sockets from the kernel by sock_diag netlink (Linux, as `ss` does): those connected to a
listening port, and one connection's socket inode (the proxy names its clients by them:
services/proxy/clients.py). Binary, and a hash lookup in the kernel for one socket: reading
/proc/net/tcp{,6} instead costs ~6 ms of kernel time for a few hundred sockets."""

from __future__ import annotations

import socket
import struct

from trayapp.core.loopback import is_loopback

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_NLMSG_HEAD = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBxI48x")  # family, protocol, extensions, states; any socket id
_DIAG_MESSAGE = struct.Struct("=BBBB2H16s16sI8xIIIII")  # inet_diag_msg (ports big-endian: swapped below)


def sockets_to(listen_port: int) -> list[tuple[int, int]]:
    """(client port, socket inode) of each loopback TCP connection to `listen_port`, from every TCP
    socket the kernel lists (linux/inet_diag.h), in binary; OSError where sock_diag is refused."""
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


_TWO_SECONDS = struct.pack("ll", 2, 0)  # struct timeval


class Link:
    """One sock_diag socket for a burst of one-socket lookups (`with Link() as link`: one socket
    opened and closed for them all, not one each); OSError where sock_diag is refused."""

    def __init__(self) -> None:
        self._link = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
        try:  # the kernel's own timeout: a blocking recv, not a poll before each as settimeout's
            self._link.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TWO_SECONDS)
        except OSError:
            self._link.close()
            raise

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *_: object) -> None:
        self._link.close()

    def inode_of(self, family: int, src: str, sport: int, dst: str, dport: int) -> int:
        """The inode of the TCP socket bound to (src, sport) and connected to (dst, dport), by one
        sock_diag lookup (a hash lookup in the kernel); 0 when no process holds one any more: none
        there (closed and gone), or one its process has closed (FIN_WAIT2, TIME_WAIT: the kernel's
        own inode 0)."""
        size = 4 if family == socket.AF_INET else 16
        ids = (socket.inet_pton(family, src).ljust(16, b"\0"), socket.inet_pton(family, dst).ljust(16, b"\0"))
        no_cookie = (0xFFFFFFFF, 0xFFFFFFFF)
        ports = (socket.htons(sport), socket.htons(dport))
        request = _DIAG_EXACT.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF, *ports, *ids, 0, *no_cookie)
        head = _NLMSG_HEAD.pack(_NLMSG_HEAD.size + len(request), _SOCK_DIAG_BY_FAMILY, 0x1, 1, 0)
        self._link.send(head + request)
        data = self._link.recv(1 << 12)
        kind = _NLMSG_HEAD.unpack_from(data)[1]
        if kind == _NLMSG_ERROR:
            return 0  # ENOENT: no such socket
        fields = _DIAG_MESSAGE.unpack_from(data, _NLMSG_HEAD.size)
        if socket.ntohs(fields[4]) != sport or fields[6][:size] != ids[0][:size]:
            raise OSError("sock_diag answered another socket")
        inode: int = fields[-1]
        return inode
