"""HTTP/1.1 message framing for a pass-through proxy: heads, and where a body ends.

Bodies are never re-framed: the pump forwards the bytes it read exactly as they came, and a
`BodyFramer` only says how many of them belong to the current message and which of them are
payload (chunked framing removed) for the recorder. A request head goes up rebuilt (`normalised`:
one header per line, its framing stated once). Strict where lenient servers differ (RFC 9112, issue
#25): whatever two parsers could end at different bytes raises FramingError, so it is refused, never
forwarded (tests/unit/test_proxy_framing_fuzz.py holds this against h11). Sans-I/O, so it is tested
byte by byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from trayapp.services.proxy.limits import MAX_CHUNK_LINE_BYTES, MAX_HEAD_BYTES


class FramingError(ValueError):
    """The peer sent something that is not HTTP/1.1 (the message says what)."""


@dataclass(frozen=True)
class Head:
    """A request or status line and its headers, with the exact bytes they came in."""

    start_line: str
    headers: tuple[tuple[str, str], ...]  # as sent (name case kept), in order
    raw: bytes  # through the blank line that ends the head (b"" in one the proxy made, not yet sent)

    by_name: dict[str, list[str]] = field(init=False, repr=False, compare=False)
    """Each header's values in order, under its lower-cased name."""

    def __post_init__(self) -> None:
        index: dict[str, list[str]] = {}
        for key, value in self.headers:
            name = key.lower()
            if name in index:
                index[name].append(value)
            else:
                index[name] = [value]
        object.__setattr__(self, "by_name", index)  # frozen: set once, here

    def get(self, name: str) -> str | None:
        """The value of header `name` (any case); several are joined with ", " as RFC 9110 allows."""
        values = self.by_name.get(name.lower())
        return (values[0] if len(values) == 1 else ", ".join(values)) if values else None

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
    """A head ending in CRLF CRLF → `Head`; FramingError when it is not strict HTTP/1.1 (RFC 9112):
    every line ends in CRLF (a bare CR or LF is refused, not read as a line end as lenient servers
    do), no line folding, header names are tokens, values hold no control characters."""
    if not raw.endswith(b"\r\n\r\n"):
        raise FramingError("a head must end with an empty line (CRLF CRLF)")
    start, _, block = raw[:-2].decode("latin-1").partition("\r\n")  # each header line ends in CRLF
    if start and _START_LINE.fullmatch(start) and " " in start and _HEADER_BLOCK.fullmatch(block):
        return Head(start, tuple(_HEADER_FIELD.findall(block)), raw)  # a few C calls, whatever its length
    return _parse_head_line_by_line(raw)  # says what is wrong


def _parse_head_line_by_line(raw: bytes) -> Head:
    """`parse_head`, a line at a time: the same rules, and the FramingError naming the bad line."""
    text = raw[:-4].decode("latin-1")  # latin-1 decodes any byte: the bytes are checked below
    lines = text.split("\r\n")
    start = lines[0]
    if not start or (" " not in start) or not _START_LINE.fullmatch(start):
        raise FramingError(f"not an HTTP start line: {start[:60]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise FramingError(f"malformed header line: {line[:60]!r}")
        if not _FIELD_VALUE.fullmatch(value):
            raise FramingError(f"control character in header {name[:40]!r}")
        headers.append((name, value.strip(" \t")))
    return Head(start, tuple(headers), raw)


# RFC 9110 §5.6.2 token; field values are visible characters, spaces, tabs and obs-text (no CTLs).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_START_LINE = re.compile(r"[\x21-\x7e\x80-\xff]+ [^\x00-\x08\x0a-\x1f\x7f]*")
# Every header line of a head at once, by the same rules (a token, a colon, a field value, CRLF);
# then each line's name and value, the value's surrounding spaces and tabs left out
_HEADER_BLOCK = re.compile(r"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")
_HEADER_FIELD = re.compile(r"([^:\r\n]+):[ \t]*([^\r\n]*?)[ \t]*\r\n")
_HEXDIG = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,18}")


