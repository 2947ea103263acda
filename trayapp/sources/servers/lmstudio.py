"""LM Studio probe: REST `/api/v1/models` (0.4+) or `/api/v0/models`, plus the `lms` CLI.

LM Studio is closed source; shapes follow its docs, the `lms` CLI and the
lmstudio-js SDK types (reference/backends.md §3). The REST API reports what is
loaded but no token counters. Per-request stats for *every* client come from
`lms log stream --source model --filter output --json` (LM Studio ≥ 0.3.26),
once per prediction when it ends; `lms ps --json` (≥ 0.3.27) says whether a
model is generating. Both need the `lms` CLI on this machine; without it the
probe says so in `live_rate_reason`. The CLI's readers and parsers live in
`lms_cli.py` (re-exported here).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from trayapp.core.model import FinishedRequest, ModelFacts, ModelReading, ServerReading
from trayapp.core.modelfacts import facts_from_metadata_estimate
from trayapp.core.overflow import stop_reason_from
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.http import FetchError, UnexpectedAnswer
from trayapp.sources.servers.common import HttpProbe
from trayapp.sources.servers.jsonvals import as_dict, as_float, as_int, as_str
from trayapp.sources.servers.lms_cli import (
    EMBEDDING_TYPES,
    LmsCli,
    find_lms,
    parse_lms_log_line,
    parse_lms_ps,
    parse_params_string,
)

NO_LMS_REASON = (
    "per-request stats need the `lms` CLI (LM Studio ≥ 0.3.26) on this machine; "
    "LM Studio's REST API reports none"
)
REMOTE_REASON = (
    "LM Studio's REST API reports no token counters, and `lms log stream` only reaches a local LM Studio, "
    "so there is no rate for this one (llm-tray's recording proxy is planned)"
)
LMS_REASON = "LM Studio reports stats only when a prediction ends (`lms log stream`); no live token counter"


# --------------------------------------------------------------------------- pure parsing


def _model_list(data: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise UnexpectedAnswer(f"unexpected models shape (no '{key}' list)")
    return [item for item in data[key] if isinstance(item, dict)]


def parse_models_v0(data: Any) -> list[ModelReading]:
    """`GET /api/v0/models` -> the loaded LLMs (state 'loaded'); embedding models are left out.

    `loaded_context_length` is unconfirmed upstream; without it the context is None
    (`max_context_length` is the trained maximum, not the loaded one).
    """
    readings: list[ModelReading] = []
    for item in _model_list(data, "data"):
        name = as_str(item.get("id"))
        if name is None or item.get("state") != "loaded" or item.get("type") in EMBEDDING_TYPES:
            continue
        readings.append(
            ModelReading(
                name=name,
                loaded=True,
                context_length=as_int(item.get("loaded_context_length")),
                quantization=as_str(item.get("quantization")),
                architecture=as_str(item.get("arch")),
            )
        )
    return readings


def _v1_entries(data: Any) -> list[tuple[ModelReading, int | None]]:
    entries: list[tuple[ModelReading, int | None]] = []
    for item in _model_list(data, "models"):
        if item.get("type") in EMBEDDING_TYPES:
            continue
        instances = item.get("loaded_instances")
        key = as_str(item.get("key"))
        total, active = parse_params_string(item.get("params_string"))
        size = as_int(item.get("size_bytes"))
        for instance in instances if isinstance(instances, list) else []:
            if not isinstance(instance, dict):
                continue
            name = as_str(instance.get("id")) or key
            if name is None:
                continue
            reading = ModelReading(
                name=name,
                loaded=True,
                size_bytes=size,
                weights_bytes=size,
                context_length=as_int(as_dict(instance.get("config")).get("context_length")),
                quantization=as_str(as_dict(item.get("quantization")).get("name")),
                parameter_count=total,
                architecture=as_str(item.get("architecture")),
            )
            entries.append((reading, active))
    return entries


def parse_models_v1(data: Any) -> list[ModelReading]:
    """`GET /api/v1/models` (0.4+) -> one reading per loaded instance of an LLM.

    `size_bytes` is the model file's size (weights); LM Studio reports no VRAM use.
    """
    return [reading for reading, _active in _v1_entries(data)]


def _draft_counts(*sources: dict[str, Any]) -> tuple[int | None, int | None]:
    for source in sources:
        total = as_int(source.get("total_draft_tokens_count"))
        if total is not None:
            return total, as_int(source.get("accepted_draft_tokens_count"))
    return None, None


def parse_chat_stats(data: Any, finished_wall_s: float | None = None) -> FinishedRequest:
    """A `/api/v0/chat/completions` (or `/completions`) or `/api/v1/chat` response -> its stats.

    Draft counts are read from `stats` (documented, 0.3.10) or `usage` (recent builds).
    Without `finished_wall_s`, the finish time is `created` + TTFT + generation time.
    No text is kept. UnexpectedAnswer when the body has no stats or no usable time.
    Not called by the probe yet: it is for llm-tray's coming recording proxy (#12), which
    will read each finished response's exact stats.
    """
    if not isinstance(data, dict) or not isinstance(data.get("stats"), dict):
        raise UnexpectedAnswer("no 'stats' object (not an LM Studio native API response)")
    stats = data["stats"]
    usage = as_dict(data.get("usage"))
    ttft = as_float(stats.get("time_to_first_token"))
    if ttft is None:
        ttft = as_float(stats.get("time_to_first_token_seconds"))
    if finished_wall_s is None:
        created = as_float(data.get("created"))
        if created is None:
            raise UnexpectedAnswer("no 'created' time; pass finished_wall_s")
        finished_wall_s = created + (ttft or 0.0) + (as_float(stats.get("generation_time")) or 0.0)
    prompt = as_int(usage.get("prompt_tokens"))
    if prompt is None:
        prompt = as_int(stats.get("input_tokens"))
    decoded = as_int(usage.get("completion_tokens"))
    if decoded is None:
        decoded = as_int(stats.get("total_output_tokens"))
    draft_total, draft_accepted = _draft_counts(stats, usage)
    return FinishedRequest(
        model=as_str(data.get("model")) or as_str(data.get("model_instance_id")) or "",
        finished_wall_s=finished_wall_s,
        prompt_tokens=prompt,
        decode_tokens=decoded,
        decode_tok_s=as_float(stats.get("tokens_per_second")),
        ttft_s=ttft,
        load_s=as_float(stats.get("model_load_time_seconds")),
        draft_tokens=draft_total,
        draft_accepted=draft_accepted,
        context_tokens=prompt + decoded if prompt is not None and decoded is not None else None,
        source="lmstudio-api",
        stop_reason=stop_reason_from(stats.get("stop_reason")),
    )


# --------------------------------------------------------------------------- probe


class LmStudioProbe(HttpProbe):
    """Polls one LM Studio server (the `HttpProbe` skeleton maps failures, times and logs).

    With the `lms` CLI, finished requests ride on every reading, whatever the
    REST status: none is lost while the REST port fails.
    """

    kind = "lmstudio"

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        api_key: str | None = None,
        facts_loader: ModelFactsLoader | None = None,
        lms_path: str | None = None,
        use_lms: bool = True,
        ps_interval_s: float = 3.0,
        lms_backoff_s: float = 1.0,
    ) -> None:
        super().__init__(url, client=client, api_key=api_key)  # LM Studio ≥ 0.4 API tokens
        self._facts_loader = facts_loader
        self._api: str | None = None  # "v1" or "v0", once known
        self._facts: dict[tuple[str, str | None], ModelFacts | None] = {}
        self._active: dict[str, int] = {}  # active parameters of MoE models ('30B-A3B')
        path = (lms_path or find_lms()) if use_lms and self._local else None
        self._lms = LmsCli(path, ps_interval_s=ps_interval_s, backoff_s=lms_backoff_s) if path else None

    @property
    def lms(self) -> LmsCli | None:
        return self._lms

    def _release(self) -> None:
        if self._lms is not None:
            self._lms.stop()
        super()._release()

    def _models(self) -> list[ModelReading]:
        if self._api != "v0":
            try:
                entries = _v1_entries(self._fetch_json("/api/v1/models"))
                self._api = "v1"
                self._active = {reading.name: active for reading, active in entries if active}
                return [reading for reading, _active in entries]
            except FetchError as exc:
                if self._api == "v1" or exc.http_status not in (404, 405):
                    raise
        models = parse_models_v0(self._fetch_json("/api/v0/models"))
        self._api = "v0"
        return models

    def _poll(self, now_mono_s: float) -> ServerReading:
        lms = self._lms
        if lms is None:
            return self._rest_reading()
        try:
            reading = self._rest_reading()
        except (FetchError, UnexpectedAnswer) as exc:
            reading = self._failure_reading(exc)
        # `lms` may launch LM Studio: run it only while LM Studio answers.
        lms.set_enabled(reading.status == "ok")
        if reading.status == "ok":
            lms.start()
        # `lms` names models as REST v1 does ("qwen/qwen3-30b-a3b"); a v0 server lists "qwen3-30b-a3b".
        listed = {_without_publisher(m.name): m.name for m in reading.models}
        finished = [replace(f, model=listed.get(_without_publisher(f.model), f.model)) for f in lms.drain()]
        return replace(reading, finished=tuple(finished))

    def _rest_reading(self) -> ServerReading:
        models = self._models()
        ps = _by_name(self._lms.latest_ps() or []) if self._lms is not None else {}
        reason = LMS_REASON if self._lms is not None else NO_LMS_REASON if self._local else REMOTE_REASON
        readings: list[ModelReading] = []
        for model in models:
            seen = ps.get(model.name)
            if seen is not None:
                model = replace(
                    model,
                    busy=seen.busy,
                    queued_requests=seen.queued_requests,
                    model_path=seen.model_path,
                    context_length=model.context_length or seen.context_length,
                    size_bytes=model.size_bytes or seen.size_bytes,
                    weights_bytes=model.weights_bytes or seen.weights_bytes,
                    parameter_count=model.parameter_count or seen.parameter_count,
                )
            facts = self._facts_for(model)
            if facts is not None:
                model = replace(model, facts=facts)
            readings.append(replace(model, live_rate_reason=reason))
        runtime = self._lms.latest_runtime() if self._lms is not None else None  # the build (#22)
        return ServerReading(self.kind, self.url, "ok", version=runtime, models=tuple(readings))

    def _facts_for(self, model: ModelReading) -> ModelFacts | None:
        """Exact facts once the local model file has been read (off the poll thread), else an estimate."""
        local = _local_model_file(model.model_path)
        if local is not None and self._facts_loader is not None:
            exact = self._facts_loader.get(local)
            if exact is not None:
                return exact
        key = (model.name, model.model_path)
        if key in self._facts:
            return self._facts[key]
        metadata = {"general.architecture": model.architecture} if model.architecture else {}
        facts = facts_from_metadata_estimate(
            metadata,
            model.parameter_count,
            model.quantization,
            size_bytes=model.weights_bytes,
            active_parameter_count=self._active.get(model.name),
            source="lmstudio-estimate",
        )
        # Only cache once something is known: the size may arrive with a later `lms ps`.
        if facts is not None:
            self._facts[key] = facts
        return facts


def _local_model_file(path: str | None) -> str | None:
    """`lms ps` paths are relative to LM Studio's models folder; find the file when it is here."""
    if not path:
        return None
    candidates = [Path(path)] if os.path.isabs(path) else []
    home = Path.home()
    candidates += [home / ".lmstudio" / "models" / path, home / ".cache" / "lm-studio" / "models" / path]
    for candidate in candidates:
        if candidate.is_file() and candidate.suffix.lower() == ".gguf":
            return str(candidate)
    return None


def _without_publisher(name: str) -> str:
    """ "qwen/qwen3-30b-a3b" → "qwen3-30b-a3b": REST v0 ids have no publisher prefix."""
    return name.rsplit("/", 1)[-1]


def _by_name(models: list[ModelReading]) -> dict[str, ModelReading]:
    """`lms ps` entries by their name and by the name without the publisher (REST v0 ids)."""
    index: dict[str, ModelReading] = {}
    for model in models:
        index.setdefault(model.name, model)
        index.setdefault(_without_publisher(model.name), model)
    return index


__all__ = [
    "LMS_REASON",
    "NO_LMS_REASON",
    "REMOTE_REASON",
    "LmStudioProbe",
    "LmsCli",
    "find_lms",
    "parse_chat_stats",
    "parse_lms_log_line",
    "parse_lms_ps",
    "parse_models_v0",
    "parse_models_v1",
    "parse_params_string",
]
