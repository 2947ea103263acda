"""Running proxies on their own event-loop thread (the tray app, `llm-tray proxy`)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence

from trayapp.services.proxy.prompt_length import PromptBoard
from trayapp.services.proxy.recording import RecordSink
from trayapp.services.proxy.route import Route
from trayapp.services.proxy.server import ProxyServer
from trayapp.sources.malloc import return_big_buffers_to_the_os

log = logging.getLogger(__name__)


class _LoopErrors:
    """What reaches the proxies' event loop unhandled (asyncio's accept loop out of descriptors:
    EMFILE; it retries by itself a second later) is logged once per kind, without a traceback after
    the first; the listeners keep serving."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        kind = type(exc).__name__ + str(getattr(exc, "errno", "")) if exc is not None else message[:40]
        if kind in self._said:
            return
        self._said.add(kind)
        log.warning(
            "proxy: %s (%s); the listeners keep serving (said once)",
            message or "error",
            f"{type(exc).__name__}: {exc}" if exc is not None else "no exception",
        )


def new_loop() -> asyncio.AbstractEventLoop:
    """The proxies' event loop: uvloop's where it is installed (the optional `fast` extra; its
    transports and timers are C: measured in bench/proxy_overhead.py), else asyncio's own. Set
    LLM_TRAY_PROXY_LOOP=asyncio to keep asyncio's with uvloop installed."""
    return_big_buffers_to_the_os()  # the process that proxies holds request bodies
    if os.environ.get("LLM_TRAY_PROXY_LOOP", "").strip().lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()  # typed where uvloop is not installed
            return loop
    return asyncio.new_event_loop()


async def start_all(
    routes: Sequence[Route], on_record: RecordSink, prompts: PromptBoard | None = None
) -> list[ProxyServer]:
    """Bind every route; on a failure the ones already bound are closed and the error raised."""
    servers: list[ProxyServer] = []
    try:
        for route in routes:
            server = ProxyServer(route, on_record, prompts, listeners=len(routes))
            await server.start()
            servers.append(server)
    except BaseException:
        for server in servers:
            await server.close()
        raise
    return servers


class ProxyThread:
    """The proxies on their own event loop thread: the GUI and the sampler never wait on them."""

    def __init__(
        self, routes: Sequence[Route], on_record: RecordSink, prompts: PromptBoard | None = None
    ) -> None:
        self.routes = tuple(routes)
        self._on_record = on_record
        self._prompts = prompts  # the lengths of the prompts being read (the monitor's inbox)
        self._loop = new_loop()
        self._loop.set_exception_handler(_LoopErrors().handle)
        self._servers: list[ProxyServer] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="llm-tray-proxy", daemon=True)

    @property
    def event_loop(self) -> str:
        """The proxies' event loop, "uvloop" or "asyncio" (said by `llm-tray proxy --json` and the log)."""
        return "uvloop" if type(self._loop).__module__.split(".")[0] == "uvloop" else "asyncio"

    @property
    def servers(self) -> tuple[ProxyServer, ...]:
        """The listeners, once started."""
        return tuple(self._servers)

    def start(self, timeout_s: float = 10.0) -> list[str]:
        """Bind every route and return their listen URLs; OSError (port taken…) when one cannot bind."""
        self._thread.start()
        starting = start_all(self.routes, self._on_record, self._prompts)
        future = asyncio.run_coroutine_threadsafe(starting, self._loop)
        try:
            self._servers = future.result(timeout_s)
        except BaseException:
            self.stop()
            raise
        return [server.listen_url for server in self._servers]

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self._thread.is_alive():
            return

        async def close_all() -> None:
            for server in self._servers:
                await server.close()
            await _finish_leftover_tasks(self._servers)

        try:
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self._loop.close()


async def _finish_leftover_tasks(servers: Sequence[ProxyServer], limit_s: float = 5.0) -> None:
    """Let connections accepted as the listeners closed get their handlers, then end those
    handlers (each closes its sockets), until nothing is left on the loop or `limit_s` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        await asyncio.sleep(0.01)  # an accepted socket's handler starts within a few loop turns
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if not others:
            return
        for server in servers:
            server.cancel_connections()
        await asyncio.wait(others, timeout=max(0.0, min(0.5, deadline - loop.time())))
