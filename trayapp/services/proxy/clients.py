"""Who sent a proxied request (#22): the process at the other end of a loopback connection, else the
client's `User-Agent` product token. Never anything of the request's body.

A loopback client's process is found by its socket: the connection whose local address is the
client's end (127.0.0.1, its port) and whose remote address is the proxy's listener. It runs on a
worker thread, one scan at a time, only for recorded requests, and one scan names every connection
open at that moment (its answers are kept a few seconds); lookups asked while one runs go together in
the next. Another user's process cannot be read without privileges: it is then "another user's
process". Forwarding never waits on any of this.

Which process holds a socket: sources/socket_owners.py (psutil's `net_connections`, 10-30 ms of
Python holding the GIL on a busy host, was what the proxy's event loop waited on mid-stream: issue
#26's profile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from trayapp.config.bugs import BugLog
from trayapp.core.loopback import is_loopback
from trayapp.core.model import FinishedRequest
from trayapp.core.vram_holders import OTHER_USER
from trayapp.sources import socket_owners
from trayapp.sources.socket_owners import CLOSED, Owner

log = logging.getLogger(__name__)

CLIENT_NAME_WAIT_S = 2.0  # a record waits at most this for its client's name after the response ends
NAME_KEPT_S = 30.0  # a process's name is read again after this: its pid may belong to another by then
SCAN_FRESH_S = 5.0  # a scan's answers name connections opened up to this long before another scan
_PRODUCT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,39}")

Named = tuple[str | None, int | None]  # (name, pid)
_T = TypeVar("_T")


def user_agent_product(user_agent: str | None) -> str | None:
    """The product token a `User-Agent` starts with (`aider/0.86 python-httpx/0.28` → `aider`), or None."""
    if not user_agent:
        return None
    found = _PRODUCT_RE.match(user_agent.strip())
    return found.group(0) if found else None


def _process_name(pid: int) -> str | None:
    """The process's name; None when it is gone (a `curl` that read its short answer and exited)."""
    from trayapp.sources.processes import process_name  # psutil loads when a client is first named

    return process_name(pid)


def _or_user_agent(found: Named, user_agent: str | None) -> Named:
    """A client process gone before its name was read is named by its request's `User-Agent` product
    (else "pid N"), its pid kept."""
    name, pid = found
    if name is None and pid is not None:
        return user_agent_product(user_agent) or f"pid {pid}", pid
    return found


