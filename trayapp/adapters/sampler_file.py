"""Where this machine's sampler listens: `sampler.json` in the data dir (under LLM_TRAY_HOME),
and the client side of its endpoint (adapters/snapshot_server.py) for `status`, `watch`, `bar`.

The file holds `{"url", "pid", "started", "role"}`. One sampler per machine: a sampler claims the
file when its endpoint is up (`claim_sampler_file`), never over another live sampler's entry, and
removes it when it stops, only while the file still names it (`remove_sampler_file`). A stale one,
whose process is gone or whose endpoint does not answer, is ignored by clients and may be replaced.
The token is never in it: clients read it from LLM_TRAY_TOKEN, as the proxy's clients do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trayapp import paths
from trayapp.core.jsonview import iso_utc

if TYPE_CHECKING:  # imported when used: `llm-tray --help` and the tray's start need neither
    import httpx

log = logging.getLogger(__name__)

FILE_NAME = "sampler.json"
TOKEN_ENV = "LLM_TRAY_TOKEN"
ANSWER_TIMEOUT_S = 1.0  # a live sampler on this machine answers well within this
_WIN_LOCK_OFFSET = 4096  # the byte the claim lock locks on Windows (as adapters/store/lock.py)


@dataclass(frozen=True)
class SamplerInfo:
    url: str
    pid: int
    started: str
    role: str = ""  # "tray" or "agent"; "" in a file written before roles were

    def describe(self) -> str:
        """`the tray (pid 4242, http://127.0.0.1:40123)`, for messages."""
        return f"the {self.role or 'sampler'} (pid {self.pid}, {self.url})"

    def is_this_process(self, url: str) -> bool:
        """Whether this entry is this process's endpoint at `url` (a pid alone may serve several)."""
        return self.pid == os.getpid() and self.url == url


def sampler_path() -> Path:
    return paths.data_dir() / FILE_NAME


@contextlib.contextmanager
def _claim_lock(path: Path) -> Iterator[None]:
    """An exclusive, blocking lock on `.sampler.json.lock` beside `path` (released by the OS if the
    holder dies), so that reading, judging and replacing the entry is one step for every sampler."""
    fd = os.open(path.with_name(f".{FILE_NAME}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if sys.platform == "win32":
            import msvcrt

            os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for 10 s, then raises OSError
            try:
                yield
            finally:
                os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            yield  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def claim_sampler_file(url: str, role: str = "", timeout_s: float = ANSWER_TIMEOUT_S) -> SamplerInfo:
    """Make this process's endpoint at `url` this machine's sampler, unless another live one is.

    Returns the machine's sampler: this process's entry (new, or already there), or the live
    sampler the file names, left untouched. An entry that is missing, unreadable, or stale (its pid
    gone, or its endpoint not answering within `timeout_s`) is replaced by ours.

    Race-safety: the whole read-judge-replace runs under an exclusive lock on a lock file beside
    it (flock, or msvcrt on Windows; the OS drops it when its holder dies), so of two samplers
    starting at once exactly one writes its entry and the other finds it live. The entry itself is
    written to a temp file (mode 0600) and moved into place with `os.replace`, so clients, which
    read without the lock, see the old entry or the new one, never a part.
    """
    path = sampler_path()
    with _claim_lock(path):
        current = read_sampler_file(path)
        if current is not None and (current.is_this_process(url) or is_live(current, timeout_s)):
            return current
        mine = SamplerInfo(url=url, pid=os.getpid(), started=iso_utc(time.time()), role=role)
        body = {"url": mine.url, "pid": mine.pid, "started": mine.started, "role": mine.role}
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", suffix=".tmp", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(json.dumps(body) + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if current is not None:
            log.info("sampler file: replaced the stale entry of pid %d (%s)", current.pid, current.url)
        return mine


def remove_sampler_file(url: str | None = None) -> None:
    """Remove the file if it still names this process (and `url`, when given): never another's."""
    path = sampler_path()
    with _claim_lock(path):
        info = read_sampler_file(path)
        if info is not None and info.pid == os.getpid() and (url is None or info.url == url):
            path.unlink(missing_ok=True)


def read_sampler_file(path: Path | None = None) -> SamplerInfo | None:
    path = path or sampler_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return SamplerInfo(
            url=str(data["url"]),
            pid=int(data["pid"]),
            started=str(data.get("started", "")),
            role=str(data.get("role", "")),
        )
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


def answers(info: SamplerInfo, timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
    """Whether `info.url` answers as a sampler's endpoint does (200, 401 without the token, or
    503 before its first snapshot) within `timeout_s`."""
    import httpx

    try:
        response = httpx.get(f"{info.url}/v1/glance", headers=auth_headers(), timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code in (200, 401, 503)


def is_live(info: SamplerInfo, timeout_s: float = ANSWER_TIMEOUT_S) -> bool:
    """A live sampler: its pid runs and its endpoint answers."""
    return pid_alive(info.pid) and answers(info, timeout_s)


def locate_sampler(timeout_s: float = ANSWER_TIMEOUT_S) -> tuple[SamplerInfo | None, str]:
    """(the live sampler of this LLM_TRAY_HOME, "") or (None, why there is none, for a message)."""
    info = read_sampler_file()
    if info is None:
        return None, "no tray or agent is running"
    if not pid_alive(info.pid):
        return None, f"no tray or agent is running (the sampler file names pid {info.pid}, which is gone)"
    if not answers(info, timeout_s):
        log.info("sampler file names %s, which does not answer: ignored", info.url)
        return None, f"{info.describe()} does not answer"
    return info, ""


def find_sampler(timeout_s: float = ANSWER_TIMEOUT_S) -> SamplerInfo | None:
    """The live sampler of this LLM_TRAY_HOME, or None (no file, a dead pid, or no answer)."""
    return locate_sampler(timeout_s)[0]


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
