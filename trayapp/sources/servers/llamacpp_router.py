"""llama.cpp `llama-server` in router mode (`--models-dir` / `--models-preset`, no `-m`).

One router serves many models and runs each loaded one in a child llama-server
(see docs/architecture.md, "Router mode", for what was checked on the real binary):

* `GET /models` (answered by the router itself, no task queue): every model it can
  serve, its state (`unloaded`, `loading`, `loaded`, `sleeping`; `failed` with an exit
  code), the child's arguments (`--port`, `--model`) and, once loaded, `meta` (size,
  parameters). Polled every time: it is what tells the states apart.
* Per-model endpoints `?model=NAME&autoload=false`, asked **only for models listed as
  `loaded`**: a GET naming an unloaded model loads it unless `autoload=false` says not
  to; the router's GET proxies never update its least-recently-used order (only POSTs
  do). `/props` (cached) and `/metrics` (counters; a METRICS task resets no idle timer)
  wake nothing; `/slots` resets the child's idle timer and wakes a sleeping child, so it
  is asked while the child works, and while idle only once a sign says work appeared
  (the child process used CPU, or `/metrics` shows running or queued requests).
* A model seen going `loading` → `loaded` gives a load time measured between polls
  (± one poll interval), reported as a `FinishedRequest` that carries only `load_s`.
* Where the router pushes its events (`GET /models/sse`, llamacpp_events.py), `/models` is read
  once per connection of the stream and the states, load stages, wakes, failures and evictions
  come from the events (a load time from its first `loading` event to its `loaded` event);
  `/models` is polled only while the stream is unavailable (an older build: 404) or down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelFacts,
    ModelReading,
    ServerReading,
    SlotReading,
)
from trayapp.core.quants import normalize_quant_name
from trayapp.sources.http import FetchError
from trayapp.sources.processes import CpuActivity, find_child_by_alias, find_listening_pid
from trayapp.sources.servers.jsonvals import as_bool, as_dict, as_int, as_str
from trayapp.sources.servers.llamacpp import (
    HEALTH_MAX_BYTES,
    LlamaServerProbe,
    queued_between_scrapes,
    slots_needed,
)
from trayapp.sources.servers.llamacpp_events import (
    LOADING_STATES,
    ROUTER_STATES,
    ModelEvents,
    RouterEvent,
    RouterEventBook,
    RouterEventStream,
)
from trayapp.sources.servers.llamacpp_parse import (
    ModelMeta,
    PropsInfo,
    parse_metrics,
    parse_props,
    parse_slots,
    parse_v1_models,
)

ROUTER_KIND = "llamacpp-router"  # what discovery calls a router; its readings say "llamacpp"
LOAD_SOURCE = "router-load"  # FinishedRequest.source of a measured load (no tokens)

# --------------------------------------------------------------------------- pure parsers


@dataclass(frozen=True)
class RouterModel:
    """One `data[]` entry of a router's `GET /models`."""

    name: str
    state: str  # one of ROUTER_STATES ("unknown" for a value this build does not know)
    port: int | None = None  # the child's port, while it has one
    model_path: str | None = None  # the child's `--model`
    exit_code: int | None = None  # set when the last load failed
    meta: ModelMeta | None = None  # size / parameters, once loaded
    detail: str | None = None  # from the events: load stage and progress, a wake, an eviction
    loads: int = 0  # `loaded` events seen for it since `/models` was read (a new one: a new child)


def is_router_props(data: Any) -> bool:
    """A `GET /props` (without `?model=`) that comes from a router, not a single-model server."""
    return isinstance(data, dict) and data.get("role") == "router"


def _arg_value(args: Sequence[Any], *names: str) -> str | None:
    for index, arg in enumerate(args[:-1]):
        if arg in names and isinstance(args[index + 1], str):
            return str(args[index + 1])
    return None


