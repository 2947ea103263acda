"""A request on its way up: checked (its framing, the listener's token) and its head rebuilt, then
sent, with the copy the proxy keeps of it for a replay (a request the upstream answered with nothing
is sent once more on a new connection: `replay_after`); a usual one sent before its head is parsed
(`send_usual`). Synchronous, so that a request can go up inside the client's read that completed its
head, before any task wakes (issue #26). When the client goes, where its upstream connections go
(`settle`)."""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from trayapp.services.proxy import limits
from trayapp.services.proxy.admission import HeldBytes
from trayapp.services.proxy.exchange import EarlyUpstream, Exchange, Upstream, UpstreamFailed, UpstreamPool
from trayapp.services.proxy.forwarding import BadChunk, HeadForwarder
from trayapp.services.proxy.http1 import (
    BodyFramer,
    FramingError,
    Head,
    LengthBody,
    RequestLine,
    normalised,
    parse_head,
    request_body,
)
from trayapp.services.proxy.reading import Reader, error_response
from trayapp.services.proxy.route import Route


class Checked(NamedTuple):  # (tuples: made in one call each, on every request's way up)
    """A request the proxy forwards: its head as it came, its line and body framing, the head's bytes
    as they go up and the `Authorization` among them."""

    head: Head
    line: RequestLine
    framer: BodyFramer
    forwarded: bytes
    auth: str | None
    started_mono_s: float  # when it began (time.monotonic())
    started_wall_s: float  # the same, time.time()


class Sent(NamedTuple):
    """A request sent up (its head, and its body's first bytes where they came with it)."""

    checked: Checked
    upstream: Upstream
    exchange: Exchange
    heads: HeadForwarder  # its answer's head, watched from the send
    first_payload: bytes  # the body's payload sent with the head
    held_head: bytes  # the head, when it waits to go up with a chunked body's first bytes


def check(route: Route, head: Head) -> Checked | bytes:
    """The request as it goes up, or the proxy's own answer refusing it (400, 401)."""
    try:
        line = RequestLine.of(head)
        framer = request_body(head)
    except FramingError as exc:
        return error_response(400, "Bad Request", str(exc), "bad_request")
    authorized = route.authorized_head(head)
    if authorized is None:
        message = "llm-tray proxy: a bearer token is required"
        return error_response(401, "Unauthorized", message, "unauthorized")
    forwarded = normalised(authorized, framer)  # the framing stated once, one header per line
    return Checked(
        head, line, framer, forwarded.raw, _authorization(forwarded), time.monotonic(), time.time()
    )


def _authorization(head: Head) -> str | None:
    """The `Authorization` a head carries up (its last), for the prompt counter's requests."""
    values = head.by_name.get("authorization")
    return values[-1] if values else None


def send_usual(
    raw: bytes,
    usual: tuple[bytes, int],
    client: Reader,
    writer: asyncio.StreamWriter,
    upstream: Upstream,
    held: HeldBytes,
    on_bad_chunk: BadChunk,
) -> tuple[Head, Sent]:
    """Send up a usual request (`usual_request(raw)`: its bytes as they go up, its body's length) at
    once, then read its head (`parse_head`, which takes what `usual_request` took: it cannot fail) and
    watch its answer, as `send` does: ~0.1 ms cold before the first byte went up, no longer (issue
    #26)."""
    started_mono_s, started_wall_s = time.monotonic(), time.time()
    forwarded, length = usual
    framer = LengthBody(length)
    first_payload, piece = _write_up(forwarded, framer, client, upstream)
    try:
        head = parse_head(raw)
        auth = _authorization(head)  # (a usual head keeps its own: nothing of it is cut)
        checked = Checked(head, RequestLine.of(head), framer, forwarded, auth, started_mono_s, started_wall_s)
    except BaseException:
        upstream.close()  # (a bug: the request went up, and its answer is read by no one)
        raise
    return head, _watching(checked, writer, upstream, held, on_bad_chunk, first_payload, b"", piece)


def send(
    checked: Checked,
    client: Reader,
    writer: asyncio.StreamWriter,
    upstream: Upstream,
    held: HeldBytes,
    on_bad_chunk: BadChunk,
) -> Sent:
    """Send the request up. The head goes first, with the body's first bytes where they came with it
    (one send: one packet, one wake of the upstream), and is never held for a body still to come
    (Expect: 100-continue); a chunked body is read by the client side, which refuses a malformed one
    before a byte of it goes up. Its answer's head is watched from then on."""
    framer, head = checked.framer, checked.forwarded
    if client.pending and not framer.done and not isinstance(framer, LengthBody):
        return _watching(checked, writer, upstream, held, on_bad_chunk, b"", head, b"")
    first_payload, piece = _write_up(head, framer, client, upstream)
    return _watching(checked, writer, upstream, held, on_bad_chunk, first_payload, b"", piece)


