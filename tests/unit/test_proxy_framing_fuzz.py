"""Fuzz the proxy's framing against a strict reference parser, h11 (issue #25).

Hypothesis writes requests and responses from pieces that smuggling attacks use (Transfer-Encoding
lists, duplicated or odd Content-Lengths, bare LF / CR line ends, chunk sizes like `1_0`, `+a`, ` a`,
chunk extensions, trailers) beside well-formed ones, with a second request behind each. The rule:
whenever the proxy would forward a message, h11 must end it at the same byte with the same body —
on the bytes as the client sent them and on the bytes the proxy forwards (its normalised head and the
body). The proxy may refuse more than h11 does, never less. Bounded: 300 examples per test and a
20 s cap on the whole module's fuzzing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trayapp.services.proxy.http1 import (
    ChunkedBody,
    FramingError,
    LengthBody,
    RequestLine,
    normalised,
    parse_head,
    request_body,
    response_body,
    status_of,
    usual_request,
)

TIME_CAP_S = 20.0
_started: list[float] = []


def _over_time() -> bool:
    if not _started:
        _started.append(time.monotonic())
    return time.monotonic() - _started[0] > TIME_CAP_S


FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=False,
)

EOLS = st.sampled_from(["\r\n"] * 8 + ["\n", "\r", "\n\r"])
CONTENT_LENGTHS = st.sampled_from(
    [
        "0",
        "4",
        "5",
        "16",
        "004",
        " 4",
        "4 ",
        "+4",
        "-1",
        "",
        "4, 4",
        "4,5",
        "²",
        "0x4",
        "4.0",
        "99999999999999999999",
    ]
)
TRANSFER_ENCODINGS = st.sampled_from(
    [
        "chunked",
        "Chunked",
        " chunked ",
        "chunked, identity",
        "identity",
        "gzip, chunked",
        "chunked,",
        "xchunked",
    ]
)
OTHER_HEADERS = st.sampled_from(
    [("X-A", "b"), ("Content-Type", "application/json"), ("Connection", "keep-alive"), ("X-B", ""),
     ("X A", "1"), ("X-C ", "1"), ("X-D", "a\x00b"), ("X-E", "\tv\t"), ("connection", " Close "),
     ("Connection", "close, X-A"), ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"),
     ("close", "1"), ("Upgrade", "h2c")]
)  # fmt: skip


@st.composite
def headers(draw: st.DrawFn) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = [("Host", "a")]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["cl", "te", "other"]))
        if kind == "cl":
            out.append((draw(st.sampled_from(["Content-Length", "content-length"])), draw(CONTENT_LENGTHS)))
        elif kind == "te":
            out.append(("Transfer-Encoding", draw(TRANSFER_ENCODINGS)))
        else:
            out.append(draw(OTHER_HEADERS))
    return draw(st.permutations(out))


CHUNK_SIZES = st.sampled_from(
    ["{:x}", "{:X}", "0{:x}", "{:x};ext=1", "{:x} ", " {:x}", "+{:x}", "{:x}_", "0x{:x}"]
)


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(0, 3))):
        data = draw(st.binary(min_size=1, max_size=20))
        size = draw(st.sampled_from(["{:x}"] * 6 + ["weird"]))
        form = draw(CHUNK_SIZES) if size == "weird" else size
        eol = draw(EOLS)
        out += form.format(len(data)).encode() + eol.encode() + data + draw(EOLS).encode()
    out += b"0" + draw(EOLS).encode()
    if draw(st.booleans()):
        out += b"X-Trailer: 1" + draw(EOLS).encode()
    return out + draw(EOLS).encode()


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["POST", "GET", "PUT", "P OST", "GET\t"]))
    version = draw(st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1 "]))
    head = f"{method} /v1/completions {version}" + draw(EOLS)
    for name, value in draw(headers()):
        head += f"{name}: {value}" + draw(EOLS)
    head += draw(EOLS)
    body = draw(st.one_of(chunked_body(), st.binary(max_size=24)))
    try:
        raw = head.encode("latin-1")
    except UnicodeEncodeError:
        raw = head.encode()
    return raw + body + b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"


@dataclass(frozen=True)
class Framed:
    end: int  # where the message ends in the input
    body: bytes  # its payload (chunked framing removed)
    forwarded: bytes  # what the proxy sends upstream for it


def ours_request(data: bytes, split: int) -> Framed | None:
    """What the proxy does with `data` (read in two pieces at `split`), sans I/O; None: refused or
    incomplete (nothing would reach the upstream past what the framer refused)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    try:
        head = parse_head(data[: end + 4])
        RequestLine.of(head)
        framer = request_body(head)
        rest = data[end + 4 :]
        used_total, payload = 0, b""
        for piece in (rest[:split], rest[split:]):
            if framer.done:
                break
            used, got = framer.feed(piece)
            used_total += used
            payload += got
    except FramingError:
        return None
    if not framer.done:
        return None
    body_end = end + 4 + used_total
    return Framed(body_end, payload, normalised(head, framer).raw + data[end + 4 : body_end])


