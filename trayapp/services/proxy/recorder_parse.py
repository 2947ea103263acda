"""Pure helpers for the recording proxy's tap (#12): a request's record from the facts the JSON scan
(`json_scan.py`) captured, the stop reason, the request's limits and a context overflow's numbers from an
error body. No I/O, and no text kept.
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
