"""HTTP plumbing shared by the server probes and the remote-agent poller.

Every request is bounded in time and size, never follows a proxy set in the
environment for loopback traffic, and turns every failure into a short,
human-readable `FetchError` the probes can report as a server status.

What another process answers is read within limits (docs/security.md, "Reading other processes"):
at most `max_bytes` of body (MAX_BODY_BYTES by default), never compressed (`Accept-Encoding:
identity` is asked, and a compressed answer is refused, so no small answer inflates to gigabytes),
and its JSON only when `json_problem` (core/json_limits.py) finds it neither nested deeper than
MAX_JSON_DEPTH nor holding more than MAX_JSON_VALUES values (7 MB of `{}` would be ~200 MB of
Python objects): "answer too deeply nested" / "answer too large", never a RecursionError.
"""

from __future__ import annotations

import functools
import http.client
import json
import select
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from trayapp.core.json_limits import json_problem
from trayapp.core.loopback import is_loopback_url
from trayapp.sources.http_wire import BodyTooLarge, get_request, read_body, read_head

DEFAULT_TIMEOUT = httpx.Timeout(connect=1.0, read=2.0, write=2.0, pool=1.0)
MAX_BODY_BYTES = 8 * 1024 * 1024  # no monitoring payload is anywhere near this
USER_AGENT = "llm-tray"


