"""HTTP/1.1 framing of the pass-through proxy: bodies end where RFC 9112 says, byte by byte."""

from __future__ import annotations

import pytest

from trayapp.services.proxy.http1 import (
    ChunkedBody,
    FramingError,
    LengthBody,
    RequestLine,
    parse_head,
    request_body,
    response_body,
    status_of,
)

# A real llama-server stream starts like this (cpp-httplib: chunked, one SSE event per chunk).
CHUNKED = (
    b'18\r\ndata: {"content":"Hi"}\n\n\r\n'  # 0x18 = 24 bytes of data
    b'15;ext=1\r\ndata: {"stop":true}\n\n\r\n'  # 0x15 = 21, with a chunk extension
    b"0\r\nX-Trailer: yes\r\n\r\n"
)
PAYLOAD = b'data: {"content":"Hi"}\n\n' + b'data: {"stop":true}\n\n'


def feed_in_pieces(framer: ChunkedBody, data: bytes, size: int) -> tuple[int, bytes]:
    used_total, payload = 0, b""
    for at in range(0, len(data), size):
        used, piece = framer.feed(data[at : at + size])
        used_total += used
        payload += piece
    return used_total, payload


def test_a_chunked_body_yields_its_data_and_ends_after_the_trailers() -> None:
    assert len(b'data: {"content":"Hi"}\n\n') == 0x18 and len(b'data: {"stop":true}\n\n') == 0x15
    framer = ChunkedBody()
    used, payload = framer.feed(CHUNKED + b"GET / HTTP/1.1\r\n")  # the next request must not be swallowed
    assert framer.done
    assert used == len(CHUNKED)
    assert payload == PAYLOAD


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_chunked_framing_survives_any_split_across_reads(size: int) -> None:
    framer = ChunkedBody()
    used, payload = feed_in_pieces(framer, CHUNKED, size)
    assert framer.done and used == len(CHUNKED) and payload == PAYLOAD


def test_a_chunked_body_cut_short_is_not_done() -> None:
    framer = ChunkedBody()
    framer.feed(CHUNKED[:40])
    assert not framer.done


@pytest.mark.parametrize("garbage", [b"zz\r\n", b"5\r\nhelloXX", b"-3\r\n"])
def test_bad_chunk_framing_is_an_error(garbage: bytes) -> None:
    with pytest.raises(FramingError):
        ChunkedBody().feed(garbage)


def test_a_length_body_takes_exactly_its_bytes() -> None:
    framer = LengthBody(5)
    assert framer.feed(b"hel") == (3, b"hel") and not framer.done
    assert framer.feed(b"loGET") == (2, b"lo") and framer.done


def test_request_heads_parse_and_choose_their_framing() -> None:
    head = parse_head(
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    )
    line = RequestLine.of(head)
    assert (line.method, line.target, line.path) == (
        "POST",
        "/v1/chat/completions?x=1",
        "/v1/chat/completions",
    )
    assert head.get("x-a") == "1, 2" and head.get("HOST") == "a"
    assert isinstance(request_body(head), LengthBody) and not request_body(head).done
    chunked = parse_head(
        b"POST /api/chat HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
    )
    with pytest.raises(FramingError, match="both"):  # the smuggling shape (RFC 9112 §6.3): refused
        request_body(chunked)
    assert request_body(parse_head(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")).done  # no body


def test_keep_alive_follows_the_version_and_connection_header() -> None:
    assert parse_head(b"GET / HTTP/1.1\r\n\r\n").keep_alive()
    assert not parse_head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive()
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive()
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive()


def test_response_framing() -> None:
    ok_chunked = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert status_of(ok_chunked) == 200 and isinstance(response_body(ok_chunked, "POST"), ChunkedBody)
    no_length = response_body(parse_head(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"), "GET")
    assert no_length.until_close and not no_length.done  # ends when the server closes
    assert response_body(parse_head(b"HTTP/1.1 204 No Content\r\n\r\n"), "POST").done
    assert response_body(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"), "HEAD").done


@pytest.mark.parametrize(
    "raw",
    [
        b"nonsense\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    ],
)
def test_malformed_heads_are_errors(raw: bytes) -> None:
    with pytest.raises(FramingError):
        head = parse_head(raw)
        RequestLine.of(head)
        request_body(head)
