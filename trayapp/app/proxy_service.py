"""The tray app's recording proxies: one ProxyThread per enabled `[[proxies]]` entry.

Records reach the monitor's tick through the RecordInbox the app shares with its Monitor.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trayapp.config.settings import ProxyConfig, proxy_token
from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.inbox import RecordInbox

if TYPE_CHECKING:  # loaded when a proxy is turned on: asyncio and the HTTP stack cost ~0.2 s at start
    from trayapp.services.proxy.route import Route
    from trayapp.services.proxy.runner import ProxyThread

log = logging.getLogger(__name__)


class ProxyService:
    """The recording proxies turned on in the settings, one ProxyThread each (a taken port stops only
    its own proxy). Binding a loopback port is quick, and no upstream is contacted until a client calls."""

    def __init__(self, inbox: RecordInbox, environ: Mapping[str, str] = os.environ) -> None:
        self.inbox = inbox
        self._environ = environ
        self._running: dict[ProxyConfig, ProxyThread] = {}

    @property
    def running(self) -> list[ProxyConfig]:
        return list(self._running)

    def _on_record(self, route: Route, record: FinishedRequest) -> None:
        self.inbox.put(route.upstream_url, record)

    def apply(self, proxies: Sequence[ProxyConfig]) -> list[str]:
        """Run exactly the enabled `proxies` (unchanged ones keep running); returns why any did not start."""
        wanted = [p for p in proxies if p.enabled]
        for config in [c for c in self._running if c not in wanted]:
            self._running.pop(config).stop()
        problems: list[str] = []
        if wanted:
            from trayapp.services.proxy.route import Route
            from trayapp.services.proxy.runner import ProxyThread
        for config in wanted:
            if config in self._running:
                continue
            token, why = proxy_token(config, self._environ)
            if why is not None:
                problems.append(why)
                continue
            try:
                route = Route(
                    config.listen_host, config.listen_port, config.upstream, config.kind or "openai", token
                )
                thread = ProxyThread([route], self._on_record, self.inbox)
                thread.start(timeout_s=5.0)
            except Exception as exc:  # OSError: the port is taken (or not ours to bind)
                taken = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
                why = f"port {config.listen_port} is already in use" if taken else str(exc) or repr(exc)
                problems.append(f"proxy {config.listen} not started: {why}. Choose another port in Settings.")
                continue
            if config.remote:
                log.warning(
                    "proxy %s: no TLS: the token and all traffic cross the network in clear text",
                    config.listen,
                )
            log.info("proxy %s → %s started (%s)", config.client_url, config.upstream, thread.event_loop)
            self._running[config] = thread
        self.inbox.set_upstreams(c.upstream for c in self._running)  # their polled records give way
        return problems

    def stop(self) -> None:
        self.inbox.set_upstreams(())
        while self._running:
            self._running.popitem()[1].stop()
