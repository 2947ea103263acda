"""The proxy's framer is strict where lenient servers differ (RFC 9112; issue #25): every message whose
end two parsers could disagree on is refused, never forwarded."""

from __future__ import annotations

import pytest

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


def head(*lines: str) -> bytes:
    """The head's bytes: one byte per character where latin-1 has it (`²` is the byte 0xB2, which
    Python's str.isdigit accepts), UTF-8 otherwise."""
    text = "\r\n".join(lines) + "\r\n\r\n"
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode()


SMUGGLING_HEADS = {
    "TE and CL": head("POST /v1/completions HTTP/1.1", "Transfer-Encoding: chunked", "Content-Length: 4"),
    "chunked, identity": head(
        "POST /v1/completions HTTP/1.1", "Transfer-Encoding: chunked, identity", "Content-Length: 4"
    ),
    "identity": head("POST /v1/completions HTTP/1.1", "Transfer-Encoding: identity"),
    "gzip, chunked": head("POST /v1/completions HTTP/1.1", "Transfer-Encoding: gzip, chunked"),
    "two TE headers": head("POST / HTTP/1.1", "Transfer-Encoding: chunked", "Transfer-Encoding: identity"),
    "two equal TE headers": head(
        "POST / HTTP/1.1", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"
    ),
    "TE with a stray char": head("POST / HTTP/1.1", "Transfer-Encoding: xchunked"),
    "differing CLs": head("POST / HTTP/1.1", "Content-Length: 4", "Content-Length: 5"),
    "a CL list": head("POST / HTTP/1.1", "Content-Length: 4, 5"),
    "superscript two": head("POST / HTTP/1.1", "Content-Length: ²"),
    "Arabic-Indic digits": head("POST / HTTP/1.1", "Content-Length: ٤"),
    "a signed CL": head("POST / HTTP/1.1", "Content-Length: +4"),
    "an empty CL": head("POST / HTTP/1.1", "Content-Length: "),
    "chunked on HTTP/1.0": head("POST / HTTP/1.0", "Transfer-Encoding: chunked"),
}


@pytest.mark.parametrize("name", list(SMUGGLING_HEADS))
def test_an_ambiguous_request_framing_is_refused(name: str) -> None:
    with pytest.raises(FramingError):
        request_body(parse_head(SMUGGLING_HEADS[name]))


@pytest.mark.parametrize(
    "raw",
    [
        b"POST / HTTP/1.1\r\nHost: a\nTransfer-Encoding: chunked\r\n\r\n",  # a bare LF inside the head
        b"POST / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n",  # a bare CR
        b"POST / HTTP/1.1\r\nHost: a\r\n Transfer-Encoding: chunked\r\n\r\n",  # obs-fold
        b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",  # whitespace before the colon
        b"POST / HTTP/1.1\r\nX\x00: 1\r\n\r\n",  # not a token
        b"POST / HTTP/1.1\r\nX: a\x00b\r\n\r\n",  # a NUL in a value
        b"POST  / HTTP/1.1\r\n\r\n",  # two spaces
        b"POST / HTTP/1.1 \r\n\r\n",
        b"POST / HTTP/2.0\r\n\r\n",
        b"P\xc3\xb6ST / HTTP/1.1\r\n\r\n",
        b"POST /\x7f HTTP/1.1\r\n\r\n",
    ],
)
def test_a_malformed_request_head_is_refused(raw: bytes) -> None:
    with pytest.raises(FramingError):
        parsed = parse_head(raw)
        RequestLine.of(parsed)
        request_body(parsed)


@pytest.mark.parametrize(
    "body",
    [
        b"1_0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n",
        b"+10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n",
        b" 10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n",
        b"10 \r\n" + b"x" * 16 + b"\r\n0\r\n\r\n",
        b"0x10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n",
        b"-1\r\n",
        b"\r\n",  # no size at all
        b"1" * 17 + b"\r\n",  # more hex digits than any length
        b"4\nabcd\r\n0\r\n\r\n",  # a bare LF after the size
        b"4\r\nabcd\n0\r\n\r\n",  # a bare LF after the data
        b"4\r\nabcd\r\n0\r\nX: 1\n\r\n",  # a bare LF in the trailers
        b"4\r\nabcd\r\n0\r\nX : 1\r\n\r\n",  # a malformed trailer
        b"4;a\x00b\r\nabcd\r\n0\r\n\r\n",  # a control character in an extension
    ],
)
def test_a_malformed_chunk_is_refused(body: bytes) -> None:
    with pytest.raises(FramingError):
        framer = ChunkedBody()
        framer.feed(body)
        assert framer.done  # a body that neither fails nor ends would be a bug too