def h11_request(data: bytes) -> tuple[int, bytes] | None:
    """(where h11 ends the first request, its body), or None when h11 refuses it or wants more."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Data):
                body += bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return len(data) - len(conn.trailing_data[0]), body
    except h11.RemoteProtocolError:
        return None


@FUZZ
@given(requests(), st.integers(0, 64))
def test_a_request_the_proxy_forwards_ends_where_h11_ends_it(data: bytes, split: int) -> None:
    if _over_time():
        return
    ours = ours_request(data, split)
    event("forwarded" if ours is not None else "refused")
    if ours is None:
        return  # refused (or incomplete): nothing past the refusal is forwarded
    reference = h11_request(data)
    assert reference is not None, f"the proxy forwards a request h11 refuses: {data!r}"
    assert reference == (ours.end, ours.body), data
    again = h11_request(ours.forwarded)  # what the upstream reads: one message, nothing behind it
    assert again == (len(ours.forwarded), ours.body), ours.forwarded


@st.composite
def tidy_requests(draw: st.DrawFn) -> bytes:
    """Heads as clients write them (CRLF, HTTP/1.1 mostly), with the same framing and hop pieces."""
    method = draw(st.sampled_from(["POST", "GET", "PATCH"]))
    version = draw(st.sampled_from(["HTTP/1.1"] * 5 + ["HTTP/1.0"]))
    names = st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH"])
    fields = draw(st.lists(OTHER_HEADERS, max_size=2)) + draw(
        st.lists(st.tuples(names, CONTENT_LENGTHS), max_size=2)
    )
    head = f"{method} /v1/chat/completions?x=1 {version}\r\n"
    for name, value in draw(st.permutations([("Host", "a"), *fields])):
        head += f"{name}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{value}\r\n"
    return head.encode("latin-1") + b"\r\n"


@FUZZ
@given(st.one_of(requests(), tidy_requests()))
def test_a_usual_request_goes_up_as_the_whole_way_would_send_it(data: bytes) -> None:
    """`usual_request` sends a request up before its head is parsed: wherever it gives bytes, the whole
    way (parse_head, RequestLine, request_body, normalised) takes the same head and sends the same
    bytes with the same body length; anything else it leaves to the whole way."""
    if _over_time():
        return
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return
    raw = data[: end + 4]
    usual = usual_request(raw)
    event("usual" if usual is not None else "the whole way")
    if usual is None:
        return
    head = parse_head(raw)  # (raises on a head the whole way refuses)
    RequestLine.of(head)
    framer = request_body(head)
    assert isinstance(framer, LengthBody), raw
    assert usual == (normalised(head, framer).raw, framer.left), raw


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    status = draw(st.sampled_from(["200 OK", "201 Created", "204 No Content", "404 Not Found", "500 E",
                                   "2OO OK", "20 OK", "²00 OK"]))  # fmt: skip
    version = draw(st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2", "HTP/1.1"]))
    head = f"{version} {status}" + draw(EOLS)
    for name, value in draw(headers()):
        if name != "Host":
            head += f"{name}: {value}" + draw(EOLS)
    head += draw(EOLS)
    body = draw(st.one_of(chunked_body(), st.binary(max_size=24)))
    try:
        raw = head.encode("latin-1")
    except UnicodeEncodeError:
        raw = head.encode()
    return raw + body + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def ours_response(data: bytes, split: int) -> tuple[int, bytes] | None:
    """(where the proxy ends the response, its body); the upstream closes after `data`."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    try:
        head = parse_head(data[: end + 4])
        status_of(head)
        framer = response_body(head, "POST")
        rest = data[end + 4 :]
        used_total, payload = 0, b""
        for piece in (rest[:split], rest[split:]):
            if framer.done:
                break
            used, got = framer.feed(piece)
            used_total += used
            payload += got
    except FramingError:
        return None
    if framer.until_close:  # the upstream's close ends it: everything it sent is this body
        return len(data), payload
    if not framer.done:
        return None
    return end + 4 + used_total, payload