def parse_router_models(data: Any) -> tuple[RouterModel, ...]:
    """A router's `GET /models` → one RouterModel per listed model (entries without an id are skipped)."""
    entries = as_dict(data).get("data")
    if not isinstance(entries, list):
        return ()
    metas = {meta.id: meta for meta in parse_v1_models(data)}
    models: list[RouterModel] = []
    for entry in entries:
        name = as_str(entry.get("id")) if isinstance(entry, dict) else None
        if not name:
            continue
        status = as_dict(entry.get("status"))
        raw_args = status.get("args")
        args = raw_args if isinstance(raw_args, list) else []
        state = as_str(status.get("value")) or "unknown"
        if as_bool(status.get("failed")):
            state = "failed"
        elif state not in ROUTER_STATES:
            state = "unknown"
        raw_port = _arg_value(args, "--port")
        port = int(raw_port) if raw_port and raw_port.isdigit() else None
        meta = metas.get(name)
        has_meta = meta is not None and (meta.size_bytes is not None or meta.parameter_count is not None)
        models.append(
            RouterModel(
                name=name,
                state=state,
                port=port if port else None,  # 0 until a child is spawned
                model_path=_arg_value(args, "--model", "-m"),
                exit_code=as_int(status.get("exit_code")),
                meta=meta if has_meta else None,
            )
        )
    return tuple(models)


# --------------------------------------------------------------------------- the probe


@dataclass
class _Child:
    """What the probe keeps about one loaded child (one port: a reload is a new child)."""

    port: int | None
    loads: int = 0
    props: PropsInfo | None = None
    props_at_s: float = 0.0
    busy: bool = True  # a slot was processing at the last /slots answer (or none was asked yet)
    pid: int | None = None
    pid_looked: bool = False
    cpu: CpuActivity = field(default_factory=CpuActivity)  # the child's CPU use: a sign of new work
    metrics_at_s: float | None = None
    deferred: int | None = None  # requests waiting for a slot, kept between scrapes (#22)
    problems: list[str] = field(default_factory=list)


@dataclass
class _LoadWatch:
    """When a model was first seen loading (monotonic), to measure its load time."""

    loading_since_s: float | None = None