def _write_up(head: bytes, framer: BodyFramer, client: Reader, upstream: Upstream) -> tuple[bytes, bytes]:
    """Write a request's head up, with its body's first bytes where they came with it and are framed
    by a length (one send: one packet, one wake of the upstream) → (their payload, those bytes)."""
    if client.pending and not framer.done and isinstance(framer, LengthBody):
        data, client.pending = client.pending, b""
        used, first_payload = framer.feed(data)  # (a length's framing is never malformed)
        piece = data[:used] if used < len(data) else data
        upstream.transport.write(head + piece)
        client.unread(data[used:])
        return first_payload, piece
    upstream.transport.write(head)
    return b"", b""


def _watching(
    checked: Checked,
    writer: asyncio.StreamWriter,
    upstream: Upstream,
    held: HeldBytes,
    on_bad_chunk: BadChunk,
    first_payload: bytes,
    held_head: bytes,
    piece: bytes,
) -> Sent:
    """What a request's answer needs, made once the request is on its way (the answer's reads come
    after the callback that sent it returns): no request waits for it (issue #26). `held_head`: the
    head, not sent yet (it goes up with a chunked body's first bytes)."""
    exchange = Exchange()
    keep_for_replay(exchange, checked.forwarded, held)
    if piece:
        keep_for_replay(exchange, piece, held)
    heads = HeadForwarder(checked.line.method, exchange, writer, upstream, on_bad_chunk)
    return Sent(checked, upstream, exchange, heads, first_payload, held_head)


def send_body_piece(
    data: bytes,
    client: Reader,
    framer: BodyFramer,
    upstream: Upstream,
    exchange: Exchange,
    held_head: bytes,
    held: HeldBytes,
) -> bytes:
    """Send what of `data` belongs to the body (after `held_head`, in one send), push back the rest
    (the next request), keep a copy for a replay; the body's payload among it. FramingError: a
    malformed body, of which nothing was sent."""
    used, payload = framer.feed(data)
    piece = data[:used] if used < len(data) else data
    keep_for_replay(exchange, piece, held)
    if held_head:
        upstream.writer.writelines((held_head, piece))
    else:
        upstream.writer.write(piece)
    client.unread(data[used:])
    return payload


def keep_for_replay(exchange: Exchange, data: bytes, held: HeldBytes) -> None:
    """Keep a copy of what went upstream, under limits.REPLAY_KEPT_BYTES and the listener's budget for
    held bodies (`held`): a request that got no byte of answer is sent once more on a new connection."""
    replay = exchange.replay
    if replay is None:
        return
    if len(replay) + len(data) > limits.REPLAY_KEPT_BYTES or not held.take(len(data)):
        forget_replay(exchange, held)
        return
    replay += data


def forget_replay(exchange: Exchange, held: HeldBytes) -> None:
    """The copy is no longer needed (an answer has begun, or the exchange ended): its bytes given back."""
    if exchange.replay is not None:
        held.give(len(exchange.replay))
        exchange.replay = None


def replay_after(failure: UpstreamFailed, exchange: Exchange, framer: BodyFramer) -> bytes | None:
    """The request's bytes to send again when the upstream closed the connection without a byte of
    answer (a kept-alive connection the server was closing as the request went up): once, only for a
    request sent whole and kept whole. None: the failure is the client's answer (502)."""
    replay = exchange.replay
    if exchange.replayed or replay is None or not failure.answered_nothing or not framer.done:
        return None
    exchange.replayed = True
    return bytes(replay)


def settle(
    pool: UpstreamPool,
    begun: list[Checked | Sent | None],
    upstream: Upstream | None,
    early: EarlyUpstream | None,
) -> Upstream | None:
    """The client has gone: its idle upstream connections go to the pool for the next client; one
    that carries a request not answered to its end (`begun`: an exchange cut short) is closed.
    The connection closed here, to wait for; None when none was."""
    for sent in begun:
        if isinstance(sent, Sent):
            sent.upstream.close()
    if early is not None:
        spare = early.ready()  # opened for a next request that never came
        early.drop()
        if spare is not None:
            pool.put(spare)
    if upstream is None:
        return None
    if begun:
        upstream.close()
        return upstream
    pool.put(upstream)
    return None
