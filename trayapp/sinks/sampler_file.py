"""Where this machine's sampler listens: `sampler.json` in the data dir (under LLM_TRAY_HOME),
and the client side of its endpoint (sinks/snapshot_server.py) for `status`, `watch`, `bar`.

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
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trayapp.config import paths
from trayapp.config.files import PRIVATE_PERMISSIONS, SecretFileError, atomic_write_text, read_secret_file
from trayapp.core.jsonview import iso_utc
from trayapp.sinks.wire import MAX_RECORDS, to_wire

if TYPE_CHECKING:  # imported when used: `llm-tray --help` and the tray's start need neither
    import httpx

log = logging.getLogger(__name__)

FILE_NAME = "sampler.json"
TOKEN_ENV = "LLM_TRAY_TOKEN"
ANSWER_TIMEOUT_S = 1.0  # a live sampler on this machine answers well within this
_WIN_LOCK_OFFSET = 4096  # the byte the claim lock locks on Windows (as sinks/store/lock.py)


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
    written atomically (mode 0600, `config/files.py`), so clients, which
    read without the lock, see the old entry or the new one, never a part.
    """
    path = sampler_path()
    mine = SamplerInfo(url=url, pid=os.getpid(), started=iso_utc(time.time()), role=role)
    read_only = paths.unwritable(path.parent)
    if read_only is not None:  # a read-only home: serve anyway, unnamed in the file (docs/security.md)
        log.warning(
            "read-only mode: %s: `status`, `watch` and `bar` here cannot find this endpoint", read_only
        )
        return read_sampler_file(path) or mine
    with _claim_lock(path):
        current = read_sampler_file(path)
        if current is not None and (current.is_this_process(url) or is_live(current, timeout_s)):
            return current
        body = {"url": mine.url, "pid": mine.pid, "started": mine.started, "role": mine.role}
        atomic_write_text(path, json.dumps(body) + "\n", permissions=PRIVATE_PERMISSIONS)
        if current is not None:
            log.info("sampler file: replaced the stale entry of pid %d (%s)", current.pid, current.url)
        return mine


def remove_sampler_file(url: str | None = None) -> None:
    """Remove the file if it still names this process (and `url`, when given): never another's."""
    path = sampler_path()
    if paths.unwritable(path.parent) is not None:
        return  # a read-only home: nothing was written
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
            token = read_secret_file(paths.agent_token_file()) or ""
        except SecretFileError as exc:  # a link, a non-file, a loose mode: not used, and said why
            log.warning("%s", exc)
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


# --------------------------------------------------------------------------- records for the sampler
#
# Another process on this machine that measured something while the sampler holds the store
# (`llm-tray proxy`, `llm-tray bench`) posts it to the sampler, which keeps it through its own
# store writer (sinks/snapshot_server.py: POST /v1/records, POST /v1/bench; docs/json.md).
# The wire form is the dataclass's own fields (lossless, numbers only: no class of them holds any
# prompt or completion text); the sampler rebuilds it strictly (`from_wire`).

RECORDS_PATH = "/v1/records"
BENCH_PATH = "/v1/bench"
MAX_POST_BYTES = 256 * 1024  # the endpoint refuses a bigger body (413)
LEASE_S = 30.0  # a proxy's servers count as proxied this long after its last post
HEARTBEAT_S = 10.0  # an idle proxy renews its lease this often
FORWARD_QUEUE_LIMIT = 2_000  # records waiting to be sent; more are dropped (and counted)
POST_TIMEOUT_S = 5.0
STARTING_WAIT_S = 30.0  # a sampler starting (a tray answers ~3 s before its monitor takes records)
#                         is asked again, every STARTING_RETRY_S, this long before a batch is given up
STARTING_RETRY_S = 0.5


class SamplerRefused(Exception):
    """The sampler answered a post with an error (its message), or did not answer."""


class SamplerStarting(SamplerRefused):
    """The sampler answered 503 with Retry-After: it has no monitor to take records yet."""


