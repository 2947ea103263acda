"""What one listener tells its recorder beside the forwarding: each request's tap, the request body's
pieces under the listener's budget for held bytes, the prompt counter, the client's name, and the
finished record handed on. The forwarding never waits on any of it, and a recorder bug is logged once
and never breaks a stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy import limits
from trayapp.services.proxy.admission import HeldBytes
from trayapp.services.proxy.clients import Named, NamedRecords
from trayapp.services.proxy.exchange import Exchange
from trayapp.services.proxy.http1 import BodyFramer, Head, RequestLine
from trayapp.services.proxy.prompt_length import PromptBoard, PromptCounter
from trayapp.services.proxy.recorder import RequestTap
from trayapp.services.proxy.route import Route

log = logging.getLogger(__name__)

RecordSink = Callable[[Route, FinishedRequest], None]


class LaterName:
    """A request's client lookup, begun by `begin()` (once the answer's head went to the client, a
    stream's first text, or when the record is made) or limits.NAME_CLIENT_AFTER_S after it was made,
    whichever is first."""

    def __init__(self, lookup: Callable[[], asyncio.Future[Named]]) -> None:
        self._lookup = lookup
        self._naming: asyncio.Future[Named] | None = None
        self._timer = asyncio.get_running_loop().call_later(limits.NAME_CLIENT_AFTER_S, self.begin)

    def begin(self) -> asyncio.Future[Named]:
        if self._naming is None:
            self._timer.cancel()
            self._naming = self._lookup()
        return self._naming


class BodyReader:
    """An answer's payloads, to the recorder's tap as they are forwarded (one call a read). A stream's
    before its first text are read limits.FIRST_TEXT_LOOKAHEAD_S after they came (`read_held`), with
    their times: the first token right behind a role-only chunk goes to the client first (issue #26);
    any other answer's (a JSON document, an error, one not recorded), as they come. At the
    first text, the prompt has been read, and the client's lookup begins if it has not: a stream's
    client is there until its end, and the lookups of streams starting together no longer come among
    their heads and first tokens."""

    def __init__(
        self, tap: RequestTap, prompts: PromptCounter, naming: LaterName | None, bug: Callable[[], None]
    ) -> None:
        self._tap, self._prompts, self._naming, self._bug = tap, prompts, naming, bug
        # None (read at once) from a stream's first text on, and for any other answer
        self._held: list[tuple[bytes, float]] | None = [] if tap.active and tap.streaming else None
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self, payload: bytes, received_mono_s: float) -> None:
        if self._held is None:
            self._read(payload, received_mono_s)
            return
        self._held.append((payload, received_mono_s))
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(limits.FIRST_TEXT_LOOKAHEAD_S, self.read_held)

    def read_held(self) -> None:
        """Read what is held now (the lookahead is over, or the answer has ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        for payload, received_mono_s in held or ():
            self._read(payload, received_mono_s)
        if self._tap.first_text_mono_s is not None or not self._tap.active:
            self._held = None

    def _read(self, payload: bytes, received_mono_s: float) -> None:
        had_text = self._tap.first_text_mono_s is not None
        try:
            self._tap.response_body(payload, received_mono_s)
        except Exception:
            self._bug()
        if not had_text and self._tap.first_text_mono_s is not None:
            self._prompts.prompt_read(self._tap)
            if self._naming is not None:
                self._naming.begin()


class Recording:
    """One listener's recorder side."""

    def __init__(self, route: Route, on_record: RecordSink, prompts: PromptBoard | None = None) -> None:
        self.route = route
        self.on_record = on_record
        self.held = HeldBytes(limits.REQUEST_BODIES_HELD_BYTES)  # request bytes held now (all connections)
        self.prompts = PromptCounter(
            prompts, route.upstream_url, route.server_kind, self.held, limits.COUNT_PROMPT_FROM_BYTES
        )
        self._clients = NamedRecords(self._emit)  # who sent each recorded request
        self._parse_gate: asyncio.Semaphore | None = None  # one big body parsed off the loop at a time
        self._failed = False
        self._said_budget = False

    def tap(self, line: RequestLine, started_mono_s: float, started_wall_s: float) -> RequestTap:
        return RequestTap(
            server_kind=self.route.server_kind,
            method=line.method,
            path=line.path,
            started_mono_s=started_mono_s,
            started_wall_s=started_wall_s,
            request_body_limit_bytes=limits.REQUEST_BODY_KEPT_BYTES,
        )

    def name_client(
        self, tap: RequestTap, head: Head, writer: asyncio.StreamWriter, listen_port: int
    ) -> LaterName | None:
        """Who sent a recorded request, looked up while its socket is open, after the answer's first
        bytes (limits.NAME_CLIENT_AFTER_S)."""
        if not tap.active:
            return None
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        user_agent = head.get("user-agent")
        return LaterName(lambda: self._clients.lookup(peer, listen_port, user_agent, local))

    def body_sent(
        self, tap: RequestTap, payload: bytes, framer: BodyFramer, auth: str | None, exchange: Exchange
    ) -> None:
        """A piece of the request body went up: its payload held; once the body is whole, the prompt
        counted (the response head, which ends the copy, may come at the next drain)."""
        if payload and tap.active:
            self._hold(tap, payload, exchange)
        if framer.done:
            self.feed(self.prompts.request_sent, tap, auth)
            if tap.active and exchange.held > limits.PARSE_OFF_LOOP_BYTES:
                exchange.parsed = asyncio.ensure_future(self._parse_off_loop(tap, exchange))

    def body_reader(self, tap: RequestTap, naming: LaterName | None = None) -> BodyReader:
        """What each payload of `tap`'s response body goes to, as it is forwarded (one call a read);
        its `read_held` is called before the record is made."""
        return BodyReader(tap, self.prompts, naming, self._bug)

    def record(self, tap: RequestTap, naming: LaterName | None, *, status: int | None, aborted: bool) -> None:
        """The request ended: its record goes on (named when the name comes). `status`: an answer the
        proxy wrote itself (the upstream's own head was read as it passed)."""
        if not tap.active:
            return
        self.prompts.request_ended(tap)
        try:
            if status is not None:
                tap.response_head(status, {}, time.monotonic())
            record = tap.finish(now_mono_s=time.monotonic(), now_wall_s=time.time(), aborted=aborted)
        except Exception:
            self._bug()
            return
        if record is not None:
            self._clients.hand_on(record, naming.begin() if naming is not None else None)

    def release(self, exchange: Exchange) -> None:
        """Give back the body bytes the recorder held for `exchange`."""
        self.held.give(exchange.held)
        exchange.held = 0

    def feed(self, method: Callable[..., None], *args: object) -> None:
        """Call a recorder method; a bug in it is logged once and the stream goes on."""
        try:
            method(*args)
        except Exception:
            self._bug()

    async def close(self) -> None:
        await self._clients.close()  # records still waiting for their client's name: out, named or not
        await self.prompts.close()

    def _hold(self, tap: RequestTap, payload: bytes, exchange: Exchange) -> None:
        """Give the recorder a piece of the request body while the listener's budget for held bodies
        allows; past it the recorder gets nothing more of this body (the request is still forwarded)."""
        if exchange.over_budget:
            return
        if not self.held.take(len(payload)):
            exchange.over_budget = True
            self.feed(tap.drop_request)
            self.release(exchange)
            if not self._said_budget:
                self._said_budget = True
                log.warning(
                    "proxy: request bodies held past %d MiB: a body is forwarded unread",
                    limits.REQUEST_BODIES_HELD_BYTES >> 20,
                )
            return
        exchange.held += len(payload)
        self.feed(tap.request_body, payload)

    async def _parse_off_loop(self, tap: RequestTap, exchange: Exchange) -> None:
        """Read a big request body on a worker thread, one at a time: the streams never wait on it."""
        if self._parse_gate is None:
            self._parse_gate = asyncio.Semaphore(1)
        async with self._parse_gate:
            try:
                await asyncio.to_thread(tap.read_request)
            except Exception:
                self._bug()
        self.release(exchange)

    def _emit(self, record: FinishedRequest) -> None:
        try:
            self.on_record(self.route, record)
        except Exception:
            self._bug()

    def _bug(self) -> None:
        if not self._failed:
            self._failed = True
            log.exception("proxy recorder failed (the stream is forwarded unrecorded)")
