"""HTTP/1.1 message framing for a pass-through proxy: heads, and where a body ends.

Nothing here re-frames: the pump forwards the bytes it read exactly as they came, and a
`BodyFramer` only says how many of them belong to the current message and which of them are
payload (chunked framing removed) for the recorder. Sans-I/O, so it is tested byte by byte.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4096


class FramingError(ValueError):
    """The peer sent something that is not HTTP/1.1 (the message says what)."""


@dataclass(frozen=True)
class Head:
    """A request or status line and its headers, with the exact bytes they came in."""

    start_line: str
    headers: tuple[tuple[str, str], ...]  # as sent (name case kept), in order
    raw: bytes  # through the blank line that ends the head

    def get(self, name: str) -> str | None:
        """The value of header `name` (any case); several are joined with ", " as RFC 9110 allows."""
        wanted = name.lower()
        values = [value for key, value in self.headers if key.lower() == wanted]
        return ", ".join(values) if values else None

    def tokens(self, name: str) -> set[str]:
        """A comma-separated header's items, lower-cased (`Connection`, `Transfer-Encoding`)."""
        value = self.get(name)
        return {item.strip().lower() for item in value.split(",") if item.strip()} if value else set()

    @property
    def version(self) -> str:
        parts = self.start_line.split(" ")
        return parts[0] if self.start_line.startswith("HTTP/") else parts[-1]

    def keep_alive(self) -> bool:
        """Whether this message lets the connection carry another (HTTP/1.1 default yes, 1.0 no)."""
        connection = self.tokens("connection")
        if "close" in connection:
            return False
        return self.version != "HTTP/1.0" or "keep-alive" in connection


def parse_head(raw: bytes) -> Head:
    """A head ending in CRLF CRLF → `Head`; FramingError when it is not HTTP."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError as exc:  # latin-1 decodes any byte; kept for clarity
        raise FramingError("undecodable head") from exc
    lines = text.split("\r\n")
    start = lines[0]
    if not start or (" " not in start):
        raise FramingError(f"not an HTTP start line: {start[:60]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise FramingError(f"malformed header line: {line[:60]!r}")
        headers.append((name, value.strip()))
    return Head(start, tuple(headers), raw)


@dataclass(frozen=True)
class RequestLine:
    method: str
    target: str  # as sent: path and query
    path: str  # without the query

    @classmethod
    def of(cls, head: Head) -> RequestLine:
        parts = head.start_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise FramingError(f"not an HTTP/1.x request line: {head.start_line[:60]!r}")
        method, target, _ = parts
        return cls(method, target, target.split("?", 1)[0].split("#", 1)[0])


def status_of(head: Head) -> int:
    """The status code of a response head."""
    parts = head.start_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise FramingError(f"not an HTTP status line: {head.start_line[:60]!r}")
    return int(parts[1])


class BodyFramer:
    """Tells where one message body ends. `feed` returns how many of the given bytes belong to
    this body and the payload among them; `done` once the body is complete."""

    done: bool = False
    until_close: bool = False  # the body ends when the sender closes (a response without length)

    def feed(self, data: bytes) -> tuple[int, bytes]:
        raise NotImplementedError


class LengthBody(BodyFramer):
    """`Content-Length: n` (or no body at all: n = 0)."""

    def __init__(self, length: int) -> None:
        self.left = length
        self.done = length == 0

    def feed(self, data: bytes) -> tuple[int, bytes]:
        taken = min(self.left, len(data))
        self.left -= taken
        self.done = self.left == 0
        return taken, data[:taken] if taken < len(data) else data


class UntilCloseBody(BodyFramer):
    """A response that ends when the server closes the connection."""

    until_close = True

    def feed(self, data: bytes) -> tuple[int, bytes]:
        return len(data), data


class ChunkedBody(BodyFramer):
    """`Transfer-Encoding: chunked`: size lines, data, CRLFs and trailers pass through untouched;
    only the data is payload."""

    def __init__(self) -> None:
        self._line = b""  # a size or trailer line read so far
        self._data_left = 0
        self._crlf_left = 0
        self._in_trailers = False

    def feed(self, data: bytes) -> tuple[int, bytes]:
        at, payload = 0, []
        while at < len(data) and not self.done:
            if self._data_left:
                take = min(self._data_left, len(data) - at)
                payload.append(data[at : at + take])
                self._data_left -= take
                at += take
                if not self._data_left:
                    self._crlf_left = 2
            elif self._crlf_left:
                take = min(self._crlf_left, len(data) - at)
                if data[at : at + take] != b"\r\n"[2 - self._crlf_left : 2 - self._crlf_left + take]:
                    raise FramingError("chunk data not followed by CRLF")
                self._crlf_left -= take
                at += take
            else:
                end = data.find(b"\n", at)
                if end < 0:
                    self._line += data[at:]
                    at = len(data)
                    if len(self._line) > MAX_CHUNK_LINE_BYTES:
                        raise FramingError("chunk size line too long")
                    break
                line, self._line = (self._line + data[at:end]).rstrip(b"\r"), b""
                at = end + 1
                self._line_done(line)
        return at, b"".join(payload)

    def _line_done(self, line: bytes) -> None:
        if self._in_trailers:
            self.done = not line  # the blank line after the trailers ends the message
            return
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise FramingError(f"bad chunk size {size_text[:20]!r}") from exc
        if size < 0:
            raise FramingError("negative chunk size")
        if size == 0:
            self._in_trailers = True
        else:
            self._data_left = size


def _content_length(head: Head) -> int:
    values = {value.strip() for name, value in head.headers if name.lower() == "content-length"}
    if len(values) != 1:
        raise FramingError("conflicting Content-Length headers")
    (value,) = values
    if not value.isdigit():
        raise FramingError(f"bad Content-Length {value[:20]!r}")
    return int(value)


def request_body(head: Head) -> BodyFramer:
    """How a request's body is framed (RFC 9112 §6.3: chunked wins; no length means no body)."""
    encodings = head.tokens("transfer-encoding")
    if encodings:
        if "chunked" not in encodings:
            raise FramingError("a request with Transfer-Encoding must be chunked")
        return ChunkedBody()
    if head.get("content-length") is not None:
        return LengthBody(_content_length(head))
    return LengthBody(0)


def response_body(head: Head, request_method: str) -> BodyFramer:
    """How a response's body is framed, given the request it answers."""
    status = status_of(head)
    if request_method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return LengthBody(0)
    if "chunked" in head.tokens("transfer-encoding"):
        return ChunkedBody()
    if head.get("content-length") is not None:
        return LengthBody(_content_length(head))
    return UntilCloseBody()