def h11_response(data: bytes) -> tuple[int, bytes] | None:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "a"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")  # the upstream closes after these bytes
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Data):
                body += bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return len(data) - len(conn.trailing_data[0]), body
    except h11.RemoteProtocolError:
        return None


@FUZZ
@given(responses(), st.integers(0, 64))
def test_a_response_the_proxy_forwards_ends_where_h11_ends_it(data: bytes, split: int) -> None:
    if _over_time():
        return
    ours = ours_response(data, split)
    event("forwarded" if ours is not None else "refused")
    if ours is None:
        return  # a 502 before the head goes out, or the response is cut
    reference = h11_response(data)
    assert reference is not None, f"the proxy forwards a response h11 refuses: {data!r}"
    assert reference == ours, data


LOOKALIKES = [b"data: {}\n\n", b"x", b"0\r\n\r\n", b"a\r\nb", b"\r\n"]  # data that looks like framing


@st.composite
def chunk_reads(draw: st.DrawFn) -> list[bytes]:
    """A chunked body as a streaming server sends it, one chunk a read (the usual read of a token),
    with the same smuggling pieces: a size that lies by one, odd size forms, bare line ends, data that
    looks like a last chunk."""
    reads = []
    for _ in range(draw(st.integers(1, 4))):
        data = draw(st.sampled_from(LOOKALIKES) | st.binary(min_size=1, max_size=20))
        size, form, eols = len(data), "{:x}", ["\r\n", "\r\n"]
        flaw = draw(st.sampled_from([None] * 6 + ["size", "form", "eol", "eol"]))  # one at most a chunk
        if flaw == "size":
            size += draw(st.sampled_from([-1, 1]))
        elif flaw == "form":
            form = draw(st.sampled_from(["{:X}", "0{:x}"]) | CHUNK_SIZES)
        elif flaw == "eol":
            eols[draw(st.integers(0, 1))] = draw(EOLS)
        reads.append(form.format(size).encode() + eols[0].encode() + data + eols[1].encode())
    reads.append(b"0\r\n\r\n")
    reads.append(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    return reads


@FUZZ
@given(chunk_reads())
def test_a_body_read_one_chunk_a_read_ends_where_h11_ends_it(reads: list[bytes]) -> None:
    if _over_time():
        return
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    framer = response_body(parse_head(head), "POST")
    used_total, payload = 0, b""
    try:
        for piece in reads:
            if framer.done:
                break
            used, got = framer.feed(piece)
            used_total += used
            payload += got
    except FramingError:
        return  # refused: the proxy may refuse more than h11 does
    event("forwarded" if framer.done else "cut")
    if not framer.done:
        return
    reference = h11_response(head + b"".join(reads))
    assert reference is not None, f"the proxy forwards a body h11 refuses: {reads!r}"
    assert reference == (len(head) + used_total, payload), reads


def test_one_whole_chunk_a_read_is_framed_as_the_general_path_frames_it() -> None:
    """Hand-made reads at the edges of the one-chunk read: each gives what RFC 9112 §7.1 says."""
    cases = [
        ([b"5\r\nhello\r\n", b"0\r\n\r\n"], b"hello", True),
        ([b"A\r\n0123456789\r\n", b"0\r\n\r\n"], b"0123456789", True),
        ([b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"], b"hello world", True),  # several a read
        ([b"5\r\nhel", b"lo\r\n0\r\n\r\n"], b"hello", True),  # one across reads
        ([b"5;x=1\r\nhello\r\n", b"0\r\n\r\n"], b"hello", True),  # an extension
        ([b"0000000000000005\r\nhello\r\n", b"0\r\n\r\n"], b"hello", True),  # 16 digits
    ]
    for reads, body, done in cases:
        framer = ChunkedBody()
        got = b"".join(framer.feed(piece)[1] for piece in reads)
        assert (got, framer.done) == (body, done), reads
    for bad in (b"5\nhello\r\n", b"5\r\nhello\n\r", b"5\r\nhelloXY", b"00000000000000005\r\nhello\r\n"):
        with pytest.raises(FramingError):
            ChunkedBody().feed(bad)


HEAD_PIECES = st.sampled_from(
    ["Host", "X-A", "content-length", "Content-Length", ":", " ", "\t", "  v ", "a:b", "é", "\x00", "\x7f",
     "\r", "\n", "\r\n", "\x85", "ÿ", "x y", "\t1\t", "@", ""]
)  # fmt: skip


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    valid = ["POST /v1 HTTP/1.1", "HTTP/1.1 200 OK", "GET / HTTP/1.0"]
    start = draw(st.sampled_from(valid * 3 + ["", "GET"]))
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 3)):  # mostly a header line, its value any of the pieces
            name = draw(st.sampled_from(["Host", "X-A", "content-length", "Accept", "a"]))
            lines.append(name + ":" + "".join(draw(st.lists(HEAD_PIECES, max_size=4))))
        else:
            lines.append("".join(draw(st.lists(HEAD_PIECES, min_size=1, max_size=5))))
    return (start + "\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n").encode("latin-1")


@FUZZ
@given(heads())
def test_a_head_is_read_at_once_as_it_is_read_line_by_line(raw: bytes) -> None:
    """`parse_head` reads every header line in a few regex calls; the line-by-line reading (its
    fallback, which names the bad line) is the reference: the same head, or the same refusal."""
    if _over_time():
        return
    from trayapp.services.proxy.http1 import _parse_head_line_by_line

    try:
        reference = _parse_head_line_by_line(raw)
    except FramingError as exc:
        with pytest.raises(FramingError) as refused:
            parse_head(raw)
        assert str(refused.value) == str(exc)
        event("refused")
        return
    parsed = parse_head(raw)
    assert (parsed.start_line, parsed.headers, parsed.raw) == (reference.start_line, reference.headers, raw)
    assert parsed.by_name == {
        name: [value for key, value in reference.headers if key.lower() == name]
        for name in {key.lower() for key, _ in reference.headers}
    }
    event("read")


def test_a_head_read_at_once_keeps_names_as_sent_and_values_without_their_outer_blanks() -> None:
    parsed = parse_head(b"POST /v1 HTTP/1.1\r\nX-Mixed:  a: b \t\r\nx-mixed:\r\nHost:\tlocalhost\r\n\r\n")
    assert parsed.headers == (("X-Mixed", "a: b"), ("x-mixed", ""), ("Host", "localhost"))
    assert parsed.get("X-MIXED") == "a: b, " and parsed.get("host") == "localhost"
    assert parsed.get("no") is None
    for bad, says in (
        (b"POST / HTTP/1.1\r\nX : 1\r\n\r\n", "malformed header line"),
        (b"POST / HTTP/1.1\r\nX: 1\n2\r\n\r\n", "control character"),
        (b"POST / HTTP/1.1\r\n folded\r\n\r\n", "malformed header line"),
    ):
        with pytest.raises(FramingError, match=says):
            parse_head(bad)