def post(info: SamplerInfo, path: str, body: Mapping[str, Any], timeout_s: float = POST_TIMEOUT_S) -> Any:
    """POST `body` (JSON) to the sampler; its JSON answer. Raises SamplerRefused with the reason
    (its error message, or why it did not answer)."""
    import httpx

    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    headers = {**auth_headers(), "Content-Type": "application/json"}
    try:
        response = httpx.post(f"{info.url}{path}", content=data, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise SamplerRefused(f"{info.describe()} did not answer ({type(exc).__name__})") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        why = error or response.text[:200]
        starting = response.status_code == 503 and "retry-after" in response.headers
        raise (SamplerStarting if starting else SamplerRefused)(
            f"{info.describe()} answered {response.status_code}: {why}"
        )
    return answer


def post_bench(info: SamplerInfo, result: Any) -> tuple[bool, str | None]:
    """Give a finished bench (core/bench.py BenchResult) to the sampler, which keeps it as the
    baseline through its own store writer (the baseline rule applies there too): (stored, its
    note). Raises SamplerRefused."""
    answer = post(info, BENCH_PATH, {"bench": to_wire(result)}, timeout_s=10.0)
    if not isinstance(answer, dict) or not isinstance(answer.get("stored"), bool):
        raise SamplerRefused(f"{info.describe()} gave an answer this version does not understand")
    note = answer.get("note")
    return answer["stored"], note if isinstance(note, str) else None


_STOP = object()


class RecordForwarder:
    """A recording proxy's records, sent to this machine's sampler off the proxy's path.

    `put` never blocks: a bounded queue, one daemon thread that posts what is waiting in batches
    (and, while idle, renews the lease that makes the sampler count `upstreams` as proxied, every
    HEARTBEAT_S). A failed post is logged once (then again only after a success); its records
    were printed by the proxy and are not sent again. When the sampler moved (a restarted tray),
    the next failure finds it again. `say(line)` is told, once each, what the sampler answered
    that the user should know (a server it does not watch; that it does not record).
    """

    def __init__(
        self,
        info: SamplerInfo,
        upstreams: Sequence[str],
        *,
        say: Callable[[str], None] = lambda _line: None,
        lease_s: float = LEASE_S,
        heartbeat_s: float = HEARTBEAT_S,
        limit: int = FORWARD_QUEUE_LIMIT,
    ) -> None:
        self.info = info
        self.upstreams = tuple(upstreams)
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.sent = 0
        self.dropped = 0  # the queue was full (the sampler too slow, or gone)
        self.failed = 0  # in posts that failed
        self._say = say
        self._said: set[str] = set()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=limit)
        self._failing = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-tray-record-forward", daemon=True)

    def start(self) -> RecordForwarder:
        self._thread.start()
        return self

    def put(self, upstream_url: str, record: Any) -> None:
        """One FinishedRequest of `upstream_url`, for the sampler (never blocks, never raises)."""
        try:
            self._queue.put_nowait((upstream_url, record))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("records not sent to %s: too many waiting (dropped)", self.info.describe())

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is waiting, end the lease, stop the thread (waits at most about `timeout_s`)."""
        if not self._thread.is_alive():
            return
        self._closing.set()  # a sampler still starting is not waited for any more
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        self._post([], self.lease_s)  # the lease first: the proxy's first request is already its own
        stopping = False
        while True:
            batch: list[Any] = []
            if not stopping:
                try:
                    first = self._queue.get(timeout=self.heartbeat_s)
                except queue.Empty:
                    self._post([], self.lease_s)
                    continue
                if first is _STOP:
                    stopping = True
                else:
                    batch.append(first)
            while len(batch) < MAX_RECORDS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
            done = stopping and self._queue.empty()
            if batch or done:
                self._post(batch, 0.0 if done else self.lease_s)  # the last post ends the lease
            if done:
                return

    def _body(self, batch: Sequence[Any], lease_s: float) -> dict[str, Any]:
        return {
            "upstreams": list(self.upstreams),
            "lease_s": lease_s,
            "records": [{"upstream": url, "request": to_wire(record)} for url, record in batch],
        }

    def _post(self, batch: Sequence[Any], lease_s: float) -> None:
        body = self._body(batch, lease_s)
        try:
            answer = self._post_while_starting(body)
        except (SamplerRefused, ValueError) as exc:
            self.failed += len(batch)
            if not self._failing:
                self._failing = True
                log.warning("records not sent to the sampler (printed only): %s", exc)
            return
        if self._failing:
            self._failing = False
            log.warning("records reach %s again", self.info.describe())
        self.sent += len(batch)
        self._heard(answer)

    def _post_while_starting(self, body: Mapping[str, Any]) -> Any:
        """`post`, asked again while the sampler says it is starting (at most STARTING_WAIT_S, not
        once the proxy stops): a proxy started beside a tray that is starting loses no record."""
        deadline = time.monotonic() + STARTING_WAIT_S
        while True:
            try:
                return self._post_once(body)
            except SamplerStarting:
                if time.monotonic() >= deadline or self._closing.wait(STARTING_RETRY_S):
                    raise

    def _post_once(self, body: Mapping[str, Any]) -> Any:
        try:
            return post(self.info, RECORDS_PATH, body)
        except SamplerStarting:
            raise
        except SamplerRefused:
            moved = find_sampler()
            if moved is None or moved == self.info:
                raise
            self.info = moved  # the sampler restarted elsewhere: send there
            return post(self.info, RECORDS_PATH, body)

    def _heard(self, answer: Any) -> None:
        if not isinstance(answer, dict):
            return
        who = f"the {self.info.role or 'sampler'} (pid {self.info.pid})"
        lines = [
            f"{who} does not watch {url}: it drops this proxy's records of it; add that server "
            "to its endpoints (Settings… → Servers, or [[endpoints]] in config.toml)"
            for url in answer.get("unwatched", ())
            if isinstance(url, str)
        ]
        if answer.get("recording") is False:
            lines.append(f"{who} does not record to the store either (another process holds it): "
                         "this proxy's records reach only its live view")  # fmt: skip
        for line in lines:
            if line not in self._said:
                self._said.add(line)
                self._say(line)