class ClientNamer:
    """Names the clients of one listener."""

    def __init__(self) -> None:
        self._ports: dict[int, int | None] = {}  # from the last scan
        self._scanned_mono_s = float("-inf")
        self._scan_task: asyncio.Task[None] | None = None
        self._names: dict[int, tuple[str | None, float]] = {}  # pid → (its name, when read: monotonic
        #                                                        s); None: gone when read
        self._reading: dict[int, asyncio.Future[Named]] = {}  # pid → its name being read
        self._asked: list[
            tuple[tuple[str, int], tuple[str, int], asyncio.Future[tuple[bool, int | None]]]
        ] = []
        self._owners_task: asyncio.Task[None] | None = None

    def name(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> asyncio.Future[Named]:
        """(name, pid) of the client at `peer` (the connection's peer address; `local`: its address
        on this side, for a lookup of that one socket where the system allows it). Answered from
        callbacks where that lookup tells (no task a request, issue #26), else by a scan's task."""
        port = _loopback_port(peer)
        if port is None:
            return _answered((user_agent_product(user_agent), None))
        if _loopback_port(local) is None:
            return asyncio.ensure_future(self._name_by_scan(port, listen_port, user_agent))
        assert isinstance(peer, tuple) and isinstance(local, tuple)
        named: asyncio.Future[Named] = asyncio.get_running_loop().create_future()

        def owned(owner: Owner) -> None:
            if owner == CLOSED:  # gone before its lookup (a short answer read at once): no scan finds it
                named.set_result((user_agent_product(user_agent), None))
                return
            known, pid = owner
            then = self._named_pid(pid) if known else self._name_by_scan(port, listen_port, user_agent)
            _chain(
                asyncio.ensure_future(then),
                named,
                lambda found: named.set_result(_or_user_agent(found, user_agent)),
            )

        _chain(self._owner(peer[:2], local[:2]), named, owned)
        return named

    async def _name_by_scan(self, port: int, listen_port: int, user_agent: str | None) -> Named:
        """`name` from a scan of every connection to the listener."""
        asked_mono_s = time.monotonic()
        for _ in range(2):  # a scan already running may have begun before this connection existed
            if port in self._ports and self._scanned_mono_s >= asked_mono_s - SCAN_FRESH_S:
                break
            await self._rescan(listen_port)
            if self._scanned_mono_s >= asked_mono_s:
                break
        if port not in self._ports:
            return user_agent_product(user_agent), None
        found = await asyncio.shield(self._named_pid(self._ports[port]))  # shared: never cancelled by one
        return _or_user_agent(found, user_agent)

    def _owner(self, peer: tuple[str, int], local: tuple[str, int]) -> asyncio.Future[Owner]:
        """`socket_owners.owners_of` for one connection: those asked while a lookup runs go together in
        the next (one thread hop and one pass over /proc for a burst of connections, not one each)."""
        answer: asyncio.Future[Owner] = asyncio.get_running_loop().create_future()
        self._asked.append((peer, local, answer))
        if self._owners_task is None or self._owners_task.done():
            self._owners_task = asyncio.ensure_future(self._look_up_owners())
        return answer

    async def _look_up_owners(self) -> None:
        while self._asked:
            batch, self._asked = self._asked, []
            pairs = [(peer, local) for peer, local, _ in batch]
            try:
                owners = socket_owners.owners_if_the_last_client(pairs)
                if owners is None:
                    owners = await asyncio.to_thread(socket_owners.owners_of, pairs)
            except Exception as exc:  # a bug: every lookup of the batch raises it (NamedRecords logs it)
                for *_, answer in batch:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for (*_, answer), owner in zip(batch, owners, strict=True):
                if not answer.done():  # not given up meanwhile
                    answer.set_result(owner)

    def _named_pid(self, pid: int | None) -> asyncio.Future[Named]:
        if pid is None:
            return _answered((OTHER_USER, None))
        known = self._names.get(pid)
        if known is not None and time.monotonic() - known[1] <= NAME_KEPT_S:  # later, the pid may be reused
            return _answered((known[0], pid))
        reading = self._reading.get(pid)
        if reading is None:  # one read for a burst of connections from one process, not one each
            reading = self._reading[pid] = asyncio.ensure_future(self._read_name(pid))
            reading.add_done_callback(lambda _: self._reading.pop(pid, None))
        return reading

    async def _read_name(self, pid: int) -> Named:
        read_mono_s = time.monotonic()
        known = (await asyncio.to_thread(_process_name, pid), read_mono_s)
        self._names.pop(pid, None)
        self._names[pid] = known
        if len(self._names) > 1024:  # pids come and go: keep the newest
            self._names.pop(next(iter(self._names)))
        return known[0], pid

    async def _rescan(self, listen_port: int) -> None:
        if self._scan_task is None or self._scan_task.done():
            self._scan_task = asyncio.ensure_future(self._run_scan(listen_port))
        await asyncio.shield(self._scan_task)

    async def _run_scan(self, listen_port: int) -> None:
        started = time.monotonic()
        self._ports = await asyncio.to_thread(socket_owners.scan, listen_port)
        self._scanned_mono_s = started


class NamedRecords:
    """Hands each record on (`emit`) with its client's name: the name is looked up from the request's
    start (`lookup`), and a record waits at most CLIENT_NAME_WAIT_S for it once its response ended
    (a callback and a timer: no task a record)."""

    def __init__(self, emit: Callable[[FinishedRequest], None]) -> None:
        self._emit = emit
        self._namer = ClientNamer()
        self._waiting: dict[asyncio.Future[Named], tuple[FinishedRequest, asyncio.TimerHandle]] = {}
        self._bugs = BugLog(log)

    def lookup(
        self, peer: object, listen_port: int, user_agent: str | None, local: object = None
    ) -> asyncio.Future[Named]:
        return asyncio.ensure_future(self._namer.name(peer, listen_port, user_agent, local))

    def hand_on(self, record: FinishedRequest, naming: asyncio.Future[Named] | None) -> None:
        if naming is None:
            self._emit(record)
        elif naming.done():
            self._emit_named(record, naming)
        else:
            timer = asyncio.get_running_loop().call_later(CLIENT_NAME_WAIT_S, self._give_up, naming)
            self._waiting[naming] = (record, timer)
            naming.add_done_callback(self._named)

    def _named(self, naming: asyncio.Future[Named]) -> None:
        waiting = self._waiting.pop(naming, None)
        if waiting is not None:  # else given up: its record went out unnamed
            waiting[1].cancel()
            self._emit_named(waiting[0], naming)

    def _give_up(self, naming: asyncio.Future[Named]) -> None:
        """A client unnamed is a record all the same."""
        waiting = self._waiting.pop(naming, None)
        naming.cancel()
        if waiting is not None:
            waiting[1].cancel()
            self._emit(waiting[0])

    def _emit_named(self, record: FinishedRequest, naming: asyncio.Future[Named]) -> None:
        if naming.cancelled():
            pass
        elif (exc := naming.exception()) is not None:  # a bug: logged once, the record goes out unnamed
            self._bugs.report(exc, "proxy client naming")
        else:
            name, pid = naming.result()
            record = dataclasses.replace(record, client_name=name, client_pid=pid)
        self._emit(record)

    async def close(self) -> None:
        """Every record still waiting for its name goes out, named or not."""
        if self._waiting:
            await asyncio.wait(list(self._waiting), timeout=CLIENT_NAME_WAIT_S + 1)
        for naming in list(self._waiting):
            self._give_up(naming)


def _answered(value: Named) -> asyncio.Future[Named]:
    answer: asyncio.Future[Named] = asyncio.get_running_loop().create_future()
    answer.set_result(value)
    return answer


def _chain(
    source: asyncio.Future[_T], target: asyncio.Future[Named], on_result: Callable[[_T], None]
) -> None:
    """Once `source` ends: its result to `on_result`, its failure or cancellation to `target`; nothing
    when `target` was given up on meanwhile."""

    def done(source: asyncio.Future[_T]) -> None:
        if target.done():
            return
        if source.cancelled():
            target.cancel()
        elif (exc := source.exception()) is not None:
            target.set_exception(exc)
        else:
            on_result(source.result())

    source.add_done_callback(done)


def _loopback_port(peer: object) -> int | None:
    """The client's port when `peer` is a loopback address (host, port[, …]), else None."""
    if isinstance(peer, tuple) and len(peer) >= 2 and isinstance(peer[0], str) and isinstance(peer[1], int):
        return peer[1] if is_loopback(peer[0]) else None
    return None
