"""Pure scanning helpers for the recording proxy's tap (#12): no I/O, and no text kept.

Two paths read the same facts from a JSON line or document:

* `scan_line` (fast): a whole line at once; one regex says whether it carries generated text, a cheap
  marker check decides whether `json.loads` is worth running for its statistics.
* `JsonScan` (incremental): the same facts fed in pieces, for a line split across reads or a
  non-streaming body. It tracks only the JSON structure and the values of a few statistics keys;
  string contents are skipped, never stored.

Both report "has text" when a string value under one of `TEXT_KEYS` is non-empty (at any depth: a
role-only delta, `"content":null`, `"content":""` and llama-server's `prompt_progress` chunks do not
count; tool-call `arguments` strings do), and capture the top-level values of `WANTED_KEYS` (and
those under a top-level `response` or `result` object, as `/v1/responses` events and LM Studio's
`chat.end` nest them), the first model name winning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from trayapp.core.model import FinishedRequest, StopReason
from trayapp.core.overflow import stop_reason_from
from trayapp.sources.servers.llamacpp_parse import parse_timings
from trayapp.sources.servers.lmstudio import parse_chat_stats

TEXT_KEYS = frozenset(
    {"content", "reasoning_content", "reasoning", "text", "response", "delta", "thinking", "arguments"}
)
STAT_KEYS = frozenset(
    {
        "timings",  # llama-server
        "usage",  # OpenAI-compatible (and /v1/responses' response.usage)
        "stats",  # LM Studio native APIs
        "metrics",  # vLLM per-request metrics block
        "prompt_eval_count",  # Ollama's final object (the durations ride with it)
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
        "load_duration",
        "total_duration",
    }
)
WANTED_KEYS = STAT_KEYS | {"model", "model_instance_id", "load_time_seconds"}
# Why the answer ended, read at any depth (OpenAI nests `finish_reason` in `choices`): scalars only.
STOP_KEYS = frozenset({"finish_reason", "done_reason", "stop_type", "truncated"})
NESTS = frozenset({"response", "result"})  # /v1/responses events, LM Studio's chat.end
MAX_CAPTURE_BYTES = 64 * 1024  # a statistics value larger than this is not statistics: dropped

_TEXT_RE = re.compile(rb'"(?:' + b"|".join(k.encode() for k in sorted(TEXT_KEYS)) + rb')"\s*:\s*"(?!")')
_STAT_RE = re.compile(
    rb'"(?:timings|usage|stats|metrics|prompt_eval_count|prompt_eval_duration|eval_count'
    rb'|eval_duration|load_duration|total_duration|load_time_seconds)"\s*:'
)
_MODEL_RE = re.compile(rb'"model(?:_instance_id)?"\s*:')
_STOP_VALUE_RE = re.compile(
    rb'"(finish_reason|done_reason|stop_type|truncated)"\s*:\s*("[a-z_]{1,32}"|true|false)'
)
_MODEL_KEYS = ("model", "model_instance_id")
_STR_STOP = re.compile(rb'["\\]')
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")


def wants_model(found: dict[str, Any]) -> bool:
    """Whether lines should still be read for a model name (none seen yet)."""
    return not any(key in found for key in _MODEL_KEYS)


def merge_found(found: dict[str, Any], new: dict[str, Any]) -> None:
    """Fold one line's captured values into the request's: later values win, except model names."""
    for key, value in new.items():
        if key in _MODEL_KEYS and key in found:
            continue
        found[key] = value


def _wanted_of(obj: Any, want_model: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if key in NESTS and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                if sub_key in WANTED_KEYS and (
                    sub_key not in _MODEL_KEYS or (want_model and sub_key not in out)
                ):
                    out[sub_key] = sub_value
        elif key in WANTED_KEYS and (key not in _MODEL_KEYS or (want_model and key not in out)):
            out[key] = value
    return out


def _stops_of(payload: bytes) -> dict[str, Any]:
    """`STOP_KEYS` at any depth of one line: a key in unescaped quotes is never inside a string."""
    found: dict[str, Any] = {}
    for match in _STOP_VALUE_RE.finditer(payload):
        key = match.group(1).decode("ascii")
        value = match.group(2)
        if value.startswith(b'"'):
            found[key] = value[1:-1].decode("ascii", "replace")
        else:
            found[key] = value == b"true"
    return found


def scan_line(payload: bytes, *, want_model: bool) -> tuple[bool, dict[str, Any]]:
    """One whole JSON line → (carries generated text, captured statistics). Nothing is kept."""
    has_text = _TEXT_RE.search(payload) is not None
    stops = _stops_of(payload)
    if _STAT_RE.search(payload) is None and not (want_model and _MODEL_RE.search(payload)):
        return has_text, stops
    try:
        obj = json.loads(payload)
    except ValueError:
        return has_text, stops
    return has_text, {**stops, **_wanted_of(obj, want_model)}


class JsonScan:
    """Incremental scan of one JSON document (or several in a row) fed in pieces.

    Holds the container stack, the current key names (short schema names, capped) and the raw bytes
    of a statistics value being captured; string values are skipped unread.
    """

    __slots__ = (
        "_cap",
        "_cap_depth",
        "_cap_key",
        "_esc",
        "_expect_key",
        "_in_str",
        "_is_key",
        "_key",
        "_keys",
        "_stack",
        "_text_probe",
        "found",
        "has_text",
        "want_model",
    )

    def __init__(self, *, want_model: bool) -> None:
        self._stack: list[int] = []
        self._keys: list[str] = []
        self._in_str = False
        self._esc = False
        self._is_key = False
        self._key = bytearray()
        self._expect_key = False
        self._text_probe = False
        self._cap: bytearray | None = None
        self._cap_key = ""
        self._cap_depth = 0
        self.want_model = want_model
        self.has_text = False
        self.found: dict[str, Any] = {}

    def _wants(self, key: str) -> bool:
        if key in STOP_KEYS:
            return True
        if key not in WANTED_KEYS or (key in _MODEL_KEYS and (not self.want_model or key in self.found)):
            return False
        depth = len(self._stack)
        return depth == 1 or (depth == 2 and self._keys[0] in NESTS)

    def _end_capture(self, tail: bytes) -> None:
        cap = self._cap
        self._cap = None
        if cap is None or len(cap) + len(tail) > MAX_CAPTURE_BYTES:
            return
        try:
            value = json.loads(bytes(cap + tail))
        except ValueError:
            return
        if value is None and self._cap_key in STOP_KEYS:
            return  # a stream's `"finish_reason": null` before the last chunk names it
        merge_found(self.found, {self._cap_key: value})

    def feed(self, data: bytes) -> None:
        """Scan the next piece of the document."""
        i, n = 0, len(data)
        cap_start = 0
        while i < n:
            if self._in_str:
                if self._esc:
                    self._esc = False
                    i += 1
                    continue
                if self._text_probe:
                    self._text_probe = False
                    if data[i] != _QUOTE:
                        self.has_text = True
                m = _STR_STOP.search(data, i)
                stop = n if m is None else m.start()
                if self._is_key and len(self._key) < 64:
                    self._key += data[i : min(stop, i + 64)]
                if m is None:
                    i = n
                    break
                if data[stop] == _BACKSLASH:
                    if self._is_key and len(self._key) < 64:
                        self._key.append(_BACKSLASH)
                    self._esc = True
                    i = stop + 1
                    continue
                self._in_str = False
                if self._is_key:
                    self._keys[-1] = self._key.decode("utf-8", "replace")
                    self._key.clear()
                i = stop + 1
                continue
            c = data[i]
            if c == _QUOTE:
                self._in_str = True
                self._is_key = self._expect_key and bool(self._stack) and self._stack[-1] == 0x7B
                if (
                    not self._is_key
                    and self._stack
                    and self._stack[-1] == 0x7B
                    and self._keys[-1] in TEXT_KEYS
                ):
                    if i + 1 < n:
                        if data[i + 1] != _QUOTE:
                            self.has_text = True
                    else:
                        self._text_probe = True
            elif c == 0x3A:  # ':'
                self._expect_key = False
                if (
                    self._cap is None
                    and self._stack
                    and self._stack[-1] == 0x7B
                    and self._wants(self._keys[-1])
                ):
                    self._cap = bytearray()
                    self._cap_key = self._keys[-1]
                    self._cap_depth = len(self._stack)
                    cap_start = i + 1
            elif c == 0x2C or c in _CLOSE:  # ',' '}' ']'
                if self._cap is not None and len(self._stack) == self._cap_depth:
                    self._end_capture(data[cap_start:i])
                if c == 0x2C:
                    self._expect_key = bool(self._stack) and self._stack[-1] == 0x7B
                elif self._stack:
                    self._stack.pop()
                    self._keys.pop()
                    self._expect_key = False
            elif c in _OPEN:
                self._stack.append(c)
                self._keys.append("")
                self._expect_key = c == 0x7B
            i += 1
        if self._cap is not None:
            if len(self._cap) + (n - cap_start) > MAX_CAPTURE_BYTES:
                self._cap = None
            else:
                self._cap += data[cap_start:n]


# --------------------------------------------------------------------------- the record

_NS_PER_S = 1e9


def _as_num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _as_int(value: Any) -> int | None:
    number = _as_num(value)
    return None if number is None else int(number)


def _usage_counts(usage: Any) -> tuple[int | None, int | None, int | None]:
    """OpenAI `usage` (chat/completions, or /v1/responses' input/output names) → prompt, cached, output."""
    if not isinstance(usage, dict):
        return None, None, None
    prompt = _as_int(usage.get("prompt_tokens", usage.get("input_tokens")))
    output = _as_int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    cached = _as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    return prompt, cached, output


def queue_wait_s(
    timings: Mapping[str, Any], *, streaming: bool, ttft_s: float | None, elapsed_s: float | None
) -> float | None:
    """How long a request waited before llama-server began reading its prompt (a slot busy with other
    requests, or its model loading): the proxy's time to the first text less the server's own
    `prompt_ms` (streaming), or the proxy's whole time less `prompt_ms + predicted_ms` (not
    streaming). Never below 0; None without the figures. What is left in it besides waiting is the
    loopback hop, a millisecond or two."""
    prompt_ms = _as_num(timings.get("prompt_ms"))
    if prompt_ms is None or prompt_ms < 0:
        return None
    if streaming:
        return None if ttft_s is None else max(0.0, ttft_s - prompt_ms / 1000.0)
    predicted_ms = _as_num(timings.get("predicted_ms"))
    if elapsed_s is None or predicted_ms is None or predicted_ms < 0:
        return None
    return max(0.0, elapsed_s - (prompt_ms + predicted_ms) / 1000.0)


def build_record(
    found: Mapping[str, Any],
    *,
    model: str,
    finished_wall_s: float,
    streaming: bool,
    ttft_s: float | None,
    first_text_mono_s: float | None,
    last_text_mono_s: float | None,
    text_pieces: int,
    elapsed_s: float | None = None,
) -> dict[str, Any]:
    """The captured statistics of one response → `FinishedRequest` fields (no source/endpoint/status).
    `elapsed_s`: the proxy's time from the request's arrival to the response's end."""
    fields: dict[str, Any] = {"model": model, "finished_wall_s": finished_wall_s}
    timings = found.get("timings")
    if isinstance(timings, dict):
        parsed = parse_timings({"timings": timings}, finished_wall_s=finished_wall_s, model=model)
        if parsed is not None:
            fields.update(_fields_of(parsed))
            fields["queue_wait_s"] = queue_wait_s(
                timings, streaming=streaming, ttft_s=ttft_s, elapsed_s=elapsed_s
            )
            if streaming:
                fields["ttft_s"] = ttft_s
            return fields
    stats = found.get("stats")
    if isinstance(stats, dict):
        body = {"stats": stats, "usage": found.get("usage"), "model": model}
        parsed_stats = parse_chat_stats(body, finished_wall_s=finished_wall_s)
        fields.update(_fields_of(parsed_stats))
        if fields["load_s"] is None:  # LM Studio /api/v1 streams it on its model_load.end event
            fields["load_s"] = _as_num(found.get("load_time_seconds"))
        if streaming:
            fields["ttft_s"] = ttft_s
        return fields
    if "eval_count" in found or "prompt_eval_count" in found:
        fields.update(_ollama_fields(found))
        if streaming:
            fields["ttft_s"] = ttft_s
        return fields
    prompt, cached, output = _usage_counts(found.get("usage"))
    fields.update(prompt_tokens=prompt, cached_tokens=cached, decode_tokens=output, ttft_s=ttft_s)
    if prompt is not None and output is not None:
        fields["context_tokens"] = prompt + output
    metrics = found.get("metrics")
    if isinstance(metrics, dict):  # vLLM's per-request block: the server's own clock
        itl_ms = _as_num(metrics.get("mean_itl_ms"))
        if itl_ms is not None and itl_ms > 0:
            fields["decode_tok_s"] = 1000.0 / itl_ms
        ttft_ms = _as_num(metrics.get("time_to_first_token_ms"))
        if not streaming and ttft_ms is not None:
            fields["ttft_s"] = ttft_ms / 1000.0
        spec = metrics.get("speculative_decoding")
        if isinstance(spec, dict):
            drafted = _as_int(spec.get("num_draft_tokens"))
            accepted = _as_int(spec.get("num_accepted_draft_tokens"))
            if drafted is not None and accepted is not None:
                fields.update(draft_tokens=drafted, draft_accepted=accepted)
        if "decode_tok_s" in fields:
            return fields
    # usage only: completion tokens after the first over the proxy's clock between text pieces
    if (
        output is not None
        and output >= 2
        and text_pieces >= 2
        and first_text_mono_s is not None
        and last_text_mono_s is not None
        and last_text_mono_s > first_text_mono_s
    ):
        fields["decode_tok_s"] = (output - 1) / (last_text_mono_s - first_text_mono_s)
        fields["decode_exact"] = False
    return fields


def _ollama_fields(found: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama's final object: `prompt_eval_count` includes cached tokens, its duration does not."""
    prompt = _as_int(found.get("prompt_eval_count"))
    prompt_ns = _as_num(found.get("prompt_eval_duration"))
    output = _as_int(found.get("eval_count"))
    eval_ns = _as_num(found.get("eval_duration"))
    load_ns = _as_num(found.get("load_duration"))
    fields: dict[str, Any] = {
        "prompt_tokens": prompt,
        "cached_tokens": None,
        "decode_tokens": output,
        "load_s": None if load_ns is None else load_ns / _NS_PER_S,
        "prompt_rate_upper_bound": True,
    }
    if prompt is not None and prompt_ns:
        fields["prompt_tok_s"] = prompt / (prompt_ns / _NS_PER_S)
    if output is not None and eval_ns:
        fields["decode_tok_s"] = output / (eval_ns / _NS_PER_S)
    if prompt is not None and output is not None:
        fields["context_tokens"] = prompt + output
    if prompt_ns is not None:
        fields["ttft_s"] = ((load_ns or 0.0) + prompt_ns) / _NS_PER_S
    return fields


_RECORD_FIELDS = (
    "prompt_tokens",
    "cached_tokens",
    "decode_tokens",
    "prompt_tok_s",
    "decode_tok_s",
    "ttft_s",
    "load_s",
    "draft_tokens",
    "draft_accepted",
    "context_tokens",
)


def _fields_of(record: FinishedRequest) -> dict[str, Any]:
    return {name: getattr(record, name) for name in _RECORD_FIELDS}


# --------------------------------------------------------------------------- did it fit the context (#20)

CHARS_PER_TOKEN_ESTIMATE = 4.0  # English prose and code average 3.5–4.5 characters a token
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")
_VLLM_LIMIT_RE = re.compile(r"maximum context length is (\d+) tokens")
# the prompt's size, best first ("you requested" may count the answer's max_tokens too)
_VLLM_SENT_RES = tuple(
    re.compile(pattern)
    for pattern in (
        r"(\d+) in the messages",
        r"your request has (\d+) input tokens",
        r"you requested (\d+) tokens",
    )
)


def stop_reason_of(found: Mapping[str, Any]) -> StopReason | None:
    """Why the answer ended, from the captured `STOP_KEYS` and LM Studio's `stats`: "context" when
    llama-server says the context ran out (`truncated: true` with a length stop; with --context-shift
    it also says so of an answer that shifted and went on to its end or its n_predict), else the
    server's own word (`core.overflow.stop_reason_from`)."""
    if found.get("truncated") is True and stop_reason_from(found.get("stop_type")) in ("length", None):
        return "context"
    stats = found.get("stats")
    words = [found.get(key) for key in ("stop_type", "done_reason", "finish_reason")]
    if isinstance(stats, dict):
        words.insert(0, stats.get("stop_reason", stats.get("stopReason")))
    return next((r for r in map(stop_reason_from, words) if r is not None), None)


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    """The answer's length limit a request asked for (OpenAI, llama-server, /v1/responses, Ollama's
    `options.num_predict`); None when unset or unlimited (-1)."""
    options = body.get("options")
    values = [body.get(key) for key in _MAX_TOKENS_KEYS]
    if isinstance(options, dict):
        values.append(options.get("num_predict"))
    for value in values:
        if type(value) is int and value > 0:
            return value
    return None


def _text_chars(value: Any, depth: int = 0) -> int:
    """Characters of every string inside `value` (bounded depth): what a template turns into tokens."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:
        return 0
    if isinstance(value, list):
        return sum(_text_chars(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return sum(_text_chars(item, depth + 1) for key, item in value.items() if key != "images")
    return 0


def prompt_chars_of(body: Mapping[str, Any]) -> int:
    """Characters of a request's prompt: its messages (or prompt, system, suffix, input) and the tool
    schemas an agent sends with them. Only the count is kept, never the text."""
    total = 0
    for key in ("messages", "prompt", "system", "suffix", "input", "instructions"):
        total += _text_chars(body.get(key))
    tools = body.get("tools")
    if tools:  # parsed from JSON, so it dumps back: the schema's keys are template text too
        total += len(json.dumps(tools, separators=(",", ":")))
    return total


def estimated_tokens(chars: int) -> int:
    """A prompt's tokens estimated from its characters (`CHARS_PER_TOKEN_ESTIMATE`): rough, marked so."""
    return max(1, round(chars / CHARS_PER_TOKEN_ESTIMATE))


def overflow_from_error(body: bytes) -> tuple[int | None, int] | None:
    """(prompt tokens, context size) from a server's refusal of a prompt too long for its context:
    llama-server's `exceed_context_size_error` (both exact numbers), vLLM's "maximum context length
    is N tokens" message (the prompt's size when it says it); None for any other error."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":
        sent, limit = _as_int(error.get("n_prompt_tokens")), _as_int(error.get("n_ctx"))
        return (sent, limit) if limit is not None else None
    where = error if isinstance(error, dict) else doc if isinstance(doc, dict) else {}
    message = where.get("message")
    limit_match = _VLLM_LIMIT_RE.search(message) if isinstance(message, str) else None
    if isinstance(message, str) and limit_match is not None:
        sizes = (m.group(1) for m in (pattern.search(message) for pattern in _VLLM_SENT_RES) if m)
        size = next(sizes, None)
        return (int(size) if size is not None else None), int(limit_match.group(1))
    return None
