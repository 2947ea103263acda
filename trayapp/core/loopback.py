"""The one home of the address rules: whether an address is this machine's own (every listener
binds loopback unless the user asks; loopback traffic never goes through a proxy from the
environment), and when two URLs name one server. No other module compares a host with a loopback
literal (`tests/unit/test_one_rule_each.py` fails on a re-spelling)."""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit

LOOPBACK_HOST = "127.0.0.1"  # the key every name of this machine's loopback is filed under
# The names a browser or client puts in `Host` for this machine's loopback (a listener bound there
# answers only these, and the names the user adds: no DNS rebinding)
LOOPBACK_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


@functools.lru_cache(maxsize=256)  # asked once a proxied request, of the few addresses clients use
def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1 (brackets allowed, case ignored). A wildcard (0.0.0.0, ::)
    is not: a listener bound to it answers every network."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")


def is_this_machine(host: str) -> bool:
    """An address that reaches this machine's own listeners: loopback, or a wildcard (0.0.0.0, ::)
    as a server or an agent names itself when it listens on every address."""
    if is_loopback(host):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def is_this_machine_url(url: str) -> bool:
    return is_this_machine(urlsplit(url).hostname or "")


def host_key(host: str) -> str:
    """A host as a server key: case ignored, brackets dropped, IP addresses in one spelling, and
    `localhost` and ::1 filed as 127.0.0.1 (one server answering on both is the usual case)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return LOOPBACK_HOST
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address == ipaddress.IPv6Address("::1"):
            return LOOPBACK_HOST
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
    return str(address)


@functools.lru_cache(maxsize=256)  # asked for each proxied record against each server, every tick
def server_key(url: str) -> tuple[str, int | None]:
    """(host, port) of a base URL (a bare `host:port` too), the scheme's default port filled in;
    the path is not part of it. The port is None when the URL's port cannot be read."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    return host_key(parts.hostname or ""), port


def same_server(url_a: str, url_b: str) -> bool:
    """Whether two base URLs name one server: `localhost`, 127.0.0.1 and [::1] are one; a trailing
    slash, a path and the default port written out change nothing."""
    return server_key(url_a) == server_key(url_b)
