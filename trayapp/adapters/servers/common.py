"""Plumbing shared by the server probes: the HTTP probe base and background model-file reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from trayapp.adapters.http import FetchError, auth_headers, fetch, is_loopback_url, make_client
from trayapp.adapters.processes import find_listening_pid
from trayapp.core.model import ModelFacts, ServerReading

FactsLoader = Callable[[str], "ModelFacts | None"]  # local GGUF path -> exact facts (may be slow once)

PID_RETRY_S = 30.0  # look for the listening process again at most this often while none is found


def load_in_background(loader: FactsLoader, path: str, thread_name: str) -> Future[ModelFacts | None]:
    """Run `loader(path)` in a daemon thread; the Future gets its result, or the exception it raised."""
    future: Future[ModelFacts | None] = Future()

    def run() -> None:
        try:
            future.set_result(loader(path))
        except BaseException as exc:  # stored: the caller decides what a failure means
            future.set_exception(exc)

    threading.Thread(target=run, name=thread_name, daemon=True).start()
    return future


class HttpProbe:
    """One server over HTTP; subclasses implement `_poll`. `poll` never raises.

    The client is closed by `close` only when the probe made it. A failure of
    `_poll` becomes the reading: a FetchError gives its status and reason, a
    ValueError (an unexpected payload) and any other exception (a bug) "error".
    """

    kind: str
    default_port: int | None = None  # when the URL names no port; else the scheme's (80 / 443)

    def __init__(self, url: str, *, client: httpx.Client | None = None, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._own_client = client is None
        self._client = client if client is not None else make_client(self.url)
        self._headers = auth_headers(api_key)
        self._local = is_loopback_url(self.url)
        self._pid: int | None = None
        self._pid_checked_at: float | None = None

    def poll(self, now_mono_s: float) -> ServerReading:
        started = time.perf_counter()
        reading = self._read(now_mono_s)
        return replace(reading, elapsed_s=time.perf_counter() - started)

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    def _poll(self, now: float) -> ServerReading:  # pragma: no cover - overridden
        raise NotImplementedError

    def _read(self, now: float) -> ServerReading:
        """`_poll`, with every failure turned into a reading."""
        try:
            return self._poll(now)
        except FetchError as exc:
            self._pid = None  # a restarted server gets a new pid
            return ServerReading(self.kind, self.url, exc.status, exc.reason)  # type: ignore[arg-type]
        except ValueError as exc:
            return ServerReading(self.kind, self.url, "error", f"unexpected answer: {exc}")
        except Exception as exc:  # a bug: report it instead of killing the sampler
            return ServerReading(self.kind, self.url, "error", f"internal error: {type(exc).__name__}: {exc}")

    def _fetch_json(self, path: str, **kwargs: Any) -> Any:
        """The JSON body of a request to `path` (GET unless `method=` says otherwise)."""
        return fetch(self._client, path, headers=self._headers, **kwargs).json()

    def _server_pid(self, now: float) -> int | None:
        """The pid listening on the server's port, when the server is on this machine."""
        if not self._local:
            return None
        if self._pid is None and (self._pid_checked_at is None or now - self._pid_checked_at >= PID_RETRY_S):
            self._pid_checked_at = now
            parts = urlsplit(self.url)
            port = parts.port or self.default_port or (443 if parts.scheme == "https" else 80)
            self._pid = find_listening_pid(port)
        return self._pid
