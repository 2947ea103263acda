"""A proxied prompt's length in tokens, asked of the llama-server it is going to (issue #11).

llama-server's `/slots` says how much of a prompt is evaluated, never how long the prompt is, so
neither the share read nor an ETA can come from polling. The proxy sees the request, and the
same server answers `/apply-template` (a chat request → its prompt string) and `/tokenize`
without queueing behind the running work: measured at a few milliseconds in the middle of a
2,000-token prefill, and exactly the server's own `prompt_n + cache_n` for the same request.

The request body is held only by the counting task, sent only to the server the client sent it
to, and dropped when the count is known; it is never stored or logged. Its copy counts against the
listener's budget for held bodies (admission.HeldBytes): past it, no count. The count runs beside
the forwarded request, never in its way. Whatever does not fit (images, several prompts, a
server error, a slow answer) gives no count: the total then stays unknown, never guessed.

Only a body of `min_body_bytes` or more is counted (the proxy passes limits.COUNT_PROMPT_FROM_BYTES:
a shorter prompt is read in one of llama-server's batches, so its total would show no progress):
a short chat costs the proxy and the server nothing. The count's connections are not kept alive:
counts come seconds apart (long prompts only), past cpp-httplib's 5 s keep-alive, and a request
sent on a connection the server is closing gets no answer (limits.UPSTREAM_REUSE_IDLE_S). The
count's requests do not queue behind the generation: llama-server answers both on its HTTP
threads, not its slots (measured here: 1-2 ms and 0.6 ms + ~3 µs a token idle; up to 10 and 20 ms
in the middle of a 3,000-token prefill on 2 shared cores: the server's CPU for a count of a prompt
whose prefill takes tens of seconds), and idle connections to it (70 tried) never delayed a new
request.

The same counter puts each request to a server that reports no live progress of its own (MLX-LM,
a generic OpenAI-compatible server: core/proxied_streams.py) on the board while it runs, so the
monitor can read how many tokens of its answer have streamed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trayapp.core.proxied_streams import rate_from_proxy
from trayapp.services.proxy.inbox import StreamProgress
from trayapp.services.proxy.limits import PARSE_OFF_LOOP_BYTES

if TYPE_CHECKING:
    import httpx

    from trayapp.services.proxy.admission import HeldBytes
    from trayapp.services.proxy.recorder import RequestTap

log = logging.getLogger(__name__)

COUNT_TIMEOUT_S = 5.0  # a count later than this is of no use to a progress bar
COUNTED_FAMILIES = frozenset({"openai-chat", "openai-completions", "llamacpp-completion"})


def counts_prompts(server_kind: str, family: str | None) -> bool:
    """Whether a request of this API family to this kind of server gets its prompt counted."""
    return server_kind == "llamacpp" and family in COUNTED_FAMILIES


def _text_only(messages: Any) -> bool:
    """Chat messages whose contents are all text (an image's tokens are not the template's)."""
    if not isinstance(messages, list) or not messages:
        return False
    for message in messages:
        if not isinstance(message, dict):
            return False
        content = message.get("content")
        if isinstance(content, list):
            if any(not isinstance(part, dict) or part.get("type") != "text" for part in content):
                return False
        elif content is not None and not isinstance(content, str):
            return False
    return True


async def _tokens_of(
    client: httpx.AsyncClient, base_url: str, text: str, model: Any, headers: dict[str, str]
) -> int | None:
    payload: dict[str, Any] = {"content": text, "add_special": True, "parse_special": True}
    if isinstance(model, str):
        payload["model"] = model  # a router sends it to that model's instance
    response = await client.post(base_url + "/tokenize", json=payload, headers=headers)
    if response.status_code != 200:
        return None
    tokens = response.json().get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def count_prompt_tokens(
    client: httpx.AsyncClient,
    base_url: str,
    family: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> int | None:
    """The prompt's tokens as the server will see them (cached ones included), or None.
    `headers`: the client's own `Authorization`, for a server with an API key."""
    import httpx

    try:
        return await asyncio.wait_for(_count(client, base_url, family, body, headers or {}), COUNT_TIMEOUT_S)
    except (httpx.HTTPError, ValueError, AttributeError, asyncio.TimeoutError) as exc:
        log.debug("prompt count from %s failed: %s", base_url, type(exc).__name__)
        return None


async def _count(
    client: httpx.AsyncClient, base_url: str, family: str, body: dict[str, Any], headers: dict[str, str]
) -> int | None:
    model = body.get("model")
    if family == "openai-chat":
        if not _text_only(body.get("messages")):
            return None
        response = await client.post(base_url + "/apply-template", json=body, headers=headers)
        prompt = response.json().get("prompt") if response.status_code == 200 else None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return len(prompt)  # already tokens
    if isinstance(prompt, str):
        return await _tokens_of(client, base_url, prompt, model, headers)
    return None


class PromptBoard(Protocol):
    """Where the lengths of the prompts being read go (services/proxy/inbox.py's RecordInbox)."""

    def prompt_started(self, key: int, upstream_url: str, model: str | None, tokens: int) -> None: ...

    def prompt_ended(self, key: int) -> None: ...


