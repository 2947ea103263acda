"""Probes for OpenAI-compatible servers: vLLM, SGLang (Prometheus `/metrics`), MLX-LM, generic.

vLLM (`/metrics` always on) and SGLang (`/metrics` with `--enable-metrics`)
expose cumulative token counters; the pipeline turns their deltas into rates.
Metric names follow vLLM v0.11–0.12 `vllm/v1/metrics/loggers.py` and SGLang
`python/sglang/srt/metrics/collector.py` (reference/backends.md §4). MLX-LM
and a generic OpenAI-compatible server report no timings at all (§5): the
probes say so instead of inventing a rate, and a recording proxy in front of
them gives the live rate (core/proxied_streams.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import httpx

from trayapp.core.model import CounterReading, ModelReading, ServerReading
from trayapp.sources import promtext
from trayapp.sources.http import FetchError, UnexpectedAnswer
from trayapp.sources.processes import CpuActivity, mlx_served_model
from trayapp.sources.promtext import Sample
from trayapp.sources.servers.common import HttpProbe
from trayapp.sources.servers.jsonvals import as_dict, as_int

MODELS_REFRESH_S = 30.0
MLX_LIST_POSTPONE_MAX_S = 300.0  # a working MLX-LM's model list waits at most this long

MLX_REASON = (
    "MLX-LM reports no timings or counters: a live rate needs llm-tray's recording proxy in front of it "
    "(estimated from the tokens it streams)"
)
MLX_WHICH_UNKNOWN = "; MLX-LM lists every cached model, so which one is loaded is unknown"
OPENAI_REASON = (
    "a generic OpenAI-compatible server reports no token counters (only /v1/models): a live rate "
    "needs llm-tray's recording proxy in front of it (estimated from the tokens it streams)"
)
SGLANG_NO_METRICS_REASON = "SGLang serves no /metrics: start it with --enable-metrics for token counters"


# --------------------------------------------------------------------------- pure parsing


def _select(samples: Iterable[Sample], model_name: str | None) -> list[Sample]:
    if model_name is None:
        return list(samples)
    return [s for s in samples if s.labels.get("model_name") in (None, model_name)]


def metrics_model_names(text: str) -> list[str]:
    """Distinct `model_name` label values, in order of appearance."""
    names: list[str] = []
    for sample in promtext.parse(text):
        name = sample.labels.get("model_name")
        if name and name not in names:
            names.append(name)
    return names


def _vllm_counters(samples: Sequence[Sample]) -> CounterReading:
    t = promtext.total
    kv = t(samples, "vllm:kv_cache_usage_perc")
    if kv is None:
        kv = t(samples, "vllm:gpu_cache_usage_perc")  # removed in newer releases
    return CounterReading(
        tokens_predicted_total=t(samples, "vllm:generation_tokens_total"),
        tokens_predicted_seconds_total=t(samples, "vllm:request_decode_time_seconds_sum"),
        prompt_tokens_total=t(samples, "vllm:prompt_tokens_total"),
        prompt_seconds_total=t(samples, "vllm:request_prefill_time_seconds_sum"),
        requests_total=t(samples, "vllm:request_success_total"),
        spec_draft_tokens_total=t(samples, "vllm:spec_decode_num_draft_tokens_total"),
        spec_accepted_tokens_total=t(samples, "vllm:spec_decode_num_accepted_tokens_total"),
        spec_drafts_total=t(samples, "vllm:spec_decode_num_drafts_total"),
        requests_running=t(samples, "vllm:num_requests_running"),
        requests_waiting=t(samples, "vllm:num_requests_waiting"),
        kv_usage_ratio=kv,
        ttft_sum_s=t(samples, "vllm:time_to_first_token_seconds_sum"),
        ttft_count=t(samples, "vllm:time_to_first_token_seconds_count"),
    )


def parse_vllm_metrics(text: str, model_name: str | None = None) -> CounterReading:
    """vLLM `/metrics` -> counters (summed over engines; only `model_name` when given).

    Decode/prefill seconds are the sums of the per-request phase histograms.
    """
    return _vllm_counters(_select(promtext.parse(text), model_name))


def _sglang_counters(samples: Sequence[Sample]) -> CounterReading:
    t = promtext.total
    # The acceptance gauges read 0 when speculative decoding is off; a mean accepted length
    # above 0 says it is on (it is 1 + accepted drafts per step).
    accept_length = promtext.first(samples, "sglang:spec_accept_length")
    accept_rate = promtext.first(samples, "sglang:spec_accept_rate") if accept_length else None
    return CounterReading(
        spec_accept_rate=accept_rate,
        tokens_predicted_total=t(samples, "sglang:generation_tokens_total"),
        prompt_tokens_total=t(samples, "sglang:prompt_tokens_total"),
        requests_total=t(samples, "sglang:num_requests_total"),
        requests_running=t(samples, "sglang:num_running_reqs"),
        requests_waiting=t(samples, "sglang:num_queue_reqs"),
        kv_usage_ratio=t(samples, "sglang:token_usage"),
        ttft_sum_s=t(samples, "sglang:time_to_first_token_seconds_sum"),
        ttft_count=t(samples, "sglang:time_to_first_token_seconds_count"),
    )


def parse_sglang_metrics(text: str, model_name: str | None = None) -> CounterReading:
    """SGLang `/metrics` -> counters. `token_usage` (KV pool fill) becomes `kv_usage_ratio`."""
    return _sglang_counters(_select(promtext.parse(text), model_name))


def parse_openai_models(data: Any) -> list[ModelReading]:
    """`GET /v1/models` -> one reading per listed model, with the context length where the server gives it.

    vLLM/SGLang put it in `max_model_len`, llama-server in `meta.n_ctx`, others in `context_length`.
    """
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise UnexpectedAnswer("unexpected /v1/models shape (no 'data' list)")
    readings: list[ModelReading] = []
    for item in data["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            continue
        meta = as_dict(item.get("meta"))
        context = as_int(item.get("max_model_len")) or as_int(item.get("context_length"))
        context = context or as_int(meta.get("n_ctx"))
        readings.append(ModelReading(name=item["id"], loaded=True, context_length=context))
    return readings


def parse_version_body(data: Any) -> str | None:
    """`GET /version` (vLLM, SGLang) -> '0.11.0'."""
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return str(data["version"])
    return None


# --------------------------------------------------------------------------- probes


class _MetricsProbe(HttpProbe):
    """vLLM / SGLang: `/metrics` every poll, `/v1/models` and `/version` now and then."""

    prefix = ""
    no_metrics_reason: str | None = None

    def __init__(self, url: str, *, client: httpx.Client | None = None, api_key: str | None = None) -> None:
        super().__init__(url, client=client, api_key=api_key)
        self._listed: list[ModelReading] | None = None
        self._listed_at: float | None = None
        self._version: str | None = None

    def _counters(self, samples: Sequence[Sample]) -> CounterReading:  # pragma: no cover - overridden
        raise NotImplementedError

    def _refresh_models(self, now: float, force: bool = False) -> None:
        if not force and self._listed is not None:
            return
        if not force and self._listed_at is not None and now - self._listed_at < MODELS_REFRESH_S:
            return
        self._listed_at = now
        try:
            self._listed = parse_openai_models(self._fetch_json("/v1/models"))
        except (FetchError, UnexpectedAnswer):
            if force:
                raise
            return
        try:
            self._version = parse_version_body(self._fetch_json("/version"))
        except (FetchError, UnexpectedAnswer):
            self._version = None

    def _poll(self, now: float) -> ServerReading:
        try:
            text = self._fetch("/metrics").text
        except FetchError as exc:
            if exc.http_status != 404 or self.no_metrics_reason is None:
                self._listed = None  # it may come back with another model
                raise
            self._refresh_models(now, force=True)  # is it up at all?
            listed = tuple(replace(m, live_rate_reason=self.no_metrics_reason) for m in self._listed or [])
            pid = self._server_pid(now)
            return ServerReading(self.kind, self.url, "ok", version=self._version, models=listed, pid=pid)
        self._refresh_models(now)
        samples = [s for s in promtext.parse(text) if s.name.startswith(self.prefix)]
        if not samples:
            raise UnexpectedAnswer(f"/metrics has no {self.prefix}* metrics (is this really {self.kind}?)")
        contexts = {m.name: m.context_length for m in self._listed or []}
        names = [n for n in dict.fromkeys(s.labels.get("model_name") for s in samples) if n]
        if not names:
            names = [m.name for m in self._listed or []][:1] or [self.kind]
        multi = len(names) > 1
        models: list[ModelReading] = []
        for name in names:
            counters = self._counters(_select(samples, name) if multi else samples)
            running = counters.requests_running
            models.append(
                ModelReading(
                    name=name,
                    loaded=True,
                    context_length=contexts.get(name),
                    counters=counters,
                    busy=None if running is None else running > 0,
                )
            )
        return ServerReading(
            self.kind, self.url, "ok", version=self._version, models=tuple(models), pid=self._server_pid(now)
        )


class VllmProbe(_MetricsProbe):
    """vLLM: rates from `vllm:*_tokens_total` counter deltas; `/metrics` needs no flag."""

    kind = "vllm"
    prefix = "vllm:"

    def _counters(self, samples: Sequence[Sample]) -> CounterReading:
        return _vllm_counters(samples)


class SglangProbe(_MetricsProbe):
    """SGLang: rates from `sglang:*_tokens_total` counter deltas (needs `--enable-metrics`)."""

    kind = "sglang"
    prefix = "sglang:"
    no_metrics_reason = SGLANG_NO_METRICS_REASON

    def _counters(self, samples: Sequence[Sample]) -> CounterReading:
        return _sglang_counters(samples)


class OpenAiProbe(HttpProbe):
    """Any OpenAI-compatible server: `/v1/models` only; no live rate."""

    kind = "openai"
    reason = OPENAI_REASON

    def _poll(self, now: float) -> ServerReading:
        models = parse_openai_models(self._fetch_json("/v1/models"))
        return ServerReading(
            self.kind,
            self.url,
            "ok",
            models=tuple(replace(m, live_rate_reason=self.reason) for m in models),
            pid=self._server_pid(now),
        )


class MlxProbe(HttpProbe):
    """`mlx_lm.server`: `/health` every poll, `/v1/models` now and then; no timings at all.

    What the real server does (mlx-lm 0.32.2, `tests/fixtures/mlx/`): it is Python's
    `ThreadingHTTPServer` speaking HTTP/1.0 (one connection per request, each answered on a thread
    of its own beside the generation thread, so a poll never waits for a generation, nor it for a
    poll). `/v1/models` lists every MLX model in the Hugging Face cache, plus the `--model` folder by
    its resolved path; on a machine with no cache folder it answers 200 with an **empty body** (the
    handler dies after the headers). So the served model is also read from the process's own
    `--model` (local servers, psutil): it is the one marked loaded, the cache's others are not;
    with neither, a single listed model is taken as the served one. The model list walks the whole
    cache on the server's threads (Python, sharing the interpreter lock with the generation): it is
    asked at the first poll, then every `MODELS_REFRESH_S` while the local server's process is idle
    (its CPU time, read without asking the server), and while it works at most every
    `MLX_LIST_POSTPONE_MAX_S`.
    """

    kind = "mlx"

    def __init__(self, url: str, *, client: httpx.Client | None = None, api_key: str | None = None) -> None:
        super().__init__(url, client=client, api_key=api_key)
        self._listed: list[ModelReading] = []
        self._listed_at: float | None = None
        self._served: tuple[int, str | None] | None = None  # (pid, its --model as /v1/models names it)
        self._activity = CpuActivity()

    def _poll(self, now: float) -> ServerReading:
        health = self._fetch_json("/health")
        if not isinstance(health, dict) or health.get("status") != "ok":
            raise UnexpectedAnswer("/health did not say ok")
        pid = self._server_pid(now)
        working = self._activity.worked(pid, now)
        since = None if self._listed_at is None else now - self._listed_at
        due = since is None or since >= (MLX_LIST_POSTPONE_MAX_S if working else MODELS_REFRESH_S)
        if due:
            self._listed_at = now
            try:
                self._listed = parse_openai_models(self._fetch_json("/v1/models"))
            except (FetchError, UnexpectedAnswer):  # an empty body: no Hugging Face cache folder
                self._listed = []
        if pid is not None and (self._served is None or self._served[0] != pid):
            self._served = (pid, mlx_served_model(pid))
        served = self._served[1] if self._served is not None and self._served[0] == pid else None
        return ServerReading(self.kind, self.url, "ok", models=mlx_models(self._listed, served), pid=pid)


def mlx_models(listed: Sequence[ModelReading], served: str | None) -> tuple[ModelReading, ...]:
    """MLX-LM's models: `listed` by `/v1/models` (maybe none), `served` the process's `--model`.

    The served one is loaded (added when the list lacks it); the others are cached, not loaded.
    Without `served`, one listed model is the served one; of several, which is loaded is unknown
    (each is called loaded, the reason says so).
    """
    several_unknown = served is None and len(listed) > 1
    reason = MLX_REASON + (MLX_WHICH_UNKNOWN if several_unknown else "")
    models = [replace(m, loaded=served is None or m.name == served, live_rate_reason=reason) for m in listed]
    if served is not None and all(m.name != served for m in listed):
        path = served if served.startswith("/") else None  # a folder (resolved), not a repo id
        models.insert(0, ModelReading(name=served, loaded=True, model_path=path, live_rate_reason=reason))
    return tuple(models)


__all__ = [
    "MlxProbe",
    "OpenAiProbe",
    "SglangProbe",
    "VllmProbe",
    "metrics_model_names",
    "mlx_models",
    "parse_openai_models",
    "parse_sglang_metrics",
    "parse_version_body",
    "parse_vllm_metrics",
]
