"""LM Studio probe: REST `/api/v1/models` (0.4+) or `/api/v0/models`, plus the `lms` CLI.

LM Studio is closed source; shapes follow its docs, the `lms` CLI and the
lmstudio-js SDK types (reference/backends.md §3). The REST API reports what is
loaded but no token counters. Per-request stats for *every* client come from
`lms log stream --source model --filter output --json` (LM Studio ≥ 0.3.26),
once per prediction when it ends; `lms ps --json` (≥ 0.3.27) says whether a
model is generating. Both need the `lms` CLI on this machine; without it the
probe says so in `live_rate_reason`.

Privacy: `lms log stream` lines carry the prompt and the completion. They
are parsed and dropped at once; only numbers are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from trayapp.adapters.facts_loader import ModelFactsLoader
from trayapp.adapters.http import FetchError
from trayapp.adapters.servers.common import HttpProbe
from trayapp.adapters.servers.jsonvals import as_dict, as_float, as_int, as_str
from trayapp.adapters.servers.ollama import parse_parameter_size
from trayapp.core.model import FinishedRequest, ModelFacts, ModelReading, ServerReading
from trayapp.core.modelfacts import facts_from_metadata_estimate

NO_LMS_REASON = (
    "per-request stats need the `lms` CLI (LM Studio ≥ 0.3.26) on this machine; "
    "LM Studio's REST API reports none"
)
REMOTE_REASON = (
    "LM Studio's REST API reports no token counters, and `lms log stream` only reaches a local LM Studio, "
    "so there is no rate for this one (llm-tray's recording proxy is planned)"
)
LMS_REASON = "LM Studio reports stats only when a prediction ends (`lms log stream`); no live token counter"
BUSY_STATUSES = ("generating", "processingPrompt")
EMBEDDING_TYPES = ("embedding", "embeddings")
MAX_QUEUED = 1000  # finished requests kept between two polls


# --------------------------------------------------------------------------- pure parsing


def parse_params_string(text: object) -> tuple[int | None, int | None]:
    """LM Studio `params_string` -> (total, active): '30B-A3B' -> (30e9, 3e9), '8B' -> (8e9, None)."""
    if not isinstance(text, str):
        return None, None
    total_text, _, active_text = text.partition("-")
    total = parse_parameter_size(total_text)
    active = None
    if active_text[:1].upper() == "A":
        active = parse_parameter_size(active_text[1:])
    return total, active


def _model_list(data: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ValueError(f"unexpected models shape (no '{key}' list)")
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


def parse_lms_ps(data: Any) -> list[ModelReading]:
    """`lms ps --json` -> loaded LLMs with `busy` from `status` (generating / processingPrompt).

    `status` is absent before lms 0.3.27; then `busy` is None.
    """
    if not isinstance(data, list):
        raise ValueError("unexpected `lms ps --json` shape (not a list)")
    readings: list[ModelReading] = []
    for item in data:
        if not isinstance(item, dict) or item.get("type") in EMBEDDING_TYPES:
            continue
        name = as_str(item.get("identifier")) or as_str(item.get("modelKey"))
        if name is None:
            continue
        status = as_str(item.get("status"))
        total, _active = parse_params_string(item.get("paramsString"))
        readings.append(
            ModelReading(
                name=name,
                loaded=True,
                size_bytes=as_int(item.get("sizeBytes")),
                weights_bytes=as_int(item.get("sizeBytes")),
                context_length=as_int(item.get("contextLength")),
                quantization=as_str(as_dict(item.get("quantization")).get("name")),
                parameter_count=total,
                architecture=as_str(item.get("architecture")),
                model_path=as_str(item.get("path")),
                busy=None if status is None else status in BUSY_STATUSES,
            )
        )
    return readings


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
    No text is kept. ValueError when the body has no stats or no usable time.
    Not called by the probe yet: it is for llm-tray's coming recording proxy (#12), which
    will read each finished response's exact stats.
    """
    if not isinstance(data, dict) or not isinstance(data.get("stats"), dict):
        raise ValueError("no 'stats' object (not an LM Studio native API response)")
    stats = data["stats"]
    usage = as_dict(data.get("usage"))
    ttft = as_float(stats.get("time_to_first_token"))
    if ttft is None:
        ttft = as_float(stats.get("time_to_first_token_seconds"))
    if finished_wall_s is None:
        created = as_float(data.get("created"))
        if created is None:
            raise ValueError("no 'created' time; pass finished_wall_s")
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
    )


def parse_lms_log_line(line: str | bytes) -> FinishedRequest | None:
    """One `lms log stream --json` line -> a FinishedRequest for `llm.prediction.output` events with stats.

    Everything else (input events, server/runtime logs, garbage) gives None. The
    `input`/`output` text is never copied out of the parsed event.
    """
    try:
        event = json.loads(line)
    except ValueError:
        return None
    data = as_dict(event.get("data")) if isinstance(event, dict) else {}
    if data.get("type") != "llm.prediction.output" or not isinstance(data.get("stats"), dict):
        return None
    stats = data["stats"]
    timestamp_ms = as_float(event.get("timestamp"))
    prompt = as_int(stats.get("promptTokensCount"))
    decoded = as_int(stats.get("predictedTokensCount"))
    total = as_int(stats.get("totalTokensCount"))
    if total is None and prompt is not None and decoded is not None:
        total = prompt + decoded
    return FinishedRequest(
        model=as_str(data.get("modelIdentifier")) or "",
        finished_wall_s=timestamp_ms / 1000.0 if timestamp_ms is not None else time.time(),
        prompt_tokens=prompt,
        decode_tokens=decoded,
        decode_tok_s=as_float(stats.get("tokensPerSecond")),
        ttft_s=as_float(stats.get("timeToFirstTokenSec")),
        draft_tokens=as_int(stats.get("totalDraftTokensCount")),
        draft_accepted=as_int(stats.get("acceptedDraftTokensCount")),
        context_tokens=total,
        source="lms-log",
    )