@runtime_checkable
class StreamBoard(Protocol):
    """Where the requests under way go, for their streamed answers' progress (RecordInbox)."""

    def stream_started(self, key: int, upstream_url: str, progress: StreamProgress) -> None: ...

    def stream_ended(self, key: int) -> None: ...


class PromptCounter:
    """One route's prompt counts: started when a request's body is through, on the board until
    the request's first generated text (or its end), then gone."""

    def __init__(
        self,
        board: PromptBoard | None,
        upstream_url: str,
        server_kind: str,
        held: HeldBytes,
        min_body_bytes: int = 0,
    ) -> None:
        self._board = board
        # where streamed answers' progress goes: the server shows none while it generates (decided
        # once: an isinstance against a Protocol costs ~10 µs a request)
        live = isinstance(board, StreamBoard) and rate_from_proxy(server_kind)
        self._stream_board: StreamBoard | None = board if live and isinstance(board, StreamBoard) else None
        self._min_body_bytes = min_body_bytes
        self._held = held
        self._upstream_url = upstream_url.rstrip("/")
        self._server_kind = server_kind
        self._client: httpx.AsyncClient | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}  # by the request's tap
        self._posted: set[int] = set()
        self._streams: set[int] = set()  # requests on the board for their answers' progress

    def request_sent(self, tap: RequestTap, authorization: str | None) -> None:
        """The request's body has gone up: count its prompt beside it (with the client's own
        `Authorization`, held by the task only, for a server with an API key), and put it on the
        board for its answer's progress where the server reports none."""
        stream_board = self._stream_board
        if stream_board is not None and tap.family and id(tap) not in self._streams:
            self._streams.add(id(tap))
            stream_board.stream_started(id(tap), self._upstream_url, tap)
        if self._board is None or not counts_prompts(self._server_kind, tap.family) or id(tap) in self._tasks:
            return
        if self._min_body_bytes and tap.request_bytes < self._min_body_bytes:
            return  # a prompt read in one batch: its total would show no progress
        body = tap.request_copy()
        if body is None or not self._held.take(len(body)):
            return  # nothing to count, or the listener holds its budget of bodies already
        if self._client is None:
            import httpx  # here: the tray imports the proxy at start, and httpx costs ~0.1 s

            no_keep_alive = httpx.Limits(max_keepalive_connections=0)  # see the module's docstring
            self._client = httpx.AsyncClient(timeout=COUNT_TIMEOUT_S, limits=no_keep_alive)
        self._tasks[id(tap)] = asyncio.create_task(self._count(tap, body, authorization))

    async def _count(self, tap: RequestTap, body: bytes, authorization: str | None) -> None:
        held_bytes = len(body)  # the copy, and then what is parsed from it, until the count is known
        try:
            await self._count_held(tap, body, authorization)
        finally:
            self._held.give(held_bytes)

    async def _count_held(self, tap: RequestTap, body: bytes, authorization: str | None) -> None:
        assert self._client is not None and tap.family is not None
        try:  # a big body is parsed on a worker thread: the streams on this loop never wait on it
            doc = (
                json.loads(body)
                if len(body) <= PARSE_OFF_LOOP_BYTES
                else await asyncio.to_thread(json.loads, body)
            )
        except ValueError:
            return
        del body
        if not isinstance(doc, dict):
            return
        model = doc.get("model") if isinstance(doc.get("model"), str) else None
        headers = {"Authorization": authorization} if authorization else {}
        tokens = await count_prompt_tokens(self._client, self._upstream_url, tap.family, doc, headers)
        del doc
        if tokens is not None:
            tap.prompt_tokens_sent = tokens  # the record says how long the prompt was, counted exactly
        if tokens is not None and self._board is not None and tap.first_text_mono_s is None:
            self._board.prompt_started(id(tap), self._upstream_url, model, tokens)
            self._posted.add(id(tap))

    def prompt_read(self, tap: RequestTap) -> None:
        """The first text came, or the request ended: its prompt is no longer being read."""
        task = self._tasks.pop(id(tap), None)
        if task is not None and not task.done():
            task.cancel()
        if id(tap) in self._posted:
            self._posted.discard(id(tap))
            if self._board is not None:
                self._board.prompt_ended(id(tap))

    def request_ended(self, tap: RequestTap) -> None:
        """The request is over (answered, failed or abandoned): off the board altogether."""
        self.prompt_read(tap)
        if id(tap) in self._streams:
            self._streams.discard(id(tap))
            if self._stream_board is not None:
                self._stream_board.stream_ended(id(tap))

    @property
    def pending(self) -> bool:
        return bool(self._tasks)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for key in list(self._posted):
            if self._board is not None:
                self._board.prompt_ended(key)
        for key in list(self._streams):
            if self._stream_board is not None:
                self._stream_board.stream_ended(key)
        self._streams.clear()
        self._tasks.clear()
        self._posted.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