class FetchError(Exception):
    """A request failed. `status` is the server state it implies, `reason` says why."""

    def __init__(self, status: str, reason: str, http_status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status  # "unreachable" | "unauthorized" | "error" | "loading"
        self.reason = reason
        self.http_status = http_status


class UnexpectedAnswer(Exception):
    """A server (or its CLI) answered, but not in a shape its parser knows: status "error" saying
    what was wrong. Parsers raise only this for bad answers, so any other exception on the poll
    path is a bug (logged with its traceback, `config.bugs`)."""


@dataclass(frozen=True)
class Response:
    status_code: int
    text: str
    headers: dict[str, str]

    def json(self) -> Any:
        """The body as JSON; FetchError when it is not JSON or is beyond the limits (`json_problem`)."""
        return load_json(self.text)


def load_json(text: str) -> Any:
    """`text` parsed as JSON within the limits; FetchError ("error") saying what is wrong otherwise."""
    problem = json_problem(text)
    if problem is not None:
        raise FetchError("error", problem)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FetchError("error", f"invalid JSON ({exc.msg} at char {exc.pos})") from exc
    except RecursionError as exc:  # not reached within MAX_JSON_DEPTH; kept as the last word
        raise FetchError("error", "answer too deeply nested") from exc


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one certificate-verifying TLS context every client shares (SSL_CERT_FILE / SSL_CERT_DIR
    honoured). httpx builds a fresh one per client otherwise, loading the CA bundle each time: ~70 ms of
    CPU on a slow core, paid by every discovery probe (an idle tray's largest cost, issue #24 item 9)."""
    return httpx.create_ssl_context(trust_env=True)


def make_client(
    base_url: str = "", timeout: httpx.Timeout | float | None = None, *, trust_env: bool = True
) -> httpx.Client:
    """A client for one server. Loopback traffic never goes through an env-configured proxy, and with
    `trust_env=False` no traffic does (nothing from the environment: a remote agent's token goes to
    the agent only)."""
    return httpx.Client(
        base_url=base_url,
        verify=tls_context(),
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT,
        trust_env=trust_env and bool(base_url) and not is_loopback_url(base_url),
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        follow_redirects=False,
    )


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_message(body: str) -> str | None:
    try:
        data = load_json(body)
    except FetchError:
        return None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return None


def fetch(
    client: httpx.Client,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    max_bytes: int = MAX_BODY_BYTES,
    ok_statuses: tuple[int, ...] = (200,),
) -> Response:
    """One bounded request. Raises FetchError with a clear reason on any failure."""
    try:
        with client.stream(method, path, headers=headers, json=json_body) as resp:
            encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise FetchError(
                    "error", f"{path}: a compressed answer ({encoding}) though none was asked for"
                )
            chunks: list[bytes] = []
            size = 0
            for chunk in resp.iter_bytes():  # decodes nothing: a compressed answer is refused above
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError("error", f"{path}: response larger than {max_bytes // 1024} KiB")
                chunks.append(chunk)
            body = b"".join(chunks).decode("utf-8", errors="replace")
            status = resp.status_code
            resp_headers = {k.lower(): v for k, v in resp.headers.items()}
    except FetchError:
        raise
    except httpx.ConnectTimeout as exc:
        raise FetchError("unreachable", f"{path}: connect timed out") from exc
    except httpx.ReadTimeout as exc:
        raise FetchError("error", f"{path}: no answer within {_read_timeout(client)} s (hung?)") from exc
    except httpx.TimeoutException as exc:
        raise FetchError("error", f"{path}: timed out") from exc
    except httpx.ConnectError as exc:
        raise FetchError("unreachable", f"connection refused or unreachable ({_short(exc)})") from exc
    except httpx.RemoteProtocolError as exc:
        raise FetchError("error", f"{path}: server closed the connection ({_short(exc)})") from exc
    except httpx.HTTPError as exc:
        raise FetchError("error", f"{path}: {type(exc).__name__}: {_short(exc)}") from exc

    return _answer(path, status, body, resp_headers, ok_statuses)


def _answer(
    path: str, status: int, body: str, headers: dict[str, str], ok_statuses: tuple[int, ...]
) -> Response:
    """The response, or the FetchError its status means."""
    if status in ok_statuses:
        return Response(status, body, headers)
    message = _error_message(body)
    detail = f": {message}" if message else ""
    if status in (401, 403):
        raise FetchError("unauthorized", f"HTTP {status} on {path}{detail} (API key needed?)", status)
    if status == 503 and message and "loading" in message.lower():
        raise FetchError("loading", "loading model", status)
    raise FetchError("error", f"HTTP {status} on {path}{detail}", status)


_CLOSED_ERRORS = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)


class LoopbackGetter:
    """GETs to one plain-HTTP server on this machine over one kept-alive connection: the same limits,
    headers and failure reasons as `fetch`, for a fraction of its CPU (issue #26: the sampler's
    largest cost per tick). The request is written and the answer read on the socket itself
    (`sources/http_wire.py`: http.client's rules without its objects; a GET on a fresh connection
    ~0.25 ms of CPU here, ~0.5 through http.client). `for_url` makes one only for an `http://`
    loopback URL without credentials or query (no proxy applies to it).

    A kept connection the server closed meanwhile (cpp-httplib closes idle ones after 5 s) is
    replaced before it is used, and a GET that finds it closed is sent once more on a new one.
    One request at a time: `get` answers None while another runs (the caller uses `fetch`)."""

    def __init__(self, host: str, port: int, base_path: str, timeout: httpx.Timeout) -> None:
        self._address = (host, port)
        self._host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._base_path = base_path
        self._connect_timeout_s = timeout.connect if timeout.connect is not None else 1.0
        self._read_timeout_s = timeout.read if timeout.read is not None else 2.0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, timeout: httpx.Timeout = DEFAULT_TIMEOUT) -> LoopbackGetter | None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not is_loopback_url(url) or parts.username or parts.password:
            return None
        if parts.query or parts.fragment or parts.hostname is None:
            return None
        try:
            port = parts.port or 80
        except ValueError:
            return None
        return cls(parts.hostname, port, parts.path.rstrip("/"), timeout)

    def get(
        self,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        max_bytes: int = MAX_BODY_BYTES,
        ok_statuses: tuple[int, ...] = (200,),
    ) -> Response | None:
        """One bounded GET of `path` (below the URL's path); FetchError as `fetch` raises them."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            request = get_request(
                self._base_path + path,
                {
                    "Host": self._host_header,
                    "User-Agent": USER_AGENT,
                    "Accept": "*/*",
                    "Accept-Encoding": "identity",
                    **(headers or {}),
                },
            )
            reused = self._sock is not None and not self._stale()
            try:
                return self._get(path, request, max_bytes, ok_statuses)
            except _CLOSED_ERRORS:
                if not reused:
                    raise
                self.close()  # closed while it waited: a GET is safe to send again
                return self._get(path, request, max_bytes, ok_statuses)
        except (*_CLOSED_ERRORS, http.client.IncompleteRead) as exc:
            self.close()
            raise FetchError("error", f"{path}: server closed the connection ({_short(exc)})") from exc
        except FetchError:
            self.close()
            raise
        except TimeoutError as exc:
            self.close()
            raise FetchError("error", f"{path}: no answer within {self._read_timeout_s:g} s (hung?)") from exc
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            raise FetchError("error", f"{path}: {type(exc).__name__}: {_short(exc)}") from exc
        finally:
            self._lock.release()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _stale(self) -> bool:
        """Whether the kept connection was closed by the server (or holds bytes nobody asked for)."""
        sock = self._sock
        if sock is None:
            return True
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            self.close()
            return True
        return False

    def _connection(self, path: str) -> socket.socket:
        if self._sock is not None:
            return self._sock
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout_s)
        except TimeoutError as exc:
            raise FetchError("unreachable", f"{path}: connect timed out") from exc
        except OSError as exc:
            raise FetchError("unreachable", f"connection refused or unreachable ({_short(exc)})") from exc
        sock.settimeout(self._read_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        return sock

    def _get(self, path: str, request: bytes, max_bytes: int, ok_statuses: tuple[int, ...]) -> Response:
        sock = self._connection(path)
        sock.sendall(request)
        reader, status, http11, headers = read_head(sock)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise FetchError("error", f"{path}: a compressed answer ({encoding}) though none was asked for")
        try:
            body, keep_alive = read_body(reader, status, http11, headers, max_bytes)
        except BodyTooLarge as exc:
            raise FetchError("error", f"{path}: response larger than {max_bytes // 1024} KiB") from exc
        if not keep_alive:
            self.close()
        return _answer(path, status, body.decode("utf-8", errors="replace"), headers, ok_statuses)


def _read_timeout(client: httpx.Client) -> str:
    read = client.timeout.read
    return f"{read:g}" if read is not None else "?"


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
