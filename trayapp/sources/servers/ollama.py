"""Ollama probe: `/api/version`, `/api/ps`, `/api/show`, and the llama-server child's `/slots`.

Shapes follow ollama/ollama v0.32.15 (reference/backends.md §1). Ollama itself
exposes no live token counters. Since v0.30 it runs one upstream
`llama-server` child per loaded GGUF model on a random loopback port; when the
monitor runs on the same machine we find that child with psutil and read its
`/slots` (live `n_decoded`) — an undocumented detail, so absence is expected
and reported as `live_rate_reason`.

Note: `/api/ps` `digest` is the *manifest* digest, while the child's
`--model` is the GGUF *blob* (`.../blobs/sha256-<hex>`). `/api/show`'s
`modelfile` names that blob in its `FROM` line, which is how children are
matched to models (with a one-model/one-child fallback).

Silent prompt truncation (#20): Ollama cuts a prompt longer than `num_ctx`, answers HTTP 200 and
says so only in its server log. For a local Ollama the probe reads that log
(`trayapp/sources/ollama_log.py`, docs/ollama-log.md) and reports each `truncating input prompt`
warning as a `FinishedRequest` (`truncation_record`, source "ollama-log"). Where the log cannot be read
(or the server runs on another machine), each model's `unseen_cuts_reason` says why, and the views
note that its prompts are cut unseen (`core/text.py` `unseen_cuts_note`) unless a proxy is in front.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import httpx

from trayapp.config.bugs import BugLog
from trayapp.core.model import FinishedRequest, ModelFacts, ModelReading, ServerReading
from trayapp.core.modelfacts import facts_from_metadata_estimate
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.http import FetchError, UnexpectedAnswer, fetch, make_client
from trayapp.sources.ollama_log import OllamaLogReader, TruncationLine, attribute_truncation, log_location
from trayapp.sources.processes import ChildServer, find_ollama_children
from trayapp.sources.servers.common import HttpProbe
from trayapp.sources.servers.jsonvals import as_dict, as_int, as_str
from trayapp.sources.servers.llamacpp_parse import parse_slots

NO_CHILD_REASON = (
    "Ollama exposes no live token counters; no llama-server child found (Ollama < 0.30 or different engine)"
)
REMOTE_REASON = (
    "Ollama exposes no live token counters, and its llama-server child runs on another machine, "
    "so there is no live rate (llm-tray's recording proxy is planned)"
)
SHOW_RETRY_S = 30.0  # after a failed /api/show
LOG_SOURCE = "ollama-log"  # FinishedRequest.source of a truncation read from Ollama's log
UNKNOWN_MODEL = "unknown"  # FinishedRequest.model when the log's warning fits no single loaded model
CHILD_RESCAN_S = 10.0  # look for children again at most this often while some model has none
# why a prompt a remote Ollama cuts silently goes unseen here (ModelReading.unseen_cuts_reason)
REMOTE_LOG_REASON = "Ollama runs on another machine, so its log is out of reach"
# families whose too-long prompts Ollama refuses (HTTP 400: no context shift, v0.30.9+), not cuts
NO_SHIFT_FAMILIES = frozenset({"deepseek2"})

_SIZE_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
_BLOB_RE = re.compile(r"sha256[-:]([0-9a-f]{64})", re.IGNORECASE)
_FROM_RE = re.compile(r"^FROM\s+(\S.*?)\s*$", re.MULTILINE)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- pure parsing


def parse_parameter_size(text: object) -> int | None:
    """'8.0B' -> 8_000_000_000, '270M' -> 270_000_000, '30.5B' -> 30_500_000_000; None if unparseable."""
    if not isinstance(text, str):
        return None
    match = _SIZE_RE.match(text)
    if not match:
        return None
    return round(float(match.group(1)) * _SIZE_SUFFIX[match.group(2).upper()])


def parse_version(data: Any) -> str | None:
    """`GET /api/version` -> '0.32.15'."""
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return str(data["version"])
    return None


def _ps_entries(data: Any) -> list[tuple[ModelReading, str | None]]:
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise UnexpectedAnswer("unexpected /api/ps shape (no 'models' list)")
    entries: list[tuple[ModelReading, str | None]] = []
    for item in data["models"]:
        if not isinstance(item, dict):
            continue
        name = as_str(item.get("name")) or as_str(item.get("model"))
        if name is None:
            continue
        details = as_dict(item.get("details"))
        reading = ModelReading(
            name=name,
            loaded=True,
            size_bytes=as_int(item.get("size")),
            vram_bytes=as_int(item.get("size_vram")),
            context_length=as_int(item.get("context_length")),
            quantization=as_str(details.get("quantization_level")),
            parameter_count=parse_parameter_size(details.get("parameter_size")),
            architecture=as_str(details.get("family")),
            expires_at=as_str(item.get("expires_at")),
        )
        entries.append((reading, as_str(item.get("digest"))))
    return entries


def parse_ps(data: Any) -> list[ModelReading]:
    """`GET /api/ps` -> one loaded ModelReading per model. UnexpectedAnswer on a wrong shape."""
    return [reading for reading, _digest in _ps_entries(data)]


def parse_ps_digests(data: Any) -> dict[str, str | None]:
    """`GET /api/ps` -> {model name: manifest digest}."""
    return {reading.name: digest for reading, digest in _ps_entries(data)}


def parse_tags_sizes(data: Any) -> dict[str, int]:
    """`GET /api/tags` -> {model name: bytes on disk} (≈ the GGUF weights)."""
    sizes: dict[str, int] = {}
    models = data.get("models") if isinstance(data, dict) else None
    for item in models if isinstance(models, list) else []:
        if isinstance(item, dict) and as_str(item.get("name")) and as_int(item.get("size")):
            sizes[item["name"]] = item["size"]
    return sizes


def parse_show_model_path(data: Any) -> str | None:
    """The GGUF blob path from `/api/show` `modelfile` (its first `FROM` line), or None."""
    modelfile = data.get("modelfile") if isinstance(data, dict) else None
    if not isinstance(modelfile, str):
        return None
    match = _FROM_RE.search(modelfile)
    return match.group(1).strip('"') if match else None


def blob_digest(path: str | None) -> str | None:
    """'…/blobs/sha256-<hex>' -> '<hex>' (lower case), or None."""
    match = _BLOB_RE.search(path or "")
    return match.group(1).lower() if match else None


def parse_show(data: Any, size_bytes: int | None = None) -> ModelFacts | None:
    """`POST /api/show` -> estimated ModelFacts (exact=False: the tensor list is truncated).

    `size_bytes` is the model's size on disk from `/api/tags`, when known.
    """
    if not isinstance(data, dict):
        raise UnexpectedAnswer("unexpected /api/show shape (not an object)")
    info = as_dict(data.get("model_info"))
    details = as_dict(data.get("details"))
    parameter_count = as_int(info.get("general.parameter_count")) or parse_parameter_size(
        details.get("parameter_size")
    )
    quantization = as_str(details.get("quantization_level"))
    return facts_from_metadata_estimate(
        info, parameter_count, quantization, size_bytes=size_bytes, source="ollama-show"
    )


def match_children(
    models: Sequence[tuple[str, str | None, str | None]], children: Sequence[ChildServer]
) -> dict[str, ChildServer]:
    """Pair loaded models `(name, manifest digest, blob path)` with llama-server children.

    A child matches when its `--model` blob digest equals the model's blob (from
    `/api/show`) or, failing that, its manifest digest. With one model and one
    unmatched child left, they are paired.
    """
    matched: dict[str, ChildServer] = {}
    free = [c for c in children if c.port]
    for name, digest, blob_path in models:
        wanted = {d for d in (blob_digest(blob_path), (digest or "").lower() or None) if d}
        for child in free:
            if blob_digest(child.model_path) in wanted or (blob_path and child.model_path == blob_path):
                matched[name] = child
                free.remove(child)
                break
    unmatched = [name for name, _d, _p in models if name not in matched]
    if len(models) == 1 and len(unmatched) == 1 and len(free) == 1:
        matched[unmatched[0]] = free[0]
    return matched


def truncation_record(
    line: TruncationLine,
    loaded: Sequence[tuple[str, int | None]],
    version: str | None,
    now_wall_s: float,
) -> FinishedRequest:
    """A `truncating input prompt` warning as the request record it stands for (counts only).

    `loaded` are the loaded models `(name, /api/ps context_length)` at the poll that read it; the
    model is the one the warning's numbers fit (`attribute_truncation`), else `UNKNOWN_MODEL`.
    `prompt_tokens` is what the model read (`new`, which is also what Ollama reports as
    `prompt_eval_count`), `prompt_tokens_sent` the prompt as sent (`prompt`), both counted by
    Ollama's tokenizer; `context_limit_tokens` the model's `num_ctx`. The time is the line's (when
    Ollama began reading the prompt), else `now_wall_s`. Why the answer ended, the log does not say.
    """
    model, num_ctx = attribute_truncation(line, loaded, version)
    return FinishedRequest(
        model=model or UNKNOWN_MODEL,
        finished_wall_s=line.time_wall_s if line.time_wall_s is not None else now_wall_s,
        prompt_tokens=line.new,
        prompt_tokens_sent=line.prompt,
        prompt_sent_exact=True,
        context_limit_tokens=num_ctx,
        source=LOG_SOURCE,
    )


# --------------------------------------------------------------------------- probe


class OllamaProbe(HttpProbe):
    """Polls one Ollama server (the `HttpProbe` skeleton maps failures, times and logs)."""

    kind = "ollama"

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        api_key: str | None = None,
        facts_loader: ModelFactsLoader | None = None,
        find_children: Callable[[], list[ChildServer]] | None = None,
        ollama_log: str = "auto",
        log_reader: Callable[[], OllamaLogReader] | None = None,
    ) -> None:
        """`ollama_log` is the setting `monitor.ollama_log` ("auto" | "off" | a path; the environment
        variable LLM_TRAY_OLLAMA_LOG wins over it); `log_reader` makes the reader instead (tests)."""
        super().__init__(url, client=client, api_key=api_key)  # a key is for a reverse proxy in front
        self._make_log_reader = log_reader or (lambda: OllamaLogReader(log_location(ollama_log)))
        self._log_reader: OllamaLogReader | None = None  # made at the first poll, for a local server only
        self._log_bugs = BugLog(log)
        self._log_reason_said: str | None = None
        self._log_bug: str | None = None  # a bug reading the log at the last poll ("internal error: …")
        self._facts_loader = facts_loader
        self._find_children = find_children or find_ollama_children
        self._facts: dict[tuple[str, str | None], ModelFacts | None] = {}
        self._blob_paths: dict[tuple[str, str | None], str | None] = {}
        self._show_retry_at: dict[tuple[str, str | None], float] = {}
        self._children: list[ChildServer] = []
        self._children_for: frozenset[tuple[str, str | None]] | None = None
        self._children_scanned_at: float | None = None
        self._rescan = True
        self._child_clients: dict[int, httpx.Client] = {}

    def _release(self) -> None:
        for client in self._child_clients.values():
            client.close()
        self._child_clients.clear()
        super()._release()

    @property
    def log_reason(self) -> str | None:
        """Why truncation warnings cannot be read from Ollama's log now (None while they can, and for
        a server on another machine, whose log is out of reach)."""
        return self._log_reader.reason if self._log_reader is not None else None

    @property
    def unseen_cuts_reason(self) -> str | None:
        """Why a prompt this Ollama cuts silently would go unseen here, as far as its log goes (a
        recording proxy in front sees it all the same: the pipeline knows): the log's `log_reason`,
        a bug reading it, or that the server runs on another machine. None while the log is read."""
        if not self._local:
            return REMOTE_LOG_REASON
        return self._log_bug or self.log_reason

    @property
    def log_where(self) -> str | None:
        """What is read for them: the log file's path, `journalctl -u ollama`, or "nothing"."""
        return self._log_reader.where if self._log_reader is not None else None

    # -- internals

    def _poll(self, now: float) -> ServerReading:
        version = parse_version(self._fetch_json("/api/version"))
        entries = _ps_entries(self._fetch_json("/api/ps"))
        keys = [(reading.name, digest) for reading, digest in entries]
        self._load_facts(keys, now)

        children: dict[str, ChildServer] = {}
        if self._local and entries:
            children = self._match(keys, now)

        models: list[ModelReading] = []
        for reading, digest in entries:
            key = (reading.name, digest)
            facts = self._facts.get(key)
            child = children.get(reading.name)
            if child is not None:
                reading = self._with_child(reading, child)
                exact = self._exact_facts(child.model_path)
                facts = exact or facts
            else:
                reading = replace(reading, live_rate_reason=NO_CHILD_REASON if self._local else REMOTE_REASON)
            if facts is not None:
                reading = replace(reading, facts=facts)
            models.append(reading)

        pid = next((c.parent_pid for c in children.values() if c.parent_pid), None) or self._server_pid(now)
        finished = self._truncations(models, version) if self._local else ()
        unseen = self.unseen_cuts_reason
        if unseen is not None:
            models = [
                m if m.architecture in NO_SHIFT_FAMILIES else replace(m, unseen_cuts_reason=unseen)
                for m in models
            ]
        return ServerReading(
            self.kind, self.url, "ok", version=version, models=tuple(models), finished=finished, pid=pid
        )

    def _truncations(
        self, models: Sequence[ModelReading], version: str | None
    ) -> tuple[FinishedRequest, ...]:
        """The warnings Ollama's log gained since the last poll, as request records (local servers only)."""
        try:  # its own boundary: a bug reading the log must not cost the server's reading
            if self._log_reader is None:
                self._log_reader = self._make_log_reader()
            lines = self._log_reader.poll()
        except Exception as exc:
            self._log_bug = self._log_bugs.report(exc, f"ollama {self.url}: reading its log")
            self._log_reason_said = self._log_bug
            return ()
        self._log_bug = None
        reason = self._log_reader.reason
        if reason != self._log_reason_said:
            self._log_reason_said = reason
            where = self._log_reader.where
            log.info("ollama %s: prompt truncation from %s: %s", self.url, where, reason or "reading")
        if not lines:
            return ()
        loaded = [(m.name, m.context_length) for m in models]
        now_wall_s = time.time()
        return tuple(truncation_record(line, loaded, version, now_wall_s) for line in lines)

    def _load_facts(self, keys: list[tuple[str, str | None]], now: float) -> None:
        missing = [k for k in keys if k not in self._facts and self._show_retry_at.get(k, -1e18) <= now]
        if not missing:
            return
        try:
            sizes = parse_tags_sizes(self._fetch_json("/api/tags"))
        except FetchError:
            sizes = {}
        for key in missing:
            name = key[0]
            try:
                show = self._fetch_json("/api/show", method="POST", json_body={"model": name})
                self._facts[key] = parse_show(show, size_bytes=sizes.get(name))
                self._blob_paths[key] = parse_show_model_path(show)
            except (FetchError, UnexpectedAnswer):
                self._show_retry_at[key] = now + SHOW_RETRY_S

    def _match(self, keys: list[tuple[str, str | None]], now: float) -> dict[str, ChildServer]:
        wanted = frozenset(keys)
        models = [(name, digest, self._blob_paths.get((name, digest))) for name, digest in keys]
        matched = match_children(models, self._children)
        stale = self._children_scanned_at is None or now - self._children_scanned_at >= CHILD_RESCAN_S
        if self._rescan or wanted != self._children_for or (len(matched) < len(keys) and stale):
            self._children = self._find_children()
            self._children_for = wanted
            self._children_scanned_at = now
            self._rescan = False
            matched = match_children(models, self._children)
            live_ports = {c.port for c in self._children}
            for port in [p for p in self._child_clients if p not in live_ports]:
                self._child_clients.pop(port).close()
        return matched

    def _with_child(self, reading: ModelReading, child: ChildServer) -> ModelReading:
        assert child.port is not None
        client = self._child_clients.get(child.port)
        if client is None:
            client = self._child_clients[child.port] = make_client(f"http://127.0.0.1:{child.port}")
        try:
            slots = parse_slots(fetch(client, "/slots").json())
        except (FetchError, UnexpectedAnswer) as exc:
            self._rescan = True
            reason = exc.reason if isinstance(exc, FetchError) else str(exc)
            return replace(
                reading,
                server_pid=child.pid,
                model_path=child.model_path,
                live_rate_reason=f"llama-server child (pid {child.pid}, port {child.port}): {reason}",
            )
        return replace(reading, slots=slots, server_pid=child.pid, model_path=child.model_path)

    def _exact_facts(self, path: str | None) -> ModelFacts | None:
        """Exact facts from the child's GGUF, once `facts_loader` has read them off the poll thread.

        Until then (or when the file cannot be read here) the `/api/show` estimate stands.
        """
        if not path or self._facts_loader is None:
            return None
        return self._facts_loader.get(path)
