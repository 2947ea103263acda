"""llama.cpp `llama-server`: pure parsers of its monitoring endpoints (reference/backends.md §2).

`/props` → PropsInfo, `/slots` → SlotReadings, `/metrics` → CounterReading, `/v1/models` →
ModelMeta, a response's `timings` → FinishedRequest. Debug builds put the prompt and generated
text in `/slots`; the parsers never copy them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    SlotReading,
)
from trayapp.core.quants import normalize_quant_name
from trayapp.sources import promtext
from trayapp.sources.servers.jsonvals import as_bool, as_dict, as_float, as_int, as_str


@dataclass(frozen=True)
class PropsInfo:
    """The monitoring-relevant part of `GET /props`."""

    model_path: str | None = None
    model_alias: str | None = None
    model_ftype: str | None = None
    quantization: str | None = None
    n_ctx: int | None = None  # per slot
    total_slots: int | None = None
    build_info: str | None = None
    endpoint_slots: bool = True
    endpoint_metrics: bool = False
    is_sleeping: bool = False
    speculative_types: tuple[str, ...] = ()

    @property
    def speculative(self) -> bool:
        return any(kind != "none" for kind in self.speculative_types)

    @property
    def spec_type(self) -> str | None:
        """The speculative decoding kinds in use ("draft-simple", "draft-mtp,ngram-cache"), or None."""
        return _spec_type(self.speculative_types)

    @property
    def model_name(self) -> str:
        """The alias unless it is just the path (llama-server's default), else the file name."""
        if self.model_alias and self.model_alias != self.model_path:
            return self.model_alias
        path = self.model_path or self.model_alias
        if path:
            return os.path.basename(path.replace("\\", "/")) or path
        return "unknown"


@dataclass(frozen=True)
class ModelMeta:
    """One `data[]` entry of `GET /v1/models` (`meta` may be null while loading)."""

    id: str
    size_bytes: int | None = None
    parameter_count: int | None = None
    n_ctx_train: int | None = None
    n_ctx: int | None = None
    n_vocab: int | None = None
    n_embd: int | None = None
    ftype: str | None = None


def _speculative_types(params: Mapping[str, Any]) -> tuple[str, ...]:
    raw = params.get("speculative.types")
    if not isinstance(raw, str):
        return ()
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _spec_type(kinds: tuple[str, ...]) -> str | None:
    return ",".join(kind for kind in kinds if kind != "none") or None


def parse_props(data: Any) -> PropsInfo:
    """`GET /props` → PropsInfo. Unknown or missing fields become None / defaults."""
    props = as_dict(data)
    settings = as_dict(props.get("default_generation_settings"))
    ftype = as_str(props.get("model_ftype"))
    return PropsInfo(
        model_path=as_str(props.get("model_path")),
        model_alias=as_str(props.get("model_alias")),
        model_ftype=ftype,
        quantization=normalize_quant_name(ftype),
        n_ctx=as_int(settings.get("n_ctx")),
        total_slots=as_int(props.get("total_slots")),
        build_info=as_str(props.get("build_info")),
        endpoint_slots=as_bool(props.get("endpoint_slots"), default=True),
        endpoint_metrics=as_bool(props.get("endpoint_metrics"), default=False),
        is_sleeping=as_bool(props.get("is_sleeping")),
        speculative_types=_speculative_types(as_dict(settings.get("params"))),
    )


def parse_slots(data: Any) -> tuple[SlotReading, ...]:
    """`GET /slots` → one SlotReading per slot. Text fields (`prompt`, `generated`) are never read."""
    if not isinstance(data, list):
        return ()
    slots: list[SlotReading] = []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            continue
        next_tokens = entry.get("next_token")
        first = as_dict(next_tokens[0]) if isinstance(next_tokens, list) and next_tokens else {}
        slot_id = as_int(entry.get("id"))
        slots.append(
            SlotReading(
                slot_id=slot_id if slot_id is not None else index,
                is_processing=as_bool(entry.get("is_processing")),
                task_id=as_int(entry.get("id_task")),
                n_decoded=as_int(first.get("n_decoded")),
                context_tokens=as_int(entry.get("n_prompt_tokens")),
                prompt_tokens_processed=as_int(entry.get("n_prompt_tokens_processed")),
                prompt_tokens_cached=as_int(entry.get("n_prompt_tokens_cache")),
                n_ctx=as_int(entry.get("n_ctx")),
                speculative=as_bool(entry.get("speculative")),
                spec_type=_spec_type(_speculative_types(as_dict(entry.get("params")))),
            )
        )
    return tuple(slots)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def parse_metrics(text: str, headers: Mapping[str, str] | None = None) -> CounterReading:
    """`GET /metrics` (Prometheus text, `%g` numbers) → counters; gauges are averages we don't use."""
    samples = promtext.parse(text)

    def value(name: str) -> float | None:
        return promtext.first(samples, f"llamacpp:{name}")

    start_s: float | None = None
    raw_start = _header(headers, "Process-Start-Time-Unix")
    if raw_start:
        try:
            start_s = float(raw_start.strip())
        except ValueError:
            start_s = None
    return CounterReading(
        tokens_predicted_total=value("tokens_predicted_total"),
        tokens_predicted_seconds_total=value("tokens_predicted_seconds_total"),
        prompt_tokens_total=value("prompt_tokens_total"),
        prompt_seconds_total=value("prompt_seconds_total"),
        spec_draft_tokens_total=value("spec_decode_num_draft_tokens_total"),
        spec_accepted_tokens_total=value("spec_decode_num_accepted_tokens_total"),
        spec_drafts_total=value("spec_decode_num_drafts_total"),
        spec_accepted_per_position=_per_position(
            samples, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        ),
        requests_running=value("requests_processing"),
        requests_waiting=value("requests_deferred"),
        process_start_s=start_s,
    )


def _per_position(samples: Sequence[promtext.Sample], name: str) -> tuple[float, ...]:
    """A counter labelled `position="0"`, `"1"`, … → its values in position order; () when absent or
    when a position is missing or repeated."""
    by_position: dict[int, float] = {}
    for sample in samples:
        position = sample.labels.get("position", "")
        if sample.name == name and position.isdigit() and not math.isnan(sample.value):
            if int(position) in by_position:
                return ()
            by_position[int(position)] = sample.value
    if sorted(by_position) != list(range(len(by_position))):
        return ()
    return tuple(by_position[i] for i in range(len(by_position)))


def parse_v1_models(data: Any) -> tuple[ModelMeta, ...]:
    """`GET /v1/models` (or `/models`) → the OpenAI `data` list with llama.cpp's `meta`."""
    entries = as_dict(data).get("data")
    if not isinstance(entries, list):
        return ()
    models: list[ModelMeta] = []
    for entry in entries:
        if not isinstance(entry, dict) or not as_str(entry.get("id")):
            continue
        meta = as_dict(entry.get("meta"))
        models.append(
            ModelMeta(
                id=entry["id"],
                size_bytes=as_int(meta.get("size")),
                parameter_count=as_int(meta.get("n_params")),
                n_ctx_train=as_int(meta.get("n_ctx_train")),
                n_ctx=as_int(meta.get("n_ctx")),
                n_vocab=as_int(meta.get("n_vocab")),
                n_embd=as_int(meta.get("n_embd")),
                ftype=as_str(meta.get("ftype")),
            )
        )
    return tuple(models)


def _decode_rate(predicted_n: int | None, rate_tok_s: float | None) -> float | None:
    """The server's decode rate, or None where it measured none: with one generated token its
    eval time is 0 ms and it reports 0.00 tokens per second (not a rate)."""
    if predicted_n is None or predicted_n < 2 or rate_tok_s is None or rate_tok_s <= 0:
        return None
    return rate_tok_s


def parse_timings(
    data: Any,
    *,
    finished_wall_s: float | None = None,
    model: str | None = None,
    source: str = "server",
) -> FinishedRequest | None:
    """A completion response (or its last stream chunk, or a bare `timings` object) → FinishedRequest.

    `prompt_tokens` is the whole prompt (evaluated + cached); `prompt_tok_s` covers
    the evaluated part only, as the server measures it. `prompt_ms` is the
    server-side time to first token (queue time excluded). None when there are no timings.
    Not called by the probe yet: it is for llm-tray's coming recording proxy (#12), which
    will read each finished response's exact timings.
    """
    body = as_dict(data)
    timings = as_dict(body.get("timings")) if "timings" in body else body
    if "predicted_n" not in timings and "prompt_n" not in timings:
        return None
    prompt_n = as_int(timings.get("prompt_n"))
    cache_n = as_int(timings.get("cache_n"))
    predicted_n = as_int(timings.get("predicted_n"))
    prompt_ms = as_float(timings.get("prompt_ms"))
    prompt_tokens = None if prompt_n is None else prompt_n + (cache_n or 0)
    context_tokens = None if prompt_tokens is None else prompt_tokens + (predicted_n or 0)
    return FinishedRequest(
        model=model or as_str(body.get("model")) or "unknown",
        finished_wall_s=time.time() if finished_wall_s is None else finished_wall_s,
        prompt_tokens=prompt_tokens,
        cached_tokens=cache_n,
        decode_tokens=predicted_n,
        prompt_tok_s=as_float(timings.get("prompt_per_second")),
        decode_tok_s=_decode_rate(predicted_n, as_float(timings.get("predicted_per_second"))),
        ttft_s=None if prompt_ms is None else prompt_ms / 1000.0,
        draft_tokens=as_int(timings.get("draft_n")),
        draft_accepted=as_int(timings.get("draft_n_accepted")),
        context_tokens=context_tokens,
        source=source,
    )


# --------------------------------------------------------------------------- the probe