class LlamaRouterProbe(LlamaServerProbe):
    """Polls one llama-server router: one ModelReading per model it lists.

    Unloaded and failed models are listed with `loaded=False` (never as down),
    loading ones with `loading=True`, sleeping ones with `sleeping=True`. Only
    `loaded` models are asked anything of their own (see the module docstring).
    """

    def __init__(self, url: str, *, follow_events: bool = True, **options: Any) -> None:
        super().__init__(url, **options)
        self._children: dict[str, _Child] = {}
        self._loads: dict[str, _LoadWatch] = {}
        self._follow_events = follow_events and self.url.startswith("http://")
        self._stream: RouterEventStream | None = None
        self._book = RouterEventBook()
        self._book_lock = threading.Lock()
        self._seeded_connection = 0
        self._listed: tuple[RouterModel, ...] = ()
        self._event_loads: list[FinishedRequest] = []
        self.models_reads = 0  # GET /models asked: once per stream connection, or every poll without one

    @property
    def stream_state(self) -> str:
        """The event stream's state: "off", "starting", "connected", "unavailable", "down"."""
        return self._stream.state if self._stream is not None else "off"

    def _release(self) -> None:
        if self._stream is not None:
            self._stream.close()
        super()._release()

    def _on_event(self, event: RouterEvent) -> None:
        with self._book_lock:
            self._book.apply(event)

    def _listing(self, now_mono_s: float) -> tuple[RouterModel, ...]:
        """The models and their states: from the events while the stream runs, else from `/models`."""
        if self._follow_events and self._stream is None:
            self._stream = RouterEventStream(self.url, self._headers, self._on_event)
            self._stream.start()
        stream = self._stream
        if stream is None or stream.state != "connected":
            self._seeded_connection = 0
            return self._read_models()
        connection = stream.connection
        if connection != self._seeded_connection:
            listed = self._read_models()  # the stream sends no initial state
            with self._book_lock:
                self._book.seed({m.name: m.state for m in listed}, time.monotonic())
            self._listed, self._seeded_connection = listed, connection
            self._loads.clear()
            return listed
        with self._book_lock:
            states = dict(self._book.models)
            infos = dict(self._book.infos)
            done = self._book.take_done()
        self._event_loads = [
            FinishedRequest(model=d.model, finished_wall_s=time.time(), load_s=d.load_s, source=LOAD_SOURCE)
            for d in done
        ]
        listed = tuple(_with_events(m, states.get(m.name), infos.get(m.name)) for m in self._listed)
        known = {m.name for m in listed}
        new = tuple(
            _with_events(RouterModel(name, state.state), state, infos.get(name))
            for name, state in states.items()
            if name not in known
        )
        return listed + new

    def _read_models(self) -> tuple[RouterModel, ...]:
        self.models_reads += 1
        return parse_router_models(self._fetch_json("/models"))

    def _poll(self, now_mono_s: float) -> ServerReading:
        self._event_loads = []
        try:
            health = self._fetch_json("/health", max_bytes=HEALTH_MAX_BYTES)
            listed = self._listing(now_mono_s)
        except FetchError as exc:
            self._children.clear()
            self._loads.clear()
            raise self._key_hint(exc) from exc
        if not isinstance(health, dict) or health.get("status") != "ok":
            answer = health.get("status") if isinstance(health, dict) else health
            return ServerReading(self.kind, self.url, "error", f"/health: unexpected answer {answer!r}")

        models: list[ModelReading] = []
        finished: list[FinishedRequest] = []
        problems: list[str] = []
        from_events = bool(self._seeded_connection)
        finished.extend(self._event_loads)
        for model in listed:
            load = None if from_events else self._measure_load(model, now_mono_s)
            if load is not None:
                finished.append(load)
            if model.state == "loaded" and (model.port is not None or from_events):
                child = self._child(model)
                models.append(self._loaded_reading(model, child, now_mono_s))
                problems.extend(child.problems)
            else:
                self._children.pop(model.name, None)
                models.append(_idle_reading(model, self._facts(model)))
        gone = {m.name for m in listed}
        for name in [n for n in self._children if n not in gone]:
            del self._children[name]
        version = next((c.props.build_info for c in self._children.values() if c.props), None)
        reason = "; ".join(problems) if problems else None
        return ServerReading(
            self.kind,
            self.url,
            "ok",
            reason,
            version=version,
            models=tuple(models),
            finished=tuple(finished),
            router=True,
        )

    # ------------------------------------------------------------------ load time

    def _measure_load(self, model: RouterModel, now_s: float) -> FinishedRequest | None:
        """A load seen from `loading` to `loaded` → its time, measured between polls (± one interval)."""
        watch = self._loads.setdefault(model.name, _LoadWatch())
        if model.state == "loading":
            if watch.loading_since_s is None:
                watch.loading_since_s = now_s
            return None
        since, watch.loading_since_s = watch.loading_since_s, None
        if since is None or model.state != "loaded":
            return None
        return FinishedRequest(
            model=model.name, finished_wall_s=time.time(), load_s=now_s - since, source=LOAD_SOURCE
        )

    # ------------------------------------------------------------------ loaded children

    def _child(self, model: RouterModel) -> _Child:
        child = self._children.get(model.name)
        if child is None or child.port != model.port or child.loads != model.loads:
            child = self._children[model.name] = _Child(model.port, model.loads)
        child.problems = []
        return child

    def _ask(self, name: str, path: str) -> str:
        return f"{path}?model={quote(name, safe='')}&autoload=false"

    def _loaded_reading(self, model: RouterModel, child: _Child, now_s: float) -> ModelReading:
        props = self._child_props(model.name, child, now_s)
        counters: CounterReading | None = None
        cpu_work = self._cpu_work(model.name, child, now_s)
        metrics_on = props is not None and props.endpoint_metrics
        idle_watch = not child.busy and cpu_work is None
        metrics_due = child.metrics_at_s is None or now_s - child.metrics_at_s >= self.metrics_interval_s
        if metrics_on and (metrics_due or idle_watch):
            child.metrics_at_s = now_s
            try:
                response = self._fetch(self._ask(model.name, "/metrics"))
                counters = parse_metrics(response.text, response.headers)
            except FetchError as exc:
                child.problems.append(exc.reason)

        slots: tuple[SlotReading, ...] = ()
        slots_on = props is not None and props.endpoint_slots and not props.is_sleeping
        if slots_on and slots_needed(child.busy, cpu_work, bool(metrics_on), counters):
            try:
                slots = parse_slots(self._fetch_json(self._ask(model.name, "/slots")))
                child.busy = any(slot.is_processing for slot in slots)
            except FetchError as exc:
                child.problems.append(exc.reason)

        child.deferred = queued_between_scrapes(child.deferred, counters, slots, child.busy)
        meta = model.meta
        facts = self._facts(model)
        ftype = props.quantization if props else None
        return ModelReading(
            name=model.name,
            loaded=True,
            weights_bytes=meta.size_bytes if meta else None,
            context_length=(props.n_ctx if props else None) or (meta.n_ctx if meta else None),
            quantization=ftype or normalize_quant_name(meta.ftype if meta else None),
            parameter_count=meta.parameter_count if meta else None,
            architecture=facts.architecture if facts else None,
            model_path=(props.model_path if props else None) or model.model_path,
            facts=facts,
            slots=slots,
            counters=counters,
            spec_type=(props.spec_type if props else None)
            or next((slot.spec_type for slot in slots if slot.spec_type), None),
            busy=child.busy if slots else None,
            queued_requests=child.deferred,
            live_rate_reason=None
            if slots_on or props is None
            else "/slots is disabled on this model's server",
            server_pid=child.pid,
        )

    def _child_props(self, name: str, child: _Child, now_s: float) -> PropsInfo | None:
        if child.props is not None and now_s - child.props_at_s < self.props_refresh_s:
            return child.props
        try:
            data = self._fetch_json(self._ask(name, "/props"))
        except FetchError as exc:
            child.problems.append(exc.reason)
            return child.props
        child.props, child.props_at_s = parse_props(data), now_s
        return child.props

    def _cpu_work(self, model_alias: str, child: _Child, now_s: float) -> bool | None:
        """Did the child process use CPU since the last poll? None when it cannot be seen."""
        if not self._local:
            return None
        if not child.pid_looked:
            child.pid_looked = True
            if child.port is not None:
                child.pid = find_listening_pid(child.port)
            else:  # a child the events announced: found by its alias among the router's children
                router_pid = self._server_pid(now_s)
                child.pid = find_child_by_alias(router_pid, model_alias) if router_pid else None
        return child.cpu.worked(child.pid, now_s)

    # ------------------------------------------------------------------ helpers

    def _facts(self, model: RouterModel) -> ModelFacts | None:
        """Exact facts of the model's file, for models that are (or are becoming) resident."""
        if self._facts_loader is None or not model.model_path or model.state in ("unloaded", "failed"):
            return None
        return self._facts_loader.lookup(model.model_path)[0]