class RequestLine(NamedTuple):  # (a tuple: made in one call, on every request's way up)
    method: str
    target: str  # as sent: path and query
    path: str  # without the query

    @classmethod
    def of(cls, head: Head) -> RequestLine:
        parts = _REQUEST_LINE.fullmatch(head.start_line)
        if parts is None:
            raise FramingError(f"not an HTTP/1.x request line: {head.start_line[:60]!r}")
        return cls(*parts.groups())


# A method (a token), a target of visible ASCII without spaces (RFC 9112 §3.2) whose path ends at its
# first "?" or "#", and the version
_REQUEST_LINE = re.compile(
    r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) "
    r"((?=[\x21-\x7e])([\x21\x22\x24-\x3e\x40-\x7e]*)[\x21-\x7e]*) HTTP/1\.[01]"
)


def status_of(head: Head) -> int:
    """The status code of a response head (`HTTP/1.x NNN reason`); FramingError otherwise."""
    parts = head.start_line.split(" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in ("HTTP/1.1", "HTTP/1.0")
        or len(parts[1]) != 3
        or not _DIGITS.fullmatch(parts[1])
        or parts[1][0] == "0"
    ):
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
        self._trailer_bytes = 0

    def feed(self, data: bytes) -> tuple[int, bytes]:
        if not (self._line or self._data_left or self._crlf_left or self._in_trailers or self.done):
            whole = _one_whole_chunk(data)
            if whole is not None:  # a streamed token's usual read, framed in a few C calls (issue #26)
                return len(data), whole
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
                line, self._line = self._line + data[at:end], b""
                at = end + 1
                if len(line) > MAX_CHUNK_LINE_BYTES:
                    raise FramingError("chunk size line too long")
                if not line.endswith(b"\r") or b"\r" in line[:-1]:
                    raise FramingError("a chunk line must end with CRLF (a bare LF or CR is refused)")
                self._line_done(line[:-1])
        return at, b"".join(payload)

    def _line_done(self, line: bytes) -> None:
        if self._in_trailers:
            if not line:
                self.done = True  # the blank line after the trailers ends the message
                return
            self._trailer_bytes += len(line)
            if self._trailer_bytes > MAX_HEAD_BYTES:
                raise FramingError("trailers larger than 64 KiB")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
                raise FramingError(f"malformed trailer line {line[:40]!r}")
            return
        size_text, semicolon, extension = line.partition(b";")
        if not _HEXDIG.fullmatch(size_text) or (semicolon and not _CHUNK_EXT.fullmatch(extension)):
            raise FramingError(f"bad chunk size line {line[:20]!r} (1 to 16 hex digits, then ;extensions)")
        size = int(size_text, 16)
        if size == 0:
            self._in_trailers = True
        else:
            self._data_left = size


_CHUNK_EXT = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")


def _one_whole_chunk(data: bytes) -> bytes | None:
    """The payload of `data` when it is exactly one chunk of data with a plain size line (`1a` CRLF,
    the data, CRLF), else None: the general path reads it (extensions, the last chunk, several chunks
    or part of one in a read, anything malformed). Read by the same rules as the general path."""
    eol = data.find(b"\r\n", 0, 18)  # at most 16 hex digits before it
    if eol <= 0 or not _HEXDIG.fullmatch(data, 0, eol):
        return None
    start = eol + 2
    end = start + int(data[:eol], 16)
    if end == start or len(data) != end + 2 or not data.endswith(b"\r\n"):
        return None
    return data[start:end]


def _content_length(head: Head) -> int:
    """The one Content-Length: ASCII digits only; repeated (as headers or a list) only if equal."""
    values = {item.strip(" \t") for value in head.by_name["content-length"] for item in value.split(",")}
    if len(values) != 1:
        raise FramingError("conflicting Content-Length values")
    (value,) = values
    if not _DIGITS.fullmatch(value):
        raise FramingError(f"bad Content-Length {value[:20]!r} (ASCII digits only)")
    return int(value)


def _is_chunked(head: Head) -> bool:
    """Transfer-Encoding is absent (False) or exactly `chunked` (True); FramingError for anything
    else (RFC 9112 §6.1: chunked must be the final coding; this proxy knows no other coding, and a
    list or a second header is how requests are smuggled past a lenient server)."""
    values = head.by_name.get("transfer-encoding")
    if not values:
        return False
    if len(values) != 1 or values[0].strip(" \t").lower() != "chunked":
        raise FramingError(f"unsupported Transfer-Encoding {', '.join(values)[:40]!r} (only chunked)")
    if head.get("content-length") is not None:
        raise FramingError("both Transfer-Encoding and Content-Length (RFC 9112 §6.3)")
    return True


