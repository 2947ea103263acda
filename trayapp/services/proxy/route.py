"""One proxy route: where it listens, what it forwards to, and who may use it."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from trayapp.core.loopback import is_loopback
from trayapp.services.proxy.http1 import Head

_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # what a bearer credential can carry in any client


@dataclass(frozen=True)
class Route:
    """Listen on `listen_host:listen_port`, forward to `upstream_url` (a server of `server_kind`)."""

    listen_host: str
    listen_port: int
    upstream_url: str
    server_kind: str = "openai"
    token: str | None = None  # required from clients when set (always set off loopback)

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"upstream must be an http:// URL (local servers speak plain HTTP): {self.upstream_url}"
            )
        if not is_loopback(self.listen_host) and not self.token:
            raise ValueError(f"listening on {self.listen_host} (not loopback) needs a token")
        if self.token is not None and not _TOKEN_CHARS.fullmatch(self.token):
            raise ValueError(
                "the proxy's client token must be printable ASCII without spaces (clients send it as "
                "an HTTP bearer credential): set another value"
            )

    @property
    def upstream_host(self) -> str:
        return urlsplit(self.upstream_url).hostname or "127.0.0.1"

    @property
    def upstream_port(self) -> int:
        return urlsplit(self.upstream_url).port or 80

    def authorized_head(self, head: Head) -> Head | None:
        """The head to forward when the client may use the proxy (our token removed), else None.
        `Authorization` is forwarded unless it carries our token (it is then ours, not the
        upstream's API key); `Proxy-Authorization`, for this hop only, never is (http1.normalised
        leaves it out of every forwarded head)."""
        token = self.token
        if token is None:
            return head
        wanted = token.encode()
        ours: set[str] = set()
        for key, value in head.headers:
            scheme, _, credential = value.partition(" ")
            name = key.lower()
            if (
                name in ("proxy-authorization", "authorization")
                and scheme.lower() == "bearer"
                and hmac.compare_digest(credential.strip().encode("latin-1"), wanted)
            ):
                ours.add(name)
        if not ours:
            return None
        headers = tuple((key, value) for key, value in head.headers if key.lower() not in ours)
        return Head(head.start_line, headers, b"")