def _with_events(model: RouterModel, events: ModelEvents | None, info: dict[str, Any] | None) -> RouterModel:
    """`model` as listed by `/models`, brought up to date by the events since."""
    if events is None:
        return model
    meta = next(iter(parse_v1_models({"data": [info]})), None) if info is not None else None
    has_meta = meta is not None and (meta.size_bytes is not None or meta.parameter_count is not None)
    return replace(
        model,
        state=events.state,
        port=model.port if events.loads == 0 else None,  # a new child since /models: port unknown
        exit_code=events.exit_code if events.state == "failed" else model.exit_code,
        meta=meta if has_meta else model.meta,
        detail=_event_detail(events),
        loads=events.loads,
    )


def _event_detail(events: ModelEvents) -> str | None:
    """'waking: loading text_model 40 % (1 of 2 parts)', 'evicted for beta (--models-max)'."""
    if events.state in LOADING_STATES:
        verb = "downloading" if events.state == "downloading" else "loading"
        part = f" {events.stage}" if events.stage else ""
        share = f" {events.progress * 100:.0f} %" if events.progress is not None else ""
        of = ""
        if events.stage in events.stages and len(events.stages) > 1:
            of = f" (part {events.stages.index(events.stage) + 1} of {len(events.stages)})"
        return ("waking: " if events.was_sleeping else "") + verb + part + share + of
    if events.state == "unloaded" and events.evicted_for:
        return f"not loaded: evicted for {events.evicted_for} (--models-max); the next request loads it"
    return None


def _idle_reading(model: RouterModel, facts: ModelFacts | None) -> ModelReading:
    """A model the router lists without a running child to ask (or one that must not be asked)."""
    reasons = {
        "unloaded": "not loaded (the router loads it on the next request for it)",
        "loading": None,
        "downloading": "downloading",
        "sleeping": "asleep (--sleep-idle-seconds); it wakes on the next request",
        "failed": f"failed to load (exit code {model.exit_code})",
        "unknown": "state not known to llm-tray",
        "loaded": "loaded, but the router names no port for it",
    }
    meta = model.meta
    return ModelReading(
        name=model.name,
        loaded=False,
        loading=model.state in LOADING_STATES,
        sleeping=model.state == "sleeping",
        weights_bytes=meta.size_bytes if meta else None,
        parameter_count=meta.parameter_count if meta else None,
        quantization=normalize_quant_name(meta.ftype if meta else None),
        model_path=model.model_path,
        facts=facts,
        live_rate_reason=model.detail or reasons.get(model.state),
    )
