"""Whether an address is this machine's own: every listener binds loopback unless the user asks,
and loopback traffic never goes through a proxy from the environment."""

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