def request_body(head: Head) -> BodyFramer:
    """How a request's body is framed (RFC 9112 §6.3); FramingError for anything ambiguous."""
    if _is_chunked(head):
        if head.version == "HTTP/1.0":
            raise FramingError("chunked is not HTTP/1.0")
        return ChunkedBody()
    if head.get("content-length") is not None:
        return LengthBody(_content_length(head))
    return LengthBody(0)


def response_body(head: Head, request_method: str, status: int | None = None) -> BodyFramer:
    """How a response's body is framed, given the request it answers (and the head's `status_of`,
    when read already); FramingError (the proxy answers 502) for a response whose end is ambiguous."""
    if status is None:
        status = status_of(head)
    chunked = _is_chunked(head)  # checked even where the body is empty: a client may read them
    length = _content_length(head) if head.get("content-length") is not None else None
    if request_method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return LengthBody(0)
    if chunked:
        return ChunkedBody()
    if length is not None:
        return LengthBody(length)
    return UntilCloseBody()


_HOP_BY_HOP_FRAMING = ("content-length", "transfer-encoding")
# The headers for this hop only, never passed to the next: a connection's own (RFC 9110 §7.6.1:
# `Connection` and the names it lists, and the ones meant that way whether listed or not; an
# upgraded connection is not something this proxy carries), and the credentials a client gives a
# proxy (`Proxy-Authorization`, RFC 9110 §11.7.2: the upstream is a server, not a proxy). Framing and
# Host are never dropped as a hop's: a request's framing is stated again, a response's body is
# forwarded as framed, and a request needs its Host.
_HOP_OWN = frozenset({"connection", "proxy-connection", "keep-alive", "upgrade", "proxy-authorization"})
_NEVER_HOP_OWN = frozenset({*_HOP_BY_HOP_FRAMING, "host"})


def hop_own(head: Head) -> frozenset[str]:
    """The (lower-case) names of `head`'s headers that are for this hop only, not its message."""
    if "connection" not in head.by_name:
        return _HOP_OWN
    return (_HOP_OWN | head.tokens("connection")) - _NEVER_HOP_OWN


def normalised(head: Head, framer: BodyFramer, drop: tuple[str, ...] = ()) -> Head:
    """The request head to forward: its start line and headers rebuilt one per line, the framing
    stated once (`Transfer-Encoding: chunked`, or one `Content-Length`), the headers for this hop only
    (`hop_own`: a client's `Connection: close` would close the connection the proxy keeps to the
    upstream) and the headers named in `drop` left out. A head that already is so (the usual one)
    goes up as it came."""
    if head.raw and not drop and _goes_up_as_it_came(head, framer):  # (b"": a head the proxy made)
        return head
    if head.raw and not drop and _only_connection_own(head, framer):
        # The usual head rebuilt (a client's `Connection: close`): its own lines left out of its bytes
        kept = tuple(pair for pair in head.headers if pair[0].lower() not in _HOP_OWN)
        return Head(head.start_line, kept, _HOP_OWN_LINE.sub(b"", head.raw))
    skipped = {*_HOP_BY_HOP_FRAMING, *hop_own(head), *drop}
    headers = [(key, value) for key, value in head.headers if key.lower() not in skipped]
    if isinstance(framer, ChunkedBody):
        headers.append(("Transfer-Encoding", "chunked"))
    elif head.get("content-length") is not None and isinstance(framer, LengthBody):
        headers.append(("Content-Length", str(_content_length(head))))
    raw = head.start_line + "\r\n" + "".join(f"{key}: {value}\r\n" for key, value in headers) + "\r\n"
    return Head(head.start_line, tuple(headers), raw.encode("latin-1"))


