"""`llm-tray bench`'s requests (#13): one streamed generation through the API clients use.

Each request goes to the server's own generation endpoint (llama-server `/completion`, Ollama
`/api/generate`, LM Studio `/api/v0/chat/completions`, any other kind `/v1/chat/completions`) with
the prompt cache defeated where the server allows it (`cache_prompt: false` on llama-server; the
caller puts a unique prefix in every prompt for all kinds). The response is read by the recording
proxy's tap (`RequestTap`), fed the request body and the response bytes as they arrive, so the
server's numbers are parsed in one place; its `finish()` record carries the server's timings, and
the tap's first/last text times give bench's own estimate over the streamed tokens.

No prompt or completion text is kept, logged or returned.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.recorder import RequestTap
from trayapp.sources.http import make_client

log = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 300  # characters of a server's error message shown


class BenchRequestError(Exception):
    """A generation request failed: HTTP error, connection loss, or no usable answer."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


class ContextExceededError(BenchRequestError):
    """The server refused the prompt: it does not fit its context."""


@dataclass(frozen=True)
class Generation:
    """One finished streamed request: the tap's record and the stream's own clock (monotonic s)."""

    record: FinishedRequest
    started_mono_s: float
    finished_mono_s: float
    first_text_mono_s: float | None
    last_text_mono_s: float | None
    streamed_tokens: int  # pieces of generated text

    @property
    def wall_s(self) -> float:
        return self.finished_mono_s - self.started_mono_s


def request_for(kind: str, model: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of one streamed generation on a server of `kind`."""
    if kind == "llamacpp":
        # `model` routes a request in router mode; a single server ignores it
        body: dict[str, Any] = {"model": model, "prompt": prompt, "n_predict": max_tokens, "stream": True}
        return "/completion", body | {"cache_prompt": False, "ignore_eos": True, "temperature": 0}
    if kind == "ollama":
        options = {"num_predict": max_tokens, "temperature": 0}
        return "/api/generate", {"model": model, "prompt": prompt, "stream": True, "options": options}
    messages = [{"role": "user", "content": prompt}]
    chat: dict[str, Any] = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens}
    chat["temperature"] = 0
    if kind == "lmstudio":
        return "/api/v0/chat/completions", chat
    chat["stream_options"] = {"include_usage": True}
    if kind == "vllm":
        chat["ignore_eos"] = True  # vLLM's sampling extension: exactly max_tokens
    return "/v1/chat/completions", chat


def _error_message(status: int, raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            error = error.get("message") or error.get("type")
        if isinstance(error, str) and error:
            text = error
    return f"HTTP {status}: {text[:ERROR_TEXT_LIMIT] or 'no message'}"


def _is_context_error(status: int, message: str) -> bool:
    lowered = message.lower()
    return status in (400, 413, 422) and "context" in lowered and ("exceed" in lowered or "size" in lowered)


class BenchClient:
    """Streams generations from one server; a `with` block closes the connection pool."""

    def __init__(
        self,
        base_url: str,
        kind: str,
        *,
        api_key: str | None = None,
        read_timeout_s: float = 300.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        timeout = httpx.Timeout(connect=5.0, read=read_timeout_s, write=30.0, pool=5.0)
        self._client = make_client(self.base_url, timeout=timeout)
        # A new connection per run: a pooled one the server closed while idle (between runs, while the
        # monitor ticks) fails as "Server disconnected without sending a response"
        self._headers = {
            "Accept-Encoding": "identity",
            "Content-Type": "application/json",
            "Connection": "close",
        }
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def generate(self, model: str, prompt: str, max_tokens: int) -> Generation:
        """One streamed request to the end; BenchRequestError when it fails (KeyboardInterrupt passes)."""
        path, payload = request_for(self.kind, model, prompt, max_tokens)
        body = json.dumps(payload).encode()
        del payload
        started = time.monotonic()
        tap = RequestTap(
            server_kind=self.kind,
            method="POST",
            path=path,
            started_mono_s=started,
            started_wall_s=time.time(),
        )
        tap.request_body(body)
        try:
            with self._client.stream("POST", path, content=body, headers=self._headers) as response:
                del body
                head = {k.lower(): v for k, v in response.headers.items()}
                tap.response_head(response.status_code, head, time.monotonic())
                if response.status_code >= 400:
                    raw = b"".join(response.iter_raw())[:4096]
                    message = _error_message(response.status_code, raw)
                    error = ContextExceededError if _is_context_error(response.status_code, message) else None
                    raise (error or BenchRequestError)(message, http_status=response.status_code)
                for chunk in response.iter_raw():
                    tap.response_body(chunk, time.monotonic())
        except httpx.HTTPError as exc:
            raise BenchRequestError(f"{type(exc).__name__}: {exc}") from exc
        finished = time.monotonic()
        record = tap.finish(now_mono_s=finished, now_wall_s=time.time(), aborted=False)
        if record is None:  # pragma: no cover - every path above is one the tap records
            raise BenchRequestError(f"{path}: not a generation endpoint the tap reads")
        if tap.text_pieces == 0 and record.decode_tokens in (None, 0):
            raise BenchRequestError(f"{path}: the server streamed no generated text")
        return Generation(
            record=record,
            started_mono_s=started,
            finished_mono_s=finished,
            first_text_mono_s=tap.first_text_mono_s,
            last_text_mono_s=tap.last_text_mono_s,
            streamed_tokens=tap.text_pieces,
        )
