"""sources/http_wire.py: a GET's request bytes and the answer read from canned bytes, as http.client
reads them (issue #26). No socket: a fake `recv` hands the bytes over in small pieces."""

from __future__ import annotations

import http.client

import pytest

from trayapp.sources.http_wire import BodyTooLarge, WireResponse, get_request, read_response


class Canned:
    """A `recv` giving `data` `piece` bytes at a time, then b"" (the peer's close)."""

    def __init__(self, data: bytes, piece: int = 7) -> None:
        self.data = data
        self.piece = piece

    def recv(self, bufsize: int) -> bytes:
        out, self.data = self.data[: min(bufsize, self.piece)], self.data[min(bufsize, self.piece) :]
        return out


def answer(data: bytes, max_bytes: int = 1024, piece: int = 7) -> WireResponse:
    return read_response(Canned(data, piece), max_bytes)


def test_the_request_bytes() -> None:
    request = get_request("/v1/props", {"Host": "127.0.0.1:8080", "Authorization": "Bearer k"})
    assert request == b"GET /v1/props HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer k\r\n\r\n"


def test_a_control_character_in_a_header_is_refused() -> None:
    with pytest.raises(ValueError):
        get_request("/props", {"Authorization": "Bearer k\r\nX-Evil: 1"})
    with pytest.raises(ValueError):
        get_request("/props\n", {})


def test_a_body_by_content_length_kept_alive_with_headers_joined() -> None:
    got = answer(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
        b"Set-Cookie: a=1\r\nset-cookie: b=2\r\n\r\n"
        b'{"status":"ok"}'
    )
    assert got == WireResponse(
        200,
        {"content-type": "application/json", "content-length": "15", "set-cookie": "a=1, b=2"},
        b'{"status":"ok"}',
        keep_alive=True,
    )


def test_a_chunked_body_with_an_extension_and_a_trailer() -> None:
    got = answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;x=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    assert (got.status, got.body, got.keep_alive) == (200, b"hello, world", True)


def test_a_body_to_the_close_and_http_10_close_the_connection() -> None:
    got = answer(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
    assert (got.body, got.keep_alive) == (b"all of it", False)
    got = answer(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}")
    assert (got.status, got.body, got.keep_alive) == (503, b"{}", False)
    got = answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
    assert got.keep_alive is False


def test_no_body_for_204_and_a_100_continue_skipped() -> None:
    got = answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert (got.status, got.body, got.keep_alive) == (204, b"", True)


def test_bare_newlines_are_line_ends_as_http_client_takes_them() -> None:
    got = answer(b"HTTP/1.1 404 Not Found\nContent-Length: 3\n\nno!")
    assert (got.status, got.headers, got.body) == (404, {"content-length": "3"}, b"no!")


def test_the_size_limit_by_length_by_chunks_and_to_the_close() -> None:
    with pytest.raises(BodyTooLarge):
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", max_bytes=10)
    with pytest.raises(BodyTooLarge):
        answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\n", max_bytes=10)
    with pytest.raises(BodyTooLarge):
        answer(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 11, max_bytes=10)
    assert answer(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 10, max_bytes=10).body == b"x" * 10


def test_a_body_cut_short_and_a_close_before_the_answer() -> None:
    with pytest.raises(http.client.IncompleteRead) as cut:
        answer(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"sta')
    assert (cut.value.partial, cut.value.expected) == (b'{"sta', 95)
    with pytest.raises(http.client.IncompleteRead):
        answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    with pytest.raises(http.client.RemoteDisconnected):
        answer(b"")


@pytest.mark.parametrize("line", [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 2000 OK\r\n", b"HTTP/1.1 099 x\r\n"])
def test_not_an_http_status_line(line: bytes) -> None:
    with pytest.raises(http.client.BadStatusLine):
        answer(line + b"\r\n")


def test_too_many_or_too_long_header_lines() -> None:
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        answer(b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n")
    with pytest.raises(http.client.LineTooLong):
        answer(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", piece=65536)


def test_bytes_after_the_body_do_not_keep_the_connection() -> None:
    got = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n", piece=4096)
    assert (got.body, got.keep_alive) == (b"{}", False)
