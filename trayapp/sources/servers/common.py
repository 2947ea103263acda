"""The skeleton every server probe shares: `HttpProbe`."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from trayapp.config.bugs import BugLog
from trayapp.core.loopback import is_loopback_url
from trayapp.core.model import SERVER_STATES, ServerReading, ServerState
from trayapp.core.redact import redact_url
from trayapp.sources.http import (
    DEFAULT_TIMEOUT,
    FetchError,
    LoopbackGetter,
    Response,
    UnexpectedAnswer,
    auth_headers,
    fetch,
    make_client,
)
from trayapp.sources.processes import find_listening_pid

log = logging.getLogger(__name__)

PID_RETRY_S = 30.0  # look for the listening process again at most this often while none is found


class HttpProbe:
    """One server over HTTP. Subclasses override only `_poll`; `poll` never raises.

    `poll` owns what every probe shares: the client, the timing (`elapsed_s`),
    the failure mapping, and the log. A `FetchError` from `_poll` becomes its
    status and reason; an `UnexpectedAnswer` (an answer of an unexpected shape)
    status "error" saying what was wrong; any other exception — a `ValueError`
    or `KeyError` included — is a bug: status "error", reason "internal error:
    …", and its traceback logged once per distinct failure (`BugLog`). Status
    changes are logged. `url`, the server's name everywhere it is shown or stored, is the given URL
    without credentials or query (`redact_url`); only the client holds those. The client is closed
    by `close` only when the probe made it. A probe makes its httpx client on first use: plain GETs
    to a server on this machine never need one, and its TLS set-up is ~3 MiB of a tray's memory.
    """

    kind: str

    def __init__(self, url: str, *, client: httpx.Client | None = None, api_key: str | None = None) -> None:
        self.url = redact_url(url)
        base = url.rstrip("/")
        self._base = base
        self._own_client = client is None
        self._made_client = client
        self._prefix = "" if client is None or str(client.base_url) else base  # an injected one may lack it
        self._headers = auth_headers(api_key)
        # plain GETs to a server on this machine skip httpx (a sixth of its CPU per request, issue #26)
        self._getter = LoopbackGetter.for_url(base, DEFAULT_TIMEOUT) if self._own_client else None
        self._local = is_loopback_url(base)
        self._pid: int | None = None
        self._pid_checked_at: float | None = None
        self._last_status: str | None = None
        self._bugs = BugLog(log)
        self._closed = False  # by `close`; what is open is closed once no poll runs
        self._polls_running = 0  # polls on other threads (the monitor's poll threads) as it closes
        self._closing_lock = threading.Lock()

    def poll(self, now_mono_s: float) -> ServerReading:
        started = time.perf_counter()
        with self._closing_lock:
            self._polls_running += 1
        try:
            reading = self._poll(now_mono_s)
        except (FetchError, UnexpectedAnswer) as exc:
            reading = self._failure_reading(exc)
        except Exception as exc:  # the one boundary on the poll path: a bug, reported and logged
            reason = self._bugs.report(exc, f"{self.kind} {self.url}: poll")
            reading = ServerReading(self.kind, self.url, "error", reason)
        finally:
            with self._closing_lock:
                self._polls_running -= 1
                release = self._closed and not self._polls_running
            if release:  # closed by another thread as it ran: what it opened goes now
                self._release()
        reading = replace(reading, elapsed_s=time.perf_counter() - started)
        if reading.status != self._last_status:
            detail = f" ({reading.reason})" if reading.reason else ""
            log.info("%s %s: %s -> %s%s", self.kind, self.url, self._last_status, reading.status, detail)
            self._last_status = reading.status
        return reading

    @property
    def _client(self) -> httpx.Client:
        """The httpx client: the injected one, or one made now for the first request that needs it."""
        if self._made_client is None:
            self._made_client = make_client(self._base)
        return self._made_client

    def close(self) -> None:
        """Close what the probe opened (a client, a kept connection). A poll running on another thread
        meanwhile ends as usual, then closes it: its answers are not cut, nothing it opens leaks."""
        with self._closing_lock:
            self._closed = True
            release = not self._polls_running
        if release:
            self._release()

    def _release(self) -> None:
        if self._own_client:
            client, self._made_client = self._made_client, None
            if client is not None:
                client.close()
        if self._getter is not None:
            self._getter.close()

    def _poll(self, now_mono_s: float) -> ServerReading:  # pragma: no cover - overridden
        raise NotImplementedError

    def _failure_reading(self, exc: FetchError | UnexpectedAnswer) -> ServerReading:
        """The reading for a failed request or an unexpected answer (what `poll` gives for them)."""
        if isinstance(exc, FetchError):
            self._pid = None  # a restarted server gets a new pid
            status: ServerState = exc.status if exc.status in SERVER_STATES else "error"
            return ServerReading(self.kind, self.url, status, exc.reason)
        return ServerReading(self.kind, self.url, "error", f"unexpected answer: {exc}")

    def _fetch(self, path: str, **kwargs: Any) -> Response:
        """A request to `path` (GET unless `method=` says otherwise), with the probe's headers."""
        if self._getter is not None and not kwargs.keys() - {"max_bytes", "ok_statuses"}:
            answer = self._getter.get(path, headers=self._headers, **kwargs)
            if answer is not None:
                return answer
        return fetch(self._client, self._prefix + path, headers=self._headers, **kwargs)

    def _fetch_json(self, path: str, **kwargs: Any) -> Any:
        """The JSON body of a request to `path`; a body that is not JSON is a FetchError naming the path."""
        response = self._fetch(path, **kwargs)
        try:
            return response.json()
        except FetchError as exc:
            raise FetchError(exc.status, f"{path}: {exc.reason}", exc.http_status) from exc

    def _server_pid(self, now_mono_s: float) -> int | None:
        """The pid listening on the server's port, when the server is on this machine."""
        if not self._local:
            return None
        checked = self._pid_checked_at
        if self._pid is None and (checked is None or now_mono_s - checked >= PID_RETRY_S):
            self._pid_checked_at = now_mono_s
            parts = urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)  # the port the client connects to
            self._pid = find_listening_pid(port)
        return self._pid
