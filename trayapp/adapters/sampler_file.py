"""Where this machine's sampler listens: `sampler.json` in the data dir (under LLM_TRAY_HOME),
and the client side of its endpoint (adapters/snapshot_server.py) for `status`, `watch`, `bar`.

The file holds `{"url", "pid", "started"}`, is written atomically when the endpoint is up and
removed when it stops (only by the process it names). A stale one, whose process is gone or
whose endpoint does not answer, is ignored. The token is never in it: clients read it from
LLM_TRAY_TOKEN, as the proxy's clients do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trayapp import paths
from trayapp.core.jsonview import iso_utc

if TYPE_CHECKING:  # the client side only: the tray's sampler writes this file at start
    import httpx

log = logging.getLogger(__name__)

FILE_NAME = "sampler.json"
TOKEN_ENV = "LLM_TRAY_TOKEN"
ANSWER_TIMEOUT_S = 1.0  # a live sampler on this machine answers well within this


@dataclass(frozen=True)
class SamplerInfo:
    url: str
    pid: int
    started: str


def sampler_path() -> Path:
    return paths.data_dir() / FILE_NAME


def write_sampler_file(url: str) -> Path:
    """Say where this process's endpoint listens (atomic replace; mode 0600)."""
    path = sampler_path()
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    body = json.dumps({"url": url, "pid": os.getpid(), "started": iso_utc(time.time())})
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(body + "\n")
    os.replace(tmp, path)
    return path


def remove_sampler_file() -> None:
    """Remove the file if it still names this process (a newer sampler may have replaced it)."""
    path = sampler_path()
    info = read_sampler_file(path)
    if info is not None and info.pid == os.getpid():
        path.unlink(missing_ok=True)


def read_sampler_file(path: Path | None = None) -> SamplerInfo | None:
    path = path or sampler_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return SamplerInfo(url=str(data["url"]), pid=int(data["pid"]), started=str(data.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    except OSError:
        return False
    return True


def auth_headers(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The bearer header for this machine's sampler: $LLM_TRAY_TOKEN, else the agent's own token
    file (`llm-tray agent --new-token`), so `status`, `watch` and `bar` on the box just work."""
    token = environ.get(TOKEN_ENV)
    if not token:
        try:
            token = paths.agent_token_file().read_text(encoding="utf-8").strip()
        except OSError:
            token = ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def find_sampler(timeout_s: float = ANSWER_TIMEOUT_S) -> SamplerInfo | None:
    """The live sampler of this LLM_TRAY_HOME, or None (no file, a dead pid, or no answer)."""
    info = read_sampler_file()
    if info is None or not pid_alive(info.pid):
        return None
    import httpx

    try:
        response = httpx.get(f"{info.url}/v1/glance", headers=auth_headers(), timeout=timeout_s)
    except httpx.HTTPError:
        log.info("sampler file names %s, which does not answer: ignored", info.url)
        return None
    return info if response.status_code in (200, 401, 503) else None


def get(info: SamplerInfo, path: str, timeout_s: float = 5.0) -> httpx.Response:
    """`GET info.url + path` (raises httpx.HTTPError when it does not answer)."""
    import httpx

    return httpx.get(f"{info.url}{path}", headers=auth_headers(), timeout=timeout_s)


def wait_json(info: SamplerInfo, path: str, timeout_s: float = 5.0) -> Any | None:
    """The JSON at `path`, waiting out the endpoint's 503 before its first snapshot; None on failure."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = get(info, path, timeout_s)
        except httpx.HTTPError:
            return None
        if response.status_code == 200:
            return response.json()
        if response.status_code != 503 or time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def events(info: SamplerInfo, read_timeout_s: float = 60.0) -> Iterator[tuple[str, str]]:
    """(event, data) pairs from `/v1/events` until the stream ends; raises httpx.HTTPError.

    `read_timeout_s` is longer than the endpoint's keep-alive, so a quiet stream stays open.
    """
    import httpx

    timeout = httpx.Timeout(5.0, read=read_timeout_s)
    with httpx.stream("GET", f"{info.url}/v1/events", headers=auth_headers(), timeout=timeout) as response:
        response.raise_for_status()
        event, data = "message", list[str]()
        for line in response.iter_lines():
            if not line:
                if data:
                    yield event, "\n".join(data)
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
