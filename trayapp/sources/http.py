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
import json
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from trayapp.core.json_limits import json_problem
from trayapp.core.loopback import is_loopback_url

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

    if status in ok_statuses:
        return Response(status, body, resp_headers)
    message = _error_message(body)
    detail = f": {message}" if message else ""
    if status in (401, 403):
        raise FetchError("unauthorized", f"HTTP {status} on {path}{detail} (API key needed?)", status)
    if status == 503 and message and "loading" in message.lower():
        raise FetchError("loading", "loading model", status)
    raise FetchError("error", f"HTTP {status} on {path}{detail}", status)


def _read_timeout(client: httpx.Client) -> str:
    read = client.timeout.read
    return f"{read:g}" if read is not None else "?"


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
