"""One HTTP/1.1 GET on a connected socket, read as `http.client` reads it but without its objects.

`LoopbackGetter` (sources/http.py) asks a server on this machine a few small GETs a tick: through
`http.client` one costs ~0.5 ms of CPU with a fresh connection, most of it in building a request,
an `HTTPResponse` and an `email` message of the headers (issue #26). The reading here keeps
`http.client`'s rules: a status line "HTTP/1.x NNN", 100 Continue skipped, at most MAX_HEADERS
header lines of at most MAX_LINE_BYTES, a body by Transfer-Encoding chunked, else Content-Length,
else to the close (none for 1xx, 204 and 304), and the connection kept only when HTTP/1.1 says so.
Failures raise `http.client`'s own exceptions, so the caller maps them as before.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from typing import Protocol

MAX_LINE_BYTES = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
RECV_BYTES = 64 * 1024


class Receiver(Protocol):
    def recv(self, bufsize: int, /) -> bytes: ...


class BodyTooLarge(Exception):
    """The body is longer than the caller's limit (read no further)."""


@dataclass(frozen=True)
class WireResponse:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header's values joined with ", "
    body: bytes
    keep_alive: bool  # the connection may carry the next request


def get_request(target: str, headers: dict[str, str]) -> bytes:
    """The bytes of `GET target HTTP/1.1` with `headers`; ValueError for a control character in one,
    as `http.client` refuses them (no header or request smuggled in through a value)."""
    lines = [f"GET {target} HTTP/1.1", *(f"{name}: {value}" for name, value in headers.items())]
    for line in lines:
        if "\r" in line or "\n" in line or "\0" in line:
            raise ValueError(f"invalid request line or header: {line!r}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Reader:
    """Buffered reads from a `recv`: lines and byte counts."""

    def __init__(self, source: Receiver) -> None:
        self._source = source
        self._buffer = b""
        self.ended = False  # the peer closed its end

    def _fill(self) -> bool:
        data = self._source.recv(RECV_BYTES)
        if not data:
            self.ended = True
            return False
        self._buffer += data
        return True

    def line(self) -> bytes:
        """The next line with its ending (what is left, without one, at the close)."""
        while True:
            end = self._buffer.find(b"\n", 0, MAX_LINE_BYTES + 1)
            if end >= 0:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line
            if len(self._buffer) > MAX_LINE_BYTES:
                raise http.client.LineTooLong("header line")
            if not self._fill():
                line, self._buffer = self._buffer, b""
                return line

    def exactly(self, size: int) -> bytes:
        """`size` bytes; IncompleteRead when the peer closes first."""
        chunks = [self._buffer]
        have = len(self._buffer)
        while have < size:
            data = self._source.recv(RECV_BYTES)
            if not data:
                self.ended, self._buffer = True, b""
                raise http.client.IncompleteRead(b"".join(chunks), size - have)
            chunks.append(data)
            have += len(data)
        joined = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._buffer = joined[size:]
        return joined[:size]

    def to_close(self, max_bytes: int) -> bytes:
        """Everything up to the peer's close; BodyTooLarge past `max_bytes`."""
        chunks = [self._buffer]
        size = len(self._buffer)
        self._buffer = b""
        while size <= max_bytes:
            data = self._source.recv(RECV_BYTES)
            if not data:
                self.ended = True
                return b"".join(chunks)
            chunks.append(data)
            size += len(data)
        raise BodyTooLarge

    def leftover(self) -> bool:
        return bool(self._buffer)


def read_head(source: Receiver) -> tuple[_Reader, int, bool, dict[str, str]]:
    """(the reader, the status, whether HTTP/1.1, the headers) of the response arriving on `source`."""
    reader = _Reader(source)
    while True:
        status, http11 = _status_line(reader.line())
        headers = _headers(reader)
        if status != 100:  # http.client skips a 100 Continue and its headers
            return reader, status, http11, headers


def read_body(
    reader: _Reader, status: int, http11: bool, headers: dict[str, str], max_bytes: int
) -> tuple[bytes, bool]:
    """(the body, whether the connection may be kept) after `read_head`; BodyTooLarge past
    `max_bytes`, IncompleteRead for a body cut short."""
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if http11 else "keep-alive" in connection
    if status in (204, 304) or 100 <= status < 200:
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = _chunked(reader, max_bytes)
    else:
        length = _content_length(headers)
        if length is None:
            return reader.to_close(max_bytes), False
        if length > max_bytes:
            raise BodyTooLarge
        body = reader.exactly(length)
    return body, keep_alive and not reader.ended and not reader.leftover()


def read_response(source: Receiver, max_bytes: int) -> WireResponse:
    """The whole response arriving on `source` (see `read_head` and `read_body`)."""
    reader, status, http11, headers = read_head(source)
    body, keep_alive = read_body(reader, status, http11, headers, max_bytes)
    return WireResponse(status, headers, body, keep_alive)


def _status_line(raw: bytes) -> tuple[int, bool]:
    if not raw:  # closed before a byte of the answer: a kept connection the server had closed
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    line = raw.decode("iso-8859-1").rstrip("\r\n")
    version, _, rest = line.partition(" ")
    code, _, _ = rest.strip().partition(" ")
    if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
        raise http.client.BadStatusLine(line)
    status = int(code)
    if status < 100:
        raise http.client.BadStatusLine(line)
    return status, version != "HTTP/1.0"


def _headers(reader: _Reader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = reader.line()
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("iso-8859-1").partition(":")
        key, value = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def _content_length(headers: dict[str, str]) -> int | None:
    """Content-Length as http.client takes it: None when absent, not a number, or negative."""
    text = headers.get("content-length")
    if text is None:
        return None
    try:
        length = int(text)
    except ValueError:
        return None
    return length if length >= 0 else None


def _chunked(reader: _Reader, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        line = reader.line()
        if not line:
            raise http.client.IncompleteRead(b"".join(chunks))
        try:
            chunk_bytes = int(line.split(b";", 1)[0], 16)
        except ValueError as exc:
            raise http.client.IncompleteRead(b"".join(chunks)) from exc
        if chunk_bytes == 0:
            while reader.line() not in (b"\r\n", b"\n", b""):  # trailers: passed over
                pass
            return b"".join(chunks)
        size += chunk_bytes
        if size > max_bytes:
            raise BodyTooLarge
        chunks.append(reader.exactly(chunk_bytes))
        reader.exactly(2)  # the chunk's CRLF