# --------------------------------------------------------------------------- the lms CLI


def find_lms() -> str | None:
    """The `lms` CLI: on PATH, or where LM Studio installs it (~/.lmstudio/bin)."""
    found = shutil.which("lms")
    if found:
        return found
    candidate = Path.home() / ".lmstudio" / "bin" / ("lms.exe" if os.name == "nt" else "lms")
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


class LmsCli:
    """Background readers of `lms log stream` (restarted with backoff) and `lms ps --json`."""

    STREAM_ARGS = ("log", "stream", "--source", "model", "--filter", "output", "--json")

    def __init__(
        self,
        lms_path: str,
        *,
        ps_interval_s: float = 3.0,
        ps_timeout_s: float = 5.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
    ) -> None:
        self.lms_path = lms_path
        self.ps_interval_s = ps_interval_s
        self.ps_timeout_s = ps_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.finished: queue.Queue[FinishedRequest] = queue.Queue(maxsize=MAX_QUEUED)
        self.stream_starts = 0
        self._stop = threading.Event()
        self._enabled = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ps: list[ModelReading] | None = None
        self._ps_at: float | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._stream_loop, "lms-log"), (self._ps_loop, "lms-ps")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def set_enabled(self, enabled: bool) -> None:
        """Run `lms` only while LM Studio answers: `lms` may launch LM Studio when it is not running."""
        if enabled:
            self._enabled.set()
        else:
            self._enabled.clear()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._enabled.set()  # wake the loops so they see the stop
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the reader thread sees EOF, reaps it and closes the pipe
        for thread in self._threads:
            thread.join(timeout_s)
        if proc is not None and proc.poll() is None:  # it ignored SIGTERM
            proc.kill()
            for thread in self._threads:
                thread.join(timeout_s)

    @property
    def stream_pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def latest_ps(self) -> list[ModelReading] | None:
        """The last `lms ps` result, unless it is older than a few intervals (lms hung or gone)."""
        with self._lock:
            age_s = time.monotonic() - self._ps_at if self._ps_at is not None else None
            if age_s is None or age_s > 3 * self.ps_interval_s + self.ps_timeout_s:
                return None
            return self._ps

    def drain(self) -> tuple[FinishedRequest, ...]:
        records: list[FinishedRequest] = []
        while True:
            try:
                records.append(self.finished.get_nowait())
            except queue.Empty:
                return tuple(records)

    def _stream_loop(self) -> None:
        backoff = self.backoff_s
        while not self._stop.is_set():
            self._enabled.wait()
            if self._stop.is_set():
                return
            started = time.monotonic()
            self._read_stream()
            if time.monotonic() - started > 10 * backoff:
                backoff = self.backoff_s  # it ran a good while: restart promptly
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _read_stream(self) -> None:
        try:
            proc = subprocess.Popen(
                [self.lms_path, *self.STREAM_ARGS],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return
        with self._lock:
            self._proc = proc
            self.stream_starts += 1
        try:
            if not self._stop.is_set():
                assert proc.stdout is not None
                for line in proc.stdout:
                    record = parse_lms_log_line(line)
                    del line  # the prompt / completion text is in here, and nowhere else
                    if record is not None:
                        self._put(record)
        except (OSError, ValueError):
            pass  # the pipe broke: restart
        finally:
            _end_process(proc)
            with self._lock:
                self._proc = None

    def _put(self, record: FinishedRequest) -> None:
        while True:
            try:
                self.finished.put_nowait(record)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.finished.get_nowait()  # drop the oldest

    def _ps_loop(self) -> None:
        while not self._stop.is_set():
            self._enabled.wait()
            if self._stop.is_set():
                return
            readings: list[ModelReading] | None
            try:
                done = subprocess.run(
                    [self.lms_path, "ps", "--json"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=self.ps_timeout_s,
                    check=False,
                )
                readings = parse_lms_ps(json.loads(done.stdout)) if done.returncode == 0 else None
            except (OSError, subprocess.SubprocessError, ValueError):
                readings = None
            if readings is not None:
                with self._lock:
                    self._ps = readings
                    self._ps_at = time.monotonic()
            self._stop.wait(self.ps_interval_s)


def _end_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)
    if proc.stdout is not None:
        proc.stdout.close()


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

    def close(self) -> None:
        if self._lms is not None:
            self._lms.stop()
        super().close()

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
        except (FetchError, ValueError) as exc:
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
        return ServerReading(self.kind, self.url, "ok", models=tuple(readings))

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
