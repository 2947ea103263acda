"""The recording proxy's tap (#12): reads each recorded request's numbers as its bytes pass. Pure, no I/O.

The pump calls `RequestTap` with the de-framed request body, the response head and the de-chunked
response body, piece by piece, then `finish`. The tap never buffers a stream: whole lines are scanned
where they lie (`scan_line`), a line split across reads is carried as scanner state (`JsonScan`), not
as bytes, and a non-streaming body is scanned the same way. No prompt or completion text is kept in
any attribute once a call returns; the request body is held (up to a limit) only until the response
head, to read `model`, `stream` and `stream_options.include_usage`.

Where the numbers come from, best first: llama-server `timings` (`parse_timings`), LM Studio `stats`
(`parse_chat_stats`), Ollama's final object (ns durations), vLLM's `metrics` block, then OpenAI
`usage` with the decode rate over the proxy's own clock (`decode_exact=False`).

TTFT: streaming, the proxy's time from the request's start to the first piece carrying generated
text. Non-streaming, the server's own figure: llama-server `timings.prompt_ms`, LM Studio
`stats.time_to_first_token`, vLLM `metrics.time_to_first_token_ms`, and for Ollama
`load_duration + prompt_eval_duration` (the time before its first token, queueing excluded, as
llama-server's `prompt_ms` is); otherwise None.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.json_scan import JsonScan, merge_found, scan_line, wants_model
from trayapp.services.proxy.recorder_parse import (
    build_record,
    estimated_tokens,
    max_tokens_of,
    overflow_from_error,
    prompt_chars_of,
    stop_reason_of,
)

log = logging.getLogger(__name__)

ENDPOINTS: dict[str, str] = {
    "/api/generate": "ollama-generate",
    "/api/chat": "ollama-chat",
    "/v1/chat/completions": "openai-chat",
    "/v1/completions": "openai-completions",
    "/v1/responses": "openai-responses",
    "/completion": "llamacpp-completion",
    "/completions": "llamacpp-completion",
    "/api/v0/chat/completions": "lmstudio-v0",
    "/api/v0/completions": "lmstudio-v0",
    "/api/v1/chat": "lmstudio-v1-chat",
}


def recorded_endpoint(method: str, path: str) -> str | None:
    """The API family of a request we record, or None (passes through unrecorded). `path` has no query."""
    if method.upper() != "POST":
        return None
    return ENDPOINTS.get(path.rstrip("/") if len(path) > 1 else path)


ERROR_BODY_LIMIT_BYTES = 16 * 1024  # an error answer longer than this is not a short JSON refusal


class RequestTap:
    """Watches one request/response pair pass through the proxy and makes its `FinishedRequest`."""

    def __init__(
        self,
        *,
        server_kind: str,
        method: str,
        path: str,
        started_mono_s: float,
        started_wall_s: float,
        request_body_limit_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.server_kind = server_kind
        self.path = path
        self.family = recorded_endpoint(method, path)
        self.started_mono_s = started_mono_s
        self.started_wall_s = started_wall_s
        self._request_limit_bytes = request_body_limit_bytes
        self._request: bytearray | None = bytearray() if self.family is not None else None
        self.request_model: str | None = None
        self.request_stream: bool | None = None  # what the request asked for (None: unknown)
        self.include_usage = False
        self.max_tokens: int | None = None  # the answer's length limit the request asked for
        self.prompt_chars = 0  # characters of the prompt (for an estimate where no count exists)
        self.prompt_tokens_sent: int | None = None  # the server's own count (services/proxy/prompt_length.py)
        self._error_body: bytearray | None = None  # an error answer (small), to read a context refusal
        self.status: int | None = None
        self.content_type = ""
        self.compressed = False
        self.mode: str | None = None  # "sse", "ndjson", "json" or "skip", set at the response head
        self._carry: JsonScan | None = None  # the scan of a data line split across reads
        self._line_head = bytearray()  # the start of a line until its kind is known (SSE prefixes only)
        self._line_kind: str | None = None  # "data", "event", "other" for the line in progress
        self._event = ""  # the current SSE event name (schema names only, capped)
        self._doc: JsonScan | None = None  # the scan of a non-streaming body
        self.found: dict[str, Any] = {}
        self.ttft_s: float | None = None
        self.first_text_mono_s: float | None = None
        self.last_text_mono_s: float | None = None
        self.text_pieces = 0

    @property
    def active(self) -> bool:
        return self.family is not None

    @property
    def streaming(self) -> bool:
        return self.mode in ("sse", "ndjson")

    # ------------------------------------------------------------------ request
    def request_body(self, payload: bytes) -> None:
        """De-framed request body bytes, in pieces; kept up to the limit, only until the response head."""
        if self._request is None:
            return
        if len(self._request) + len(payload) > self._request_limit_bytes:
            self._request = None
            return
        self._request += payload

    @property
    def request_bytes(self) -> int:
        """Bytes of the request body held now (0 once read or past the limit)."""
        return len(self._request) if self._request else 0

    def request_copy(self) -> bytes | None:
        """The whole request body so far (None once read or past the limit), for the prompt count."""
        return bytes(self._request) if self._request else None

    def read_request(self) -> None:
        """Read the held body now (the proxy calls this on a worker thread for a big body, before
        the response head); a later call, or the response head's, finds nothing left to read."""
        self._read_request()

    def drop_request(self) -> None:
        """Forget the held body (the proxy's budget for held bodies is spent): the record names no model."""
        self._request = None

    def _read_request(self) -> None:
        raw, self._request = self._request, None
        if not raw:
            return
        try:
            body = json.loads(bytes(raw))
        except ValueError:
            return
        finally:
            del raw
        if not isinstance(body, dict):
            return
        model = body.get("model")
        self.request_model = model if isinstance(model, str) and model else None
        stream = body.get("stream")
        self.request_stream = stream if isinstance(stream, bool) else None
        options = body.get("stream_options")
        self.include_usage = isinstance(options, dict) and options.get("include_usage") is True
        self.max_tokens = max_tokens_of(body)
        self.prompt_chars = prompt_chars_of(body)

    def _expects_stream(self) -> bool:
        if self.family in ("ollama-generate", "ollama-chat"):
            return self.request_stream is not False  # Ollama streams unless told `stream: false`
        return self.request_stream is True

    # ------------------------------------------------------------------ response
    def response_head(self, status: int, headers: Mapping[str, str], now_mono_s: float) -> None:
        """Status and lower-case headers; decides how the body is read (or not read). The first head
        wins: a status the proxy names at the end (its own 400 or 502) never replaces the upstream's
        head, whose body is being read."""
        if not self.active or self.status is not None:
            return
        self._read_request()
        self.status = status
        self.content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        encoding = headers.get("content-encoding", "").strip().lower()
        self.compressed = encoding not in ("", "identity")
        if status >= 400 and not self.compressed:
            self.mode = "error"
            self._error_body = bytearray()
        elif self.compressed or status >= 400:
            self.mode = "skip"
        elif self.content_type == "text/event-stream":
            self.mode = "sse"
        elif self.content_type in ("application/x-ndjson", "application/ndjson", "application/jsonl"):
            self.mode = "ndjson"
        elif self.content_type.endswith("json"):
            self.mode = "json"
        elif self._expects_stream():
            self.mode = "ndjson" if self.family in ("ollama-generate", "ollama-chat") else "sse"
        else:
            self.mode = "json"
        if self.mode == "json":
            self._doc = JsonScan(want_model=True)

    def response_body(self, payload: bytes, now_mono_s: float) -> None:
        """De-chunked body bytes as they pass."""
        if self.family is None or not payload:
            return
        if self.mode is None:
            self.response_head(200, {}, now_mono_s)
        if self.mode == "json" and self._doc is not None:
            self._doc.feed(payload)
            return
        if self._error_body is not None:
            if len(self._error_body) + len(payload) <= ERROR_BODY_LIMIT_BYTES:
                self._error_body += payload
            else:
                self._error_body = None  # not a short error document
            return
        if self.mode not in ("sse", "ndjson"):
            return
        start, n = 0, len(payload)
        while start < n:
            newline = payload.find(b"\n", start)
            end = n if newline < 0 else newline
            if self._line_kind is None and not self._line_head and newline >= 0:
                self._whole_line(payload[start:end], now_mono_s)
            else:
                self._partial(payload[start:end], now_mono_s)
                if newline >= 0:
                    self._end_partial(now_mono_s)
            if newline < 0:
                break
            start = newline + 1

    def _on_text(self, now_mono_s: float) -> None:
        if self.first_text_mono_s is None:
            self.first_text_mono_s = now_mono_s
            self.ttft_s = max(0.0, now_mono_s - self.started_mono_s)
        self.last_text_mono_s = now_mono_s
        self.text_pieces += 1

    def _text_counts(self) -> bool:
        # /v1/responses: only `*.delta` events carry new text (`*.done` and `response.completed` repeat it)
        return not self._event or self._event.endswith(".delta")

    def _whole_line(self, line: bytes, now_mono_s: float) -> None:
        if self.mode == "sse":
            if line.startswith(b"data:"):
                line = line[5:]
            else:
                if line.startswith(b"event:"):
                    self._event = line[6:].strip()[:96].decode("ascii", "replace")
                elif not line.strip():
                    self._event = ""
                return
        has_text, stats = scan_line(line, want_model=wants_model(self.found))
        if has_text and self._text_counts():
            self._on_text(now_mono_s)
        if stats:
            merge_found(self.found, stats)

    def _partial(self, part: bytes, now_mono_s: float) -> None:
        """Part of a line that does not end in this piece (or ends a line begun in an earlier one)."""
        if self._line_kind is None:
            if self.mode == "ndjson":
                self._line_kind = "data"
                self._carry = JsonScan(want_model=wants_model(self.found))
            else:
                need = 6 - len(self._line_head)  # enough bytes to tell "data:" from "event:"
                self._line_head += part[:need]
                part = part[need:]
                head = bytes(self._line_head)
                if head.startswith(b"data:"):
                    self._line_kind = "data"
                    self._line_head.clear()
                    self._carry = JsonScan(want_model=wants_model(self.found))
                    part = head[5:] + part
                elif head.startswith(b"event:"):
                    self._line_kind = "event"
                elif len(head) < 6 and (b"data:".startswith(head) or b"event:".startswith(head)):
                    return  # the piece ended inside the prefix
                else:
                    self._line_kind = "other"
                    self._line_head.clear()
        if self._line_kind == "data" and self._carry is not None:
            had_text = self._carry.has_text
            self._carry.feed(part)
            if self._carry.has_text and not had_text and self._text_counts():
                self._on_text(now_mono_s)
        elif self._line_kind == "event":
            self._line_head += part[: max(0, 128 - len(self._line_head))]

    def _end_partial(self, now_mono_s: float) -> None:
        kind, self._line_kind = self._line_kind, None
        if kind is None or kind == "event":
            head = bytes(self._line_head)
            self._line_head.clear()
            self._whole_line(head, now_mono_s)
        elif kind == "data" and self._carry is not None:
            merge_found(self.found, self._carry.found)
        self._carry = None

    # ------------------------------------------------------------------ the record
    def finish(self, *, now_mono_s: float, now_wall_s: float, aborted: bool) -> FinishedRequest | None:
        """The request's record (None only when not recorded). An aborted or failed one still has one."""
        if not self.active:
            return None
        self._read_request()  # no response head came (an abort before it): the request still names the model
        if self._line_kind == "data" and self._carry is not None:  # a last line without its newline
            merge_found(self.found, self._carry.found)
        self._carry = None
        self._line_head.clear()
        self._line_kind = None
        if self._doc is not None:
            merge_found(self.found, self._doc.found)
            self._doc = None
        found, self.found = self.found, {}
        fit = self._context_fit(found)
        model = found.get("model") or found.get("model_instance_id")  # LM Studio /api/v1 names it so
        record = build_record(
            found,
            model=model if isinstance(model, str) and model else self.request_model or "unknown",
            finished_wall_s=now_wall_s,
            streaming=self.streaming,
            ttft_s=self.ttft_s if self.streaming else None,
            first_text_mono_s=self.first_text_mono_s,
            last_text_mono_s=self.last_text_mono_s,
            text_pieces=self.text_pieces,
            elapsed_s=max(0.0, now_mono_s - self.started_mono_s),
        )
        return FinishedRequest(
            **{
                **record,
                "source": "proxy",
                "endpoint": self.path,
                "http_status": self.status,
                "aborted": aborted,
                **fit,
            }
        )

    def _context_fit(self, found: dict[str, Any]) -> dict[str, Any]:
        """Did the prompt and the answer fit the context: the prompt's tokens as sent (a refusal's
        exact numbers, the server's own count, or an estimate from the text), the context size a
        refusal named, why the answer ended, and the client's length limit. Counts only."""
        fit: dict[str, Any] = {"stop_reason": stop_reason_of(found), "max_tokens_requested": self.max_tokens}
        error, self._error_body = self._error_body, None
        refused = overflow_from_error(bytes(error)) if error else None
        if refused is not None:
            sent, limit = refused
            fit.update(
                context_limit_tokens=limit, prompt_tokens_sent=sent, prompt_sent_exact=sent is not None
            )
        elif self.prompt_tokens_sent is not None:
            fit.update(prompt_tokens_sent=self.prompt_tokens_sent, prompt_sent_exact=True)
        elif self.prompt_chars and self.server_kind != "llamacpp":  # llama-server never cuts a prompt
            fit.update(prompt_tokens_sent=estimated_tokens(self.prompt_chars), prompt_sent_exact=False)
        return fit