def test_strict_chunks_still_accept_what_rfc_9112_allows() -> None:
    framer = ChunkedBody()
    _used, payload = framer.feed(
        b'A;name=value;q="x y"\r\n0123456789\r\nf\r\n' + b"y" * 15 + b"\r\n0\r\nX-T: 1\r\n\r\n"
    )
    assert framer.done and payload == b"0123456789" + b"y" * 15


@pytest.mark.parametrize(
    "status_line",
    ["HTTP/1.1 2000 OK", "HTTP/1.1 20 OK", "HTTP/1.1 ²00 OK", "HTTP/1.1 +20 OK", "HTTP/2 200 OK",
     "ICY 200 OK", "HTTP/1.1 099 Low", "HTTP/1.1"],
)  # fmt: skip
def test_a_malformed_status_line_is_refused(status_line: str) -> None:
    with pytest.raises(FramingError):
        status_of(parse_head(head(status_line)))


@pytest.mark.parametrize(
    "lines",
    [
        ("HTTP/1.1 200 OK", "Content-Length: ²"),
        ("HTTP/1.1 200 OK", "Content-Length: 1", "Content-Length: 2"),
        ("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Content-Length: 2"),
        ("HTTP/1.1 200 OK", "Transfer-Encoding: chunked, identity"),
    ],
)
def test_a_response_whose_end_is_ambiguous_is_refused(lines: tuple[str, ...]) -> None:
    with pytest.raises(FramingError):
        response_body(parse_head(head(*lines)), "POST")


def test_the_forwarded_head_states_its_framing_once() -> None:
    parsed = parse_head(
        head("POST /v1/completions HTTP/1.1", "Host: a", "Content-Length: 4", "content-length:4")
    )
    framer = request_body(parsed)
    assert isinstance(framer, LengthBody) and framer.left == 4
    forwarded = normalised(parsed, framer)
    assert forwarded.raw == b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n"
    chunked = parse_head(head("POST / HTTP/1.1", "Transfer-Encoding:  Chunked ", "X: 1"))
    out = normalised(chunked, request_body(chunked), drop=("x",))
    assert out.raw == b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_the_forwarded_head_leaves_out_what_is_for_the_clients_hop_only() -> None:
    """RFC 9110 §7.6.1: `Connection`, the names it lists, and the connection's own headers stay on
    the client's hop, as do the credentials it gives a proxy; a listed Host or framing header is not
    the connection's and still goes up."""
    lines = ["Host: a", "Connection: close, X-Trace , host, Content-Length", "X-Trace: 1",
             "Keep-Alive: timeout=5", "Proxy-Connection: keep-alive", "Upgrade: h2c",
             "Proxy-Authorization: Bearer for-this-hop", "Content-Length: 2", "X-Kept: y"]  # fmt: skip
    parsed = parse_head(head("POST /v1 HTTP/1.1", *lines))
    forwarded = normalised(parsed, request_body(parsed))
    assert forwarded.raw == b"POST /v1 HTTP/1.1\r\nHost: a\r\nX-Kept: y\r\nContent-Length: 2\r\n\r\n"
    plain = parse_head(head("GET / HTTP/1.1", "Host: a", "Accept: */*"))
    assert normalised(plain, request_body(plain)).raw == plain.raw  # nothing of the kind: as it came


