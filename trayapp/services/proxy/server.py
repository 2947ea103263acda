"""The pass-through pump: one asyncio listener per route, every byte forwarded as it arrives.

Per client connection there is one upstream connection (kept alive while both sides allow); when the
client goes, an idle one is kept a few seconds for the next client (exchange.UpstreamPool).
Per request the client side runs beside the response pump: a task forwarding the request body,
then watching for the client hanging up, or, for a body that came whole with its head (the usual
case), only that watch, in the client's read callbacks (reading.HangUpWatch). The response pump
(upstream → client: the head read and checked, then the body forwarded by the upstream's reads
themselves, forwarding.py, the upstream paused while the client's buffer is full) is a task. When
the client hangs up at any stage — before the first byte, mid-stream, during a non-streaming
request — the upstream connection is closed, which is how every server here learns to stop
generating. The recorder tap sees de-framed payload as it passes, after the client got it, and
keeps none; a recorder bug never breaks a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from trayapp.core.redact import redact_url
from trayapp.services.proxy import limits
from trayapp.services.proxy.admission import Slots, fd_soft_limit
from trayapp.services.proxy.exchange import (
    Cut,
    EarlyUpstream,
    Exchange,
    Upstream,
    UpstreamFailed,
    UpstreamPool,
    drain,
    open_upstream,
    read_small,
)
from trayapp.services.proxy.forwarding import HeadForwarder, forward_body
from trayapp.services.proxy.http1 import BodyFramer, FramingError, Head, parse_head, usual_request
from trayapp.services.proxy.limits import CLOSE_TIMEOUT_S, READ_BYTES
from trayapp.services.proxy.prompt_length import PromptBoard
from trayapp.services.proxy.reading import (
    ForwardingProtocol,
    ForwardingReader,
    HangUpWatch,
    Idle,
    Reader,
    SlowHead,
    error_response,
    within,
)
from trayapp.services.proxy.recorder import RequestTap
from trayapp.services.proxy.recording import LaterName, Recording, RecordSink
from trayapp.services.proxy.route import Route
from trayapp.services.proxy.sending import (
    Checked,
    Sent,
    check,
    forget_replay,
    replay_after,
    send,
    send_body_piece,
    send_usual,
    settle,
)

log = logging.getLogger(__name__)
REPLAYED = (  # said once a listener
    "proxy: upstream %s closed a connection without answering: the request was sent again on a new connection"
)


class ProxyServer:
    """One route's listener. `start()` binds; `close()` stops listening and ends open streams."""

    def __init__(
        self,
        route: Route,
        on_record: RecordSink,
        prompts: PromptBoard | None = None,
        max_connections: int | None = None,
        listeners: int = 1,
    ) -> None:
        self.route = route
        self.recording = Recording(route, on_record, prompts)
        self._server: asyncio.Server | None = None
        self._said: set[str] = set()  # what has been logged once
        self.port = route.listen_port
        self.upstream_address = (route.upstream_host, route.upstream_port)  # read once a connection
        self.reuse = limits.upstream_reuse(route.server_kind)
        cap, kept = limits.connection_budget(fd_soft_limit(), listeners, self.reuse.pool_most)
        self.slots = Slots(max_connections or cap)
        self.pool = UpstreamPool(kept, self.reuse.max_answers)  # connections left by clients that went

    @property
    def listen_url(self) -> str:
        host = self.route.listen_host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def protocol() -> ForwardingProtocol:  # asyncio.start_server's, reading through ours
            return ForwardingProtocol(
                ForwardingReader(limit=READ_BYTES, loop=loop), self._on_connection, loop
            )

        self._server = await loop.create_server(
            protocol, self.route.listen_host, self.route.listen_port, backlog=limits.ACCEPT_BACKLOG
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "proxy listening on %s -> %s (%s)",
            self.listen_url,
            redact_url(self.route.upstream_url),
            self.route.server_kind,
        )

    def cancel_connections(self) -> None:
        for task in list(self.slots.held):
            task.cancel()

    async def close(self) -> None:
        if self._server is not None:
            # Stop accepting first and let connections accepted a moment ago get their transports:
            # Python 3.11's Server.close() would otherwise fail those ("assert self._sockets is not
            # None" in Server._attach) and leave their sockets open.
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            for _ in range(3):
                await asyncio.sleep(0)
            self._server.close()
        self.cancel_connections()
        if self.slots.held:
            await asyncio.wait(self.slots.held, timeout=5)
        self.pool.close()
        if self._server is not None:
            await self._server.wait_closed()
        await self.recording.close()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        admitted = self.slots.admit(task)
        if admitted is None:
            self._say_once("cap", "proxy at its connection cap (%d): new connections get 503", self.slots.cap)
            message = "llm-tray proxy: too many connections"
            writer.write(error_response(503, "Service Unavailable", message, "overloaded", retry_after="1"))
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await within(writer.wait_closed(), CLOSE_TIMEOUT_S)
            return
        if admitted == "evicted":
            evicting = "proxy at its connection cap (%d): closing idle connections to make room"
            self._say_once("evict", evicting, self.slots.cap)
        read_small(writer.transport)
        client = Reader(reader)
        fileno: int | None = None  # its socket's, once it waits for a head (the slots' kernel count)
        upstream: Upstream | None = None
        host, port = self.upstream_address
        early = None  # a listener with a token opens nothing upstream for a client not yet authorized
        promised = [self.route.token is None and self.pool.promise()]  # its request goes up on a kept one
        if self.route.token is None and not promised[0]:
            early = EarlyUpstream(host, port, limits.EARLY_UPSTREAM_HOLD_S)
        begun: list[Checked | Sent | None] = []  # what the read that completed the head did; emptied
        #                                          once `_serve` has answered it
        try:
            first = True
            while True:
                begun = []
                on_head = self._head_hook(task, client, writer, upstream, early, begun, promised)
                try:
                    raw = client.whole_head()  # (the usual first request: it came before this task ran)
                    if raw is not None:
                        head: Head | None = on_head(raw)
                    else:
                        if fileno is None:
                            sock = writer.get_extra_info("socket")
                            fileno = sock.fileno() if sock is not None else -1
                        self.slots.waiting(task, client.has_unread_bytes, fileno)
                        first_byte_s = None if first else limits.IDLE_TIMEOUT_S
                        head = await client.read_head(first_byte_s, limits.HEAD_TIMEOUT_S, on_head)
                except FramingError as exc:
                    writer.write(error_response(400, "Bad Request", str(exc), "bad_request"))
                    break
                except SlowHead:
                    message = (
                        f"llm-tray proxy: the request head did not arrive within {limits.HEAD_TIMEOUT_S:g} s"
                    )
                    writer.write(error_response(408, "Request Timeout", message, "request_timeout"))
                    break
                except Idle:
                    break
                finally:
                    self.slots.busy(task)
                    self.pool.keep_promise(promised)  # (no head came: not needed)
                first = False
                if head is None:
                    break
                keep, upstream = await self._serve(begun[0], client, writer, upstream, early)
                begun = []
                if early is not None:  # taken by the request, or not needed (a refused request)
                    early.drop()
                    early = None
                if not keep:
                    break
                if upstream is not None and upstream.answers >= self.reuse.max_answers:
                    upstream.close()  # spent: the next request's connection opens now, not after it comes
                    upstream = None
                    early = EarlyUpstream(host, port, limits.UPSTREAM_REUSE_IDLE_S)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # the boundary: no client or upstream ends the listener or the command
            self._say_once(
                f"bug:{type(exc).__name__}",
                "proxy connection failed (%s: %s); it is closed, the proxy keeps serving",
                type(exc).__name__,
                exc,
                exc_info=True,
            )
        finally:
            self.slots.release(task)
            closed = settle(self.pool, begun, upstream, early)
            writer.close()  # before any await: a cancel arriving now must not leave a socket open
            for closing in (writer, closed.writer if closed is not None else None):
                if closing is not None and closing.transport.get_write_buffer_size():  # flushed, then closed
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await within(closing.wait_closed(), CLOSE_TIMEOUT_S)

    def _say_once(self, key: str, message: str, *args: object, exc_info: bool = False) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args, exc_info=exc_info)

    def _head_hook(
        self,
        task: asyncio.Task[None],
        client: Reader,
        writer: asyncio.StreamWriter,
        upstream: Upstream | None,
        early: EarlyUpstream | None,
        begun: list[Checked | Sent | None],
        promised: list[bool],
    ) -> Callable[[bytes], Head]:
        def on_head(raw: bytes) -> Head:  # inside the read that completed the head: it goes up at once
            self.slots.busy(task)
            self.pool.keep_promise(promised)  # before the take: no client between sees it still made
            head, began = self._begin(raw, client, writer, upstream, early)
            begun.append(began)
            return head

        return on_head

    def _begin(
        self,
        raw: bytes,
        client: Reader,
        writer: asyncio.StreamWriter,
        upstream: Upstream | None,
        early: EarlyUpstream | None,
    ) -> tuple[Head, Checked | Sent | None]:
        """A request's head came (`raw`, its bytes): checked, and sent up at once where a connection is
        open (the kept one, or the one opened as the client connected), a usual one before its head is
        parsed (http1.usual_request); None: refused (its answer written). FramingError: not a head."""
        usual = usual_request(raw) if self.route.token is None else None  # (a token: read the whole way)
        if usual is not None and (ready := self._ready(upstream, early)) is not None:
            return send_usual(raw, usual, client, writer, ready, self.recording.held, self._bad_chunk)
        head = parse_head(raw)
        checked = check(self.route, head)
        if isinstance(checked, bytes):
            writer.write(checked)
            return head, None
        ready = self._ready(upstream, early)
        if ready is None:
            return head, checked
        return head, send(checked, client, writer, ready, self.recording.held, self._bad_chunk)

    def _ready(self, upstream: Upstream | None, early: EarlyUpstream | None) -> Upstream | None:
        """The connection a request goes up on now: the client's own while usable, else a kept one,
        else the one opened as the client connected, if it is open; None: none is."""
        if upstream is not None and upstream.usable(self.reuse.max_answers):
            return upstream
        return self.pool.take() or (early.ready() if early is not None else None)

    async def _serve(
        self,
        begun: Checked | Sent | None,
        client: Reader,
        writer: asyncio.StreamWriter,
        upstream: Upstream | None,
        early: EarlyUpstream | None = None,
    ) -> tuple[bool, Upstream | None]:
        """One request, `_begin`'s → (keep the client connection, the upstream connection to reuse).
        `early`: the connection opened as the client connected, used when no kept one is."""
        if begun is None:
            return False, upstream
        if isinstance(begun, Checked):
            checked = begun
            try:
                opened = self.pool.take() or (await early.take() if early is not None else None)
                if opened is None:
                    opened = await open_upstream(*self.upstream_address)
            except UpstreamFailed as exc:
                upstream_name = redact_url(self.route.upstream_url)
                message = f"llm-tray proxy: upstream {upstream_name} unreachable ({exc})"
                writer.write(
                    error_response(
                        502, "Bad Gateway", message, "upstream_unreachable", upstream=upstream_name
                    )
                )
                tap = self.recording.tap(checked.line, checked.started_mono_s, checked.started_wall_s)
                naming = self.recording.name_client(tap, checked.head, writer, self.port)
                self.recording.record(tap, naming, status=502, aborted=False)
                if upstream is not None:
                    upstream.close()
                return False, None
            begun = send(checked, client, writer, opened, self.recording.held, self._bad_chunk)
        if upstream is not None and upstream is not begun.upstream:
            upstream.close()  # not usable any more: replaced
        checked, upstream, exchange, heads = begun.checked, begun.upstream, begun.exchange, begun.heads
        head, line, framer, auth = checked.head, checked.line, checked.framer, checked.auth
        first_payload, held_head = begun.first_payload, begun.held_head
        started_mono_s, started_wall_s = checked.started_mono_s, checked.started_wall_s
        tap = self.recording.tap(line, started_mono_s, started_wall_s)
        naming = self.recording.name_client(tap, head, writer, self.port)  # begun after the answer's head
        if first_payload:
            self.recording.body_sent(tap, first_payload, framer, auth, exchange)
        response = asyncio.create_task(self._pump_response(upstream, writer, tap, exchange, naming, heads))
        client_side: asyncio.Task[str] | None = None  # the body still to forward, then the client watched
        watch: HangUpWatch | None = None  # or, for a body that came whole, the client watched from its reads
        if framer.done:
            watch = HangUpWatch(client, response)
        else:
            client_side = asyncio.create_task(
                self._client_side(client, framer, upstream, tap, auth, exchange, held_head)
            )
        keep = False
        try:
            while True:
                if client_side is not None:
                    await asyncio.wait({client_side, response}, return_when=asyncio.FIRST_COMPLETED)
                    if (
                        not response.done()
                        and client_side.done()
                        and client_side.result() in ("gone", "stalled", "bad")
                    ):
                        response.cancel()  # the client hung up first: closing the upstream stops the server
                        break
                try:
                    keep = await response
                except asyncio.CancelledError:
                    if watch is None or not watch.gone:
                        raise
                    break  # the client hung up first: its watch cancelled the pump
                except UpstreamFailed as exc:
                    replay = replay_after(exc, exchange, framer)
                    if replay is None:
                        raise
                    self._say_once("replay", REPLAYED, redact_url(self.route.upstream_url))
                    heads.stop()
                    upstream.close()  # it answered nothing: the request goes once more, on a new one
                    upstream = await open_upstream(*self.upstream_address)
                    upstream.writer.write(replay)
                    heads = HeadForwarder(line.method, exchange, writer, upstream, self._bad_chunk)
                    response = asyncio.create_task(
                        self._pump_response(upstream, writer, tap, exchange, naming, heads)
                    )
                    if watch is not None:
                        watch.follow(response)
                    continue
                exchange.complete = True
                break
        except (Cut, ConnectionError):
            pass
        except asyncio.CancelledError:  # the listener closes (or evicts): the upstream socket too
            upstream.close()
            raise
        except UpstreamFailed as exc:
            if exchange.status is None:
                name = redact_url(self.route.upstream_url)
                retried = " (tried twice, the second time on a new connection)" if exchange.replayed else ""
                message = f"llm-tray proxy: upstream {name} {exc}{retried}"
                writer.write(error_response(502, "Bad Gateway", message, "upstream_failed", upstream=name))
                exchange.status = exchange.own_status = 502
        finally:
            heads.stop()
            self.recording.release(exchange)
            forget_replay(exchange, self.recording.held)
            if watch is not None:
                watch.stop()
            if client_side is not None:
                client_side.cancel()  # (nothing when done)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await client_side
            response.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await response
        if exchange.bad_body is not None and exchange.status is None:  # nothing answered yet: say why
            writer.write(error_response(400, "Bad Request", exchange.bad_body, "bad_request"))
            exchange.status = exchange.own_status = 400
        if exchange.read_held is not None:
            exchange.read_held()  # (payloads before a first text, held for a moment)
        # Only an answer the proxy wrote itself is told to the recorder here: the upstream's own head
        # (a 400 refusal with its numbers) was read by the recorder as it passed.
        self.recording.record(tap, naming, status=exchange.own_status, aborted=not exchange.complete)
        if not (exchange.complete and keep and framer.done):
            upstream.close()
            return False, None
        upstream.idle_since_s = time.monotonic()
        upstream.answers += 1
        return head.keep_alive(), upstream

    async def _client_side(
        self,
        client: Reader,
        framer: BodyFramer,
        upstream: Upstream,
        tap: RequestTap,
        auth: str | None,
        exchange: Exchange,
        held_head: bytes = b"",
    ) -> str:
        """Forward the request body (after `held_head`, the request head when it waits to go up with
        the body's first bytes), then watch the client: "gone" when it hangs up (or sent a
        malformed body), "stalled" when its body stops for limits.BODY_STALL_TIMEOUT_S, "more" when it
        sends the next request early (kept for the next round)."""
        while not framer.done:
            try:
                data = await client.read_within(limits.BODY_STALL_TIMEOUT_S)
            except asyncio.TimeoutError:
                return "stalled"
            if not data:
                return "gone"
            try:
                payload = send_body_piece(
                    data, client, framer, upstream, exchange, held_head, self.recording.held
                )
            except FramingError as exc:  # none of these bytes goes up; the upstream is closed
                exchange.bad_body = str(exc)
                return "bad"
            held_head = b""
            self.recording.body_sent(tap, payload, framer, auth, exchange)
            await upstream.writer.drain()
        data = await client.read_some()
        if not data:
            return "gone"
        client.unread(data)
        return "more"

    def _bad_chunk(self, exc: FramingError) -> None:
        self._say_once(
            "bad-chunk",
            "proxy: upstream %s sent a malformed body (%s): response cut",
            redact_url(self.route.upstream_url),
            exc,
        )

    async def _pump_response(
        self,
        upstream: Upstream,
        writer: asyncio.StreamWriter,
        tap: RequestTap,
        exchange: Exchange,
        naming: LaterName | None,
        heads: HeadForwarder,
    ) -> bool:
        """Forward one response; True when the upstream connection may carry another request. The
        client's lookup (`naming`) begins once the head is out; a stream's, at its first text."""
        answer = await heads.forwarded()  # the head and the first bytes went out in the read callback
        forget_replay(exchange, self.recording.held)  # an answer has begun: it is never sent again
        forwarder = answer.body
        try:  # the recorder's work (the head told, the request read, the client named) from here on
            if exchange.parsed is not None:  # a big request body still being read off the loop
                with contextlib.suppress(Exception):
                    await asyncio.shield(exchange.parsed)
            headers = {name: values[-1] for name, values in answer.head.by_name.items()}
            self.recording.feed(tap.response_head, answer.status, headers, answer.received_mono_s)
            if naming is not None and not tap.streaming:
                naming.begin()
            if forwarder is not None:
                reader = self.recording.body_reader(tap, naming)
                exchange.read_held = reader.read_held
                forwarder.deliver_to(reader)
            await drain(writer)
        except BaseException:
            if forwarder is not None:
                upstream.stream.forwarder = None
                forwarder.stop()
            raise
        if forwarder is not None and not await forward_body(upstream.stream, forwarder):
            return False
        return answer.head.keep_alive() and not answer.trailing