def usual_request(raw: bytes) -> tuple[bytes, int] | None:
    """A usual request head → (its bytes as they go up, its body's length), read in a few calls on its
    bytes before anything is made of them: such a request goes up before its head is parsed (issue
    #26: `parse_head`, `request_body` and `normalised` cost ~0.1 ms cold before its first byte went
    up). Usual: HTTP/1.1, every line by `parse_head`'s rules and the request line by `RequestLine`'s,
    its body framed by one Content-Length in its one form (or none), and nothing for this hop but a
    `Connection: close` or `keep-alive` and the hop's own headers (cut out, as `normalised` cuts
    them). None for any other head, which is read the whole way before a byte of it goes up. Where
    this gives bytes, the whole way gives the same (tests/unit/test_proxy_framing_fuzz.py)."""
    if _USUAL_REQUEST.fullmatch(raw) is None:
        return None
    length = None
    cut = False  # a line of the hop's own to cut out
    for name, value in _FRAMING_OR_HOP_FIELD.findall(raw):
        name = name.lower()
        if name == b"content-length":
            if length is not None or _PLAIN_LENGTH.fullmatch(value) is None:
                return None
            length = int(value)
        elif name == b"connection":
            if value.lower() not in _CONNECTION_OPTION_BYTES:  # (a list, or names: the whole way)
                return None
            cut = True
        elif name in _HOP_OWN_BYTES:
            cut = True
        else:  # Transfer-Encoding; a header named `close` (which `Connection: close` names)
            return None
    return (_HOP_OWN_LINE.sub(b"", raw) if cut else raw), length or 0


_TOKEN_BYTES = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# `parse_head`'s rules on bytes (latin-1 decodes each byte to the same code point), the request line
# `RequestLine`'s (HTTP/1.1 only)
_USUAL_REQUEST = re.compile(
    _TOKEN_BYTES + rb" [\x21-\x7e]+ HTTP/1\.1\r\n(?:" + _TOKEN_BYTES + rb":[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
)
_FRAMING_OR_HOP_FIELD = re.compile(  # each such line's name and value, the value's spaces and tabs left out
    rb"\r\n(content-length|transfer-encoding|close|"
    + b"|".join(re.escape(name.encode()) for name in sorted(_HOP_OWN))
    + rb"):[ \t]*([^\r\n]*?)[ \t]*(?=\r\n)",
    re.IGNORECASE,
)
_PLAIN_LENGTH = re.compile(rb"0|[1-9][0-9]{0,17}")  # `_DIGITS`, in its one form
_CONNECTION_OPTION_BYTES = (b"close", b"keep-alive")
_HOP_OWN_BYTES = frozenset(name.encode() for name in _HOP_OWN)


def _goes_up_as_it_came(head: Head, framer: BodyFramer) -> bool:
    """Nothing for this hop only in it, and its framing stated once in its one form."""
    return _HOP_OWN.isdisjoint(head.by_name) and _framed_once(head, framer)


def _only_connection_own(head: Head, framer: BodyFramer) -> bool:
    """Its framing stated once in its one form, and no header named in `Connection` but the usual
    (`close`, `keep-alive`): only the lines of `_HOP_OWN` are for this hop."""
    usual = head.tokens("connection") <= _CONNECTION_OPTIONS and "close" not in head.by_name
    return usual and _framed_once(head, framer)


_CONNECTION_OPTIONS = frozenset({"close", "keep-alive"})
# A header line of `_HOP_OWN` in a head's bytes (its value holds no CR or LF: parse_head's rules)
_HOP_OWN_LINE = re.compile(
    rb"(?<=\r\n)(?:" + b"|".join(re.escape(name.encode()) for name in sorted(_HOP_OWN)) + rb"):[^\r\n]*\r\n",
    re.IGNORECASE,
)


def _framed_once(head: Head, framer: BodyFramer) -> bool:
    """Its framing stated once in its one form."""
    names = head.by_name
    if isinstance(framer, ChunkedBody):
        return names["transfer-encoding"] == ["chunked"] and "content-length" not in names
    if not isinstance(framer, LengthBody) or "transfer-encoding" in names:
        return False
    lengths = names.get("content-length")
    if lengths is None:
        return True
    return len(lengths) == 1 and bool(_DIGITS.fullmatch(lengths[0])) and str(int(lengths[0])) == lengths[0]
