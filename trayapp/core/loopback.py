"""Whether an address is this machine's own (every listener binds loopback unless the user asks;
loopback traffic never goes through a proxy from the environment), and when two URLs name one server."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1 (brackets allowed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")


def host_key(host: str) -> str:
    """A host as a server key: `localhost` and `::1` are 127.0.0.1, case ignored."""
    return "127.0.0.1" if host.lower() in ("localhost", "::1") else host.lower()


def server_key(url: str) -> tuple[str, int]:
    """(host, port) of a base URL (a bare `host:port` too), the default port filled in."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    return host_key(parts.hostname or ""), parts.port or (443 if parts.scheme == "https" else 80)