def test_a_usual_head_goes_up_with_only_its_connections_own_lines_cut_out_of_its_bytes() -> None:
    """A client's `Connection: close` (or keep-alive, and the hop's own headers) is the usual reason to
    rebuild a head: those lines are cut out and every other line goes up byte for byte as it came."""
    lines = ["Host: a", "connection:close", "X-A:  b ", "Keep-Alive: timeout=5",
             "PROXY-Connection: keep-alive", "Proxy-Authorization: Basic eA==", "Content-Length: 2",
             "x-upgraded: no"]  # fmt: skip
    parsed = parse_head(head("POST /v1 HTTP/1.1", *lines))
    forwarded = normalised(parsed, request_body(parsed))
    expected = b"POST /v1 HTTP/1.1\r\nHost: a\r\nX-A:  b \r\nContent-Length: 2\r\nx-upgraded: no\r\n\r\n"
    assert forwarded.raw == expected
    assert forwarded.headers == (("Host", "a"), ("X-A", "b"), ("Content-Length", "2"), ("x-upgraded", "no"))
    assert forwarded.by_name == {"host": ["a"], "x-a": ["b"], "content-length": ["2"], "x-upgraded": ["no"]}
    # A header that `Connection` names (here one called Close), or framing to restate: rebuilt in full
    named = parse_head(head("POST /v1 HTTP/1.1", "Host: a", "Connection: close", "Close: x", "X-A:  b "))
    assert normalised(named, request_body(named)).raw == b"POST /v1 HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\r\n"
    restate = parse_head(head("POST /v1 HTTP/1.1", "Connection: keep-alive", "Content-Length: 02"))
    assert normalised(restate, request_body(restate)).raw == b"POST /v1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n"


def test_a_usual_request_is_read_from_its_bytes_and_any_other_goes_the_whole_way() -> None:
    """`usual_request` (a request sent up before its head is parsed): HTTP/1.1, one Content-Length
    in its one form or none, nothing for this hop but `Connection: close`/`keep-alive` and the hop's
    own headers, cut out; None for anything else. Where it gives bytes, the whole way gives the same."""
    line = "POST /v1/chat/completions HTTP/1.1"
    usual = {
        head(line, "Host: a", "Content-Length: 12"): (head(line, "Host: a", "Content-Length: 12"), 12),
        head("GET /v1/models HTTP/1.1", "Host: a"): (head("GET /v1/models HTTP/1.1", "Host: a"), 0),
        head(line, "Host: a", "Connection: close", "content-length:0", "Keep-Alive: 5"): (
            head(line, "Host: a", "content-length:0"), 0),
        head(line, "connection:  Keep-Alive ", "Upgrade: h2c", "Proxy-Authorization: Basic eA==",
             "Content-Length: 3 ", "Proxy-Connection: close"): (head(line, "Content-Length: 3 "), 3),
    }  # fmt: skip
    for raw, expected in usual.items():
        assert usual_request(raw) == expected, raw
        parsed = parse_head(raw)
        assert (normalised(parsed, request_body(parsed)).raw, request_body(parsed).left) == expected  # type: ignore[attr-defined]
    whole_way = [
        head("POST / HTTP/1.0", "Content-Length: 1"),  # HTTP/1.0
        head(line, "Content-Length: 012"),  # a length in another form
        head(line, "Content-Length: 1", "Content-Length: 1"),
        head(line, "Content-Length: 1, 1"),
        head(line, "Content-Length: 1234567890123456789"),  # past 18 digits
        head(line, "Transfer-Encoding: chunked"),
        head(line, "Connection: close, X-Trace", "X-Trace: 1"),  # names a header
        head(line, "Connection: close", "Close: 1"),  # a header `Connection: close` names
        head(line, "Connection: upgrade"),
        head(line, "Host: a").replace(b"Host: a\r\n", b"Host: a\n"),  # a bare LF
        head("POST /v1 chat HTTP/1.1", "Host: a"),
        head(line, "Bad Name: 1"),
    ]
    for raw in whole_way:
        assert usual_request(raw) is None, raw


def test_a_head_already_in_its_one_form_goes_up_as_it_came_and_any_other_is_restated() -> None:
    as_is = parse_head(head("POST /v1 HTTP/1.1", "Host: a", "Content-Length: 12", "Accept: */*"))
    assert normalised(as_is, request_body(as_is)) is as_is
    chunked = parse_head(head("POST /v1 HTTP/1.1", "Host: a", "Transfer-Encoding: chunked"))
    assert normalised(chunked, request_body(chunked)) is chunked
    restated = {
        "Content-Length: 012": b"Content-Length: 12\r\n",  # one value, one spelling
        "Transfer-Encoding: Chunked": b"Transfer-Encoding: chunked\r\n",
        "Content-Length: 12, 12": b"Content-Length: 12\r\n",
    }
    for line, framing in restated.items():
        parsed = parse_head(head("POST /v1 HTTP/1.1", "Host: a", line))
        expected = b"POST /v1 HTTP/1.1\r\nHost: a\r\n" + framing + b"\r\n"
        assert normalised(parsed, request_body(parsed)).raw == expected
