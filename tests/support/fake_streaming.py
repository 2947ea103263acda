"""Fake streaming LLM upstreams (Ollama, vLLM, LM Studio) on 127.0.0.1:0, for the recording proxy's tests.

A real HTTP/1.1 server (stdlib `ThreadingHTTPServer`, a thread per connection, keep-alive) streaming token
by token with each server's framing and fields (tests/fixtures/ and the backends reference):
- Ollama `/api/chat`, `/api/generate`: chunked NDJSON, **streaming when `stream` is omitted**, headers with
  the first token (Go's first flush), a last `done: true` object with int-ns durations; `stream: false` →
  one object.
- OpenAI-compatible `/v1/chat/completions`, `/v1/completions` (all kinds): chunked SSE, headers at once
  (uvicorn / Express), a role-only first chunk (chat), a chunk per token, a finish chunk, a usage chunk
  (`choices: []`) only with `stream_options.include_usage`, `data: [DONE]`.
- LM Studio `/api/v0/chat/completions`: plus `stats`, `model_info`, `runtime`; streamed, they ride on the
  finish chunk with `usage` (an assumption: the streamed v0 shape is undocumented). `/api/v1/chat`: named
  SSE events (`chat.start`, `prompt_processing.*` progress during the prefill, `message.delta` per token,
  `chat.end` with the whole result and its `stats`).

Reported figures follow the knobs (hand arithmetic): Ollama `prompt_eval_duration` = prefill_delay_s·1e9,
`eval_duration` = tokens·token_delay_s·1e9, `load_duration` = load_delay_s·1e9, `total_duration` = their
sum, `prompt_eval_count` = prompt_tokens (cached included; Ollama has no cached count); vLLM
`usage.prompt_tokens_details.cached_tokens` = cached_prompt_tokens (only when set); LM Studio
`time_to_first_token` = load + prefill s, `generation_time` = tokens·token_delay_s, `tokens_per_second` =
tokens / generation_time. Wall clock: the first token after load + prefill, then one per token_delay_s,
the final object one token_delay_s after the last token. Each request leaves a `Capture` in `.captures`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import select
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Kind = Literal["ollama", "vllm", "lmstudio"]
Line = bytes | Callable[[], bytes]
DEFAULT_WORDS = ("Zanzibar", "quokka", "marmalade", "heliotrope", "xylophone", "okapi", "saxifrage")
DEFAULT_MODELS: dict[str, str] = {"ollama": "qwen3:30b", "vllm": "Qwen/Qwen3-8B", "lmstudio": "qwen3-30b-a3b"}
ERROR_BODIES: dict[str, bytes] = {
    "ollama": b'{"error":"model runner has unexpectedly stopped"}',
    "vllm": b'{"object":"error","message":"Internal server error","type":"InternalServerError",'
    b'"param":null,"code":500}',
    "lmstudio": b'{"error":"Unexpected endpoint or method."}',
}
# The pace of llama-server's counting endpoints, measured on the real one here (test model, `-t 1`,
# 2 cores, medians of 20): /apply-template 1.2 ms (a 35-token chat) to 1.7 ms (2,964 tokens);
# /tokenize 0.6 ms + ~2.9 µs per token (9.1 ms for 2,964 tokens).
APPLY_TEMPLATE_S = 0.0012
TOKENIZE_S = 0.0006
TOKENIZE_S_PER_TOKEN = 2.9e-6
_LMS_MODEL_INFO = {"arch": "qwen3moe", "quant": "Q4_K_M", "format": "gguf", "context_length": 16384}
_LMS_RUNTIME = {"name": "llama.cpp-linux-x86_64-avx2", "version": "1.52.0", "supported_formats": ["gguf"]}


@dataclass
class Capture:
    """One request as the upstream saw it and exactly what it wrote back (times are `time.monotonic()`)."""

    method: str
    path: str
    request_headers: list[tuple[str, str]]
    started_at: float
    request_body: bytes = b""  # de-chunked when the client sent a chunked upload
    status: int = 0
    streamed: bool = False
    response_head: bytes = b""  # status line + headers + blank line, as written
    response_body_wire: bytearray = field(default_factory=bytearray)  # as written (chunk framing included)
    response_body: bytearray = field(default_factory=bytearray)  # the payload (de-chunked)
    payload_writes: list[bytes] = field(default_factory=list)  # one entry per socket write of payload
    write_times: list[float] = field(default_factory=list)  # when each of payload_writes was sent
    tokens_paced_from: float | None = None  # token line i is written no earlier than this + i × token_delay_s
    tokens_sent: int = 0
    first_byte_at: float | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    completed: bool = False  # the whole response went out
    died: bool = False  # die_after_tokens closed the socket mid-stream
    client_disconnected: bool = False
    disconnected_at: float | None = None
    disconnect_stage: str | None = None  # "before_headers" | "before_first_token" | "streaming" | "writing"
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def wire_bytes(self) -> bytes:
        return self.response_head + bytes(self.response_body_wire)


class _ClientGone(Exception): ...  # the client hung up (args[0]: the stage)


class _Stopped(Exception): ...  # the fake is shutting down


class _Died(Exception): ...  # die_after_tokens reached


class _Wire:
    """Writes a response to the socket, recording every byte in the capture."""

    def __init__(self, handler: BaseHTTPRequestHandler, cap: Capture, stop: threading.Event) -> None:
        self.sock: socket.socket = handler.connection
        self.cap = cap
        self.stop = stop
        self.chunked = False
        self.peer_sent_more = False

    def send(self, data: bytes) -> None:
        if self.cap.first_byte_at is None:
            self.cap.first_byte_at = time.monotonic()
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _ClientGone("writing") from exc
        if self.cap.response_head:
            self.cap.response_body_wire += data
        else:
            self.cap.response_head = data

    def head(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        self.cap.status = status
        self.chunked = any(k.lower() == "transfer-encoding" for k, _ in headers)
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"] + [f"{k}: {v}" for k, v in headers]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def payload(self, data: bytes) -> None:
        framed = b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data
        self.send(framed)
        self.cap.response_body += data
        self.cap.payload_writes.append(data)
        self.cap.write_times.append(time.monotonic())

    def end(self) -> None:
        if self.chunked:
            self.send(b"0\r\n\r\n")
        self.cap.completed = True

    def wait(self, delay_s: float, stage: str) -> None:
        """Sleep `delay_s`, but notice at once a client that closes its end (EOF) meanwhile."""
        deadline = time.monotonic() + delay_s
        while (left := deadline - time.monotonic()) > 0:
            if self.stop.is_set():
                raise _Stopped
            if self.peer_sent_more:  # a pipelined request is waiting: EOF cannot be seen, just sleep
                self.stop.wait(min(left, 0.05))
                continue
            readable, _, _ = select.select([self.sock], [], [], min(left, 0.05))
            if readable:
                try:
                    data = self.sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    raise _ClientGone(stage)
                self.peer_sent_more = True


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _rfc3339_ns() -> str:
    seconds, frac_ns = divmod(time.time_ns(), 10**9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac_ns:09d}Z"


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        out = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return out
            out += handler.rfile.read(size)
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # every write leaves at once, as the real servers' flushes do
    timeout = 30.0  # an idle keep-alive connection is dropped after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.owner._conns[self.connection] = threading.current_thread()  # for stop()

    def finish(self) -> None:
        self.server.owner._conns.pop(self.connection, None)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fake upstream: " + format, *args)

    def _dispatch(self) -> None:
        self.server.owner._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 50+ clients connect at once
    owner: FakeStreamingUpstream

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("fake upstream: connection error from %s", client_address, exc_info=True)
        if not isinstance(sys.exc_info()[1], OSError):  # a bug in the fake itself: show it
            traceback.print_exc()


@dataclass(eq=False)
class FakeStreamingUpstream:
    """A fake Ollama / vLLM / LM Studio that streams; every knob may be changed between requests."""

    kind: Kind = "ollama"
    _: KW_ONLY
    tokens: int = 20
    prefill_delay_s: float = 0.2  # before the first token (after load_delay_s)
    token_delay_s: float = 0.02  # between tokens
    load_delay_s: float = 0.0
    prompt_tokens: int = 26  # the whole prompt, cached tokens included
    cached_prompt_tokens: int | None = None
    text_words: Sequence[str] = DEFAULT_WORDS  # canaries: token i is text_words[i % len], space-joined
    model: str | None = None  # else the request's `model`, else a default per kind
    split_lines: bool = False  # each line in two socket writes, split_pause_s apart
    split_pause_s: float = 0.01
    die_after_tokens: int | None = None  # close the socket after N tokens (non-stream: before any byte)
    error_status: int | None = None  # answer every known route with this status and error_body
    error_body: bytes | None = None  # default: ERROR_BODIES[kind]
    hang_before_headers_s: float = 0.0
    answers_counts: bool = False  # llama-server's `/apply-template` and `/tokenize`, at its pace (below)

    def __post_init__(self) -> None:
        self.captures: list[Capture] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._seq = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    # lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._server.shutdown()
        live = dict(self._conns)
        for conn in live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        for thread in live.values():
            thread.join(timeout=2.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # helpers for tests -----------------------------------------------------------------------------
    def token_texts(self) -> list[str]:
        """The pieces of text streamed, one per token (the words, space-separated)."""
        words = self.text_words
        return [("" if i == 0 else " ") + words[i % len(words)] for i in range(self.tokens)]

    def wait_for_captures(self, count: int, timeout_s: float = 5.0) -> list[Capture]:
        """The first `count` captures once each has finished (raises TimeoutError past the deadline)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                caps = list(self.captures[:count])
            if len(caps) == count and all(c.finished.is_set() for c in caps):
                return caps
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(caps)} of {count} captures finished within {timeout_s} s")
            time.sleep(0.01)

    # serving ---------------------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        cap = Capture(handler.command, handler.path, list(handler.headers.items()), time.monotonic())
        with self._lock:
            self.captures.append(cap)
            self._seq += 1
            seq = self._seq
        wire = _Wire(handler, cap, self._stop)
        try:
            cap.request_body = _read_body(handler)
            if self.hang_before_headers_s:
                wire.wait(self.hang_before_headers_s, "before_headers")
            route = self._routes().get(urlsplit(handler.path).path)
            request: dict[str, Any] | None = None
            with contextlib.suppress(ValueError):
                parsed = json.loads(cap.request_body or b"{}")
                request = parsed if isinstance(parsed, dict) else None
            if route is None or handler.command != "POST":
                self._reply(wire, 404, b'{"error":"404 page not found"}', "application/json")
            elif request is None:
                self._reply(wire, 400, b'{"error":"invalid JSON body"}', "application/json")
            elif self.error_status is not None:
                body = self.error_body if self.error_body is not None else ERROR_BODIES[self.kind]
                self._reply(wire, self.error_status, body, "application/json")
            else:
                route(wire, request, seq)
            if handler.headers.get("Connection", "").lower() == "close":
                handler.close_connection = True
        except _ClientGone as gone:
            cap.client_disconnected, cap.disconnected_at = True, time.monotonic()
            cap.disconnect_stage = "before_first_token" if gone.args[0] == "prefill" else gone.args[0]
            handler.close_connection = True
        except _Died:
            cap.died = True
            handler.close_connection = True
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
        except _Stopped:
            handler.close_connection = True
        finally:
            cap.ended_at = time.monotonic()
            cap.finished.set()

    def _routes(self) -> dict[str, Callable[[_Wire, dict[str, Any], int], None]]:
        routes: dict[str, Callable[[_Wire, dict[str, Any], int], None]] = {
            "/v1/chat/completions": lambda w, r, s: self._openai(w, r, s, chat=True, native=False),
            "/v1/completions": lambda w, r, s: self._openai(w, r, s, chat=False, native=False),
        }
        if self.kind == "ollama":
            routes["/api/chat"] = lambda w, r, s: self._ollama(w, r, chat=True)
            routes["/api/generate"] = lambda w, r, s: self._ollama(w, r, chat=False)
        if self.answers_counts:
            routes["/apply-template"] = lambda w, r, s: self._apply_template(w, r)
            routes["/tokenize"] = lambda w, r, s: self._tokenize(w, r)
        if self.kind == "lmstudio":
            routes["/api/v0/chat/completions"] = lambda w, r, s: self._openai(w, r, s, chat=True, native=True)
            routes["/api/v1/chat"] = lambda w, r, s: self._lmstudio_v1(w, r, s)
        return routes

    def _apply_template(self, wire: _Wire, request: dict[str, Any]) -> None:
        """llama-server's `POST /apply-template`: `{"prompt": …}`, the messages joined as a template would."""
        time.sleep(APPLY_TEMPLATE_S)
        messages = request.get("messages") if isinstance(request.get("messages"), list) else []
        parts = [f"<|{m.get('role')}|>{m.get('content')}" for m in messages if isinstance(m, dict)]
        self._reply(wire, 200, _dumps({"prompt": "".join(parts) + "<|assistant|>"}), "application/json")

    def _tokenize(self, wire: _Wire, request: dict[str, Any]) -> None:
        """llama-server's `POST /tokenize`: `{"tokens": […]}`, a token per 4 characters."""
        count = max(1, len(str(request.get("content", ""))) // 4)
        time.sleep(TOKENIZE_S + count * TOKENIZE_S_PER_TOKEN)
        self._reply(wire, 200, _dumps({"tokens": list(range(count))}), "application/json")

    def _headers(self, content_type: str, length: int | None) -> list[tuple[str, str]]:
        date = formatdate(usegmt=True)
        size = [("Transfer-Encoding", "chunked")] if length is None else [("Content-Length", str(length))]
        if self.kind == "vllm":  # uvicorn: lower-case names, headers at once
            named = [("date", date), ("server", "uvicorn"), ("content-type", content_type), *size]
            return [(k.lower(), v) for k, v in named]
        if self.kind == "lmstudio":  # Express
            return [("X-Powered-By", "Express"), ("Content-Type", content_type), ("Date", date), *size]
        return [("Content-Type", content_type), ("Date", date), *size]  # Go net/http, sorted names

    def _reply(self, wire: _Wire, status: int, body: bytes, content_type: str) -> None:
        if content_type == "application/json" and self.kind != "vllm":
            content_type = "application/json; charset=utf-8"
        wire.head(status, self._headers(content_type, len(body)))
        wire.payload(body)
        wire.end()

    def _line(self, wire: _Wire, line: Line) -> None:
        data = line() if callable(line) else line  # rendered when sent (Ollama's created_at)
        if self.split_lines and len(data) > 1:
            wire.payload(data[: len(data) // 2])
            time.sleep(self.split_pause_s)  # let the first half reach the client as a read of its own
            wire.payload(data[len(data) // 2 :])
        else:
            wire.payload(data)

    def _stream(
        self, wire: _Wire, content_type: str, early_headers: bool, lines: Sequence[list[Line]]
    ) -> None:
        """Write (early, mid, preface, token_lines, tail): `early` with the headers, `mid` halfway through
        the prefill (progress events), then `preface`, one token line per token_delay_s and `tail`."""
        early, mid, preface, token_lines, tail = lines
        wire.cap.streamed = True
        if early_headers:
            wire.head(200, self._headers(content_type, None))
        for data in early:
            self._line(wire, data)
        prefill_s = self.load_delay_s + self.prefill_delay_s
        wire.wait(prefill_s / 2 if mid else prefill_s, "prefill")
        for data in mid:
            self._line(wire, data)
        wire.wait(prefill_s / 2 if mid else 0.0, "prefill")
        if not early_headers:
            wire.head(200, self._headers(content_type, None))
        for data in preface:
            self._line(wire, data)
        start = wire.cap.tokens_paced_from = (
            time.monotonic()
        )  # token i leaves at start + i × delay (no drift)
        for i, line in enumerate([*token_lines, None]):
            wire.wait(start + i * self.token_delay_s - time.monotonic(), "streaming")
            if self.die_after_tokens is not None and wire.cap.tokens_sent >= self.die_after_tokens:
                raise _Died
            if line is None:
                break
            self._line(wire, line)
            wire.cap.tokens_sent += 1
            wire.cap.first_token_at = wire.cap.first_token_at or time.monotonic()
        for data in tail:
            self._line(wire, data)
        wire.end()

    def _whole(self, wire: _Wire, body: Line) -> None:
        """A non-streamed reply: all the work first, then one JSON body (nothing at all if it dies)."""
        wire.wait(self.load_delay_s + self.prefill_delay_s + self.tokens * self.token_delay_s, "prefill")
        if self.die_after_tokens is not None:
            raise _Died
        wire.cap.tokens_sent = self.tokens
        self._reply(wire, 200, body() if callable(body) else body, "application/json")

    # formats ---------------------------------------------------------------------------------------
    def _ollama(self, wire: _Wire, request: dict[str, Any], *, chat: bool) -> None:
        model = str(request.get("model") or self.model or DEFAULT_MODELS["ollama"])
        texts, stream = self.token_texts(), request.get("stream", True) is not False  # streams by default
        load_ns, prompt_ns = _ns(self.load_delay_s), _ns(self.prefill_delay_s)
        eval_ns = _ns(self.tokens * self.token_delay_s)

        def obj(text: str, done: bool = False) -> bytes:
            key: dict[str, Any] = (
                {"message": {"role": "assistant", "content": text}} if chat else {"response": text}
            )
            out = {"model": model, "created_at": _rfc3339_ns(), **key, "done": done}
            if done:
                out["done_reason"] = "stop"
                if not chat:
                    out["context"] = [1000 + i for i in range(self.prompt_tokens + self.tokens)]
                out |= {
                    "total_duration": load_ns + prompt_ns + eval_ns,
                    "load_duration": load_ns,
                    "prompt_eval_count": self.prompt_tokens,
                    "prompt_eval_duration": prompt_ns,
                    "eval_count": self.tokens,
                    "eval_duration": eval_ns,
                }
            return _dumps(out) + (b"\n" if stream else b"")

        if not stream:
            self._whole(wire, functools.partial(obj, "".join(texts), True))
            return
        token_lines: list[Line] = [functools.partial(obj, t) for t in texts]
        tail: list[Line] = [functools.partial(obj, "", True)]
        self._stream(wire, "application/x-ndjson", False, ([], [], [], token_lines, tail))

    def _openai(self, wire: _Wire, request: dict[str, Any], seq: int, *, chat: bool, native: bool) -> None:
        model = str(request.get("model") or self.model or DEFAULT_MODELS[self.kind])
        texts, n, p = self.token_texts(), self.tokens, self.prompt_tokens
        obj_name = "chat.completion" if chat else "text_completion"
        base: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{seq:08x}fake{self.kind}",
            "object": obj_name,
        }
        base |= {"created": int(time.time()), "model": model}
        usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
        if self.cached_prompt_tokens is not None and self.kind == "vllm":
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_prompt_tokens}
        extra: dict[str, Any] = {}
        if native:
            gen_s = n * self.token_delay_s
            extra["stats"] = {
                "tokens_per_second": n / gen_s if gen_s else 0.0,
                "time_to_first_token": round(self.load_delay_s + self.prefill_delay_s, 3),
                "generation_time": round(gen_s, 3),
                "stop_reason": "eosFound",
            }
            extra |= {"model_info": _LMS_MODEL_INFO, "runtime": _LMS_RUNTIME}
        if not request.get("stream", False):
            whole = _choice(chat, "".join(texts), "stop", whole=True)
            self._whole(wire, _dumps(base | {"choices": [whole], "usage": usage} | extra))
            return
        chunk_base = (base | {"object": "chat.completion.chunk"}) if chat else base

        def event(choices: list[dict[str, Any]], **more: Any) -> bytes:
            return b"data: " + _dumps(chunk_base | {"choices": choices} | more) + b"\n\n"

        preface: list[Line] = [event([_choice(chat, None, None, role=True)])] if chat else []
        token_lines: list[Line] = [event([_choice(chat, t, None)]) for t in texts]
        tail: list[Line] = [
            event([_choice(chat, None, "stop")], **(({"usage": usage} | extra) if native else {}))
        ]
        if (request.get("stream_options") or {}).get("include_usage") and not native:
            tail.append(event([], usage=usage))
        tail.append(b"data: [DONE]\n\n")
        content_type = "text/event-stream; charset=utf-8" if self.kind == "vllm" else "text/event-stream"
        self._stream(wire, content_type, True, ([], [], preface, token_lines, tail))

    def _lmstudio_v1(self, wire: _Wire, request: dict[str, Any], seq: int) -> None:
        """LM Studio REST v1 `POST /api/v1/chat` (docs 1_developer/_2_rest/chat.md, streaming-events.md)."""
        model = str(request.get("model") or self.model or DEFAULT_MODELS["lmstudio"])
        texts, gen_s = self.token_texts(), self.tokens * self.token_delay_s
        stats: dict[str, Any] = {"input_tokens": self.prompt_tokens, "total_output_tokens": self.tokens}
        stats |= {"reasoning_output_tokens": 0, "tokens_per_second": self.tokens / gen_s if gen_s else 0.0}
        stats["time_to_first_token_seconds"] = round(self.load_delay_s + self.prefill_delay_s, 3)
        output = [{"type": "message", "content": "".join(texts)}]
        result: dict[str, Any] = {"model_instance_id": model, "output": output, "stats": stats}
        result |= {"response_id": f"resp_{seq:08x}fakelmstudio"}
        if not request.get("stream", False):
            self._whole(wire, _dumps(result))
            return

        def event(kind: str, **data: Any) -> bytes:
            return b"event: %s\ndata: %s\n\n" % (kind.encode(), _dumps({"type": kind, **data}))

        pp = "prompt_processing."
        early: list[Line] = [event("chat.start", model_instance_id=model), event(pp + "start")]
        mid: list[Line] = [event(pp + "progress", progress=0.5)]
        preface: list[Line] = [event(pp + "progress", progress=1.0), event(pp + "end")]
        preface.append(event("message.start"))
        token_lines: list[Line] = [event("message.delta", content=t) for t in texts]
        tail: list[Line] = [event("message.end"), event("chat.end", result=result)]
        self._stream(wire, "text/event-stream", True, (early, mid, preface, token_lines, tail))


def _choice(chat: bool, text: str | None, finish: str | None, role: bool = False, whole: bool = False) -> Any:
    """One OpenAI `choices[]` entry: a chat delta (role-only, content or empty) or message, or a text."""
    if not chat:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    if whole:
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
