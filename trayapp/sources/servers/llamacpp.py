"""llama.cpp `llama-server` (one model): its probe. The pure parsers live in `llamacpp_parse.py`.

What a poll reads (see reference/backends.md §2):

* `/health` (public even with `--api-key`): 200 ok, 503 while loading.
* `/props`: model path/alias/ftype, per-slot context, slot count, build, which
  optional endpoints are on, `is_sleeping`. Every poll while idle (it neither wakes the server
  nor resets its idle timer: how the probe sees it fall asleep); cached for `props_refresh_s`
  while busy.
* Quiet (issue #26): an idle, awake local server whose process used no CPU since the last poll
  has nothing new to say, so `/props` is asked at most every IDLE_PROPS_REFRESH_S, and `/health`
  only when `/props` does not answer (a server loading or down answers neither; the usual path then
  shows what it always did): its fall asleep, or a hang of a stopped process, shows at most that much
  (plus a poll) later.
  Work shows as CPU at the next poll, which asks everything again; a remote server, a busy or
  sleeping one, and one that last failed are asked every poll.
* `/slots` (unless `--no-slots`): live `n_decoded`, context depth and prompt progress per
  slot, every poll **while there is work**. A `/slots` request goes through the server's task
  queue and resets its idle timer (`--sleep-idle-seconds`), and wakes a sleeping server, so
  while the server is idle the probe asks it only when something says work appeared: the
  server process used CPU since the last poll (local servers), or `/metrics` shows running
  or queued requests or moved counters (a METRICS task does not reset the timer). A remote
  server without `--metrics` gives no such signal: then `/slots` is polled every time (and
  such a server cannot fall asleep while watched; the live-rate reason says so).
* `/metrics` (only with `--metrics`): cumulative counters, at most every
  `metrics_interval_s` because each scrape resets the server's averaging gauges
  for every other scraper. Only counters are used.
* `/v1/models`: weights size and parameter count, once per model load.
* its log (local servers only): the prompts it refused for their length and the answers the
  context's end cut short, which no endpoint shows (`trayapp/sources/llamacpp_log.py`, #20).

Debug builds put the prompt and generated text in `/slots`; the parser never
copies them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from trayapp.config.bugs import BugLog
from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelFacts,
    ModelReading,
    ServerReading,
    ServerState,
    SlotReading,
)
from trayapp.core.quants import normalize_quant_name
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.http import FetchError
from trayapp.sources.llamacpp_log import LlamaLogReader, LogRecords
from trayapp.sources.processes import CpuActivity
from trayapp.sources.servers.common import HttpProbe
from trayapp.sources.servers.llamacpp_parse import (  # the parsers, re-exported for callers and tests
    ModelMeta,
    PropsInfo,
    parse_metrics,
    parse_props,
    parse_slots,
    parse_v1_models,
)

HEALTH_MAX_BYTES = 64 * 1024  # `{"status":"ok"}`; anything near this is not a llama-server
API_KEY_REQUIRED = "API key required: set one for this endpoint"
API_KEY_REJECTED = "API key rejected by the server: check the key set for this endpoint"
WAKE_LOAD_SOURCE = "wake-load"  # FinishedRequest.source of a reload after sleeping (no tokens)
# An idle local server that used no CPU since the last poll is asked /props at most this often (issue
# #26: half of an idle poll's requests): the worst-case delay before it is shown asleep, plus a poll.
IDLE_PROPS_REFRESH_S = 5.0

# A sleeping server reloads its model on the next request and answers slowly meanwhile: a timeout
# this soon after a sleeping /props answer is the wake-up ("loading"), not a failure.
WAKE_GRACE_S = 120.0
# While a woken server reloads, /props waits for the load to finish: an answer slower than this came
# at the load's end; a faster one, after it (then the load's length is unknown, and under one poll).
WAKE_ANSWER_MIN_S = 0.05
WAKING_REASON = "waking up: the server is loading the model again"

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- pure parsers


class LlamaServerProbe(HttpProbe):
    """What both llama-server probes share (one model, or a router of many): settings and key hints."""

    kind = "llamacpp"

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        api_key: str | None = None,
        facts_loader: ModelFactsLoader | None = None,
        metrics_interval_s: float = 10.0,
        props_refresh_s: float = 30.0,
    ) -> None:
        super().__init__(url, client=client, api_key=api_key)
        self._has_key = bool(api_key)
        self._facts_loader = facts_loader
        self.metrics_interval_s = metrics_interval_s
        self.props_refresh_s = props_refresh_s

    def _key_hint(self, exc: FetchError) -> FetchError:
        """A copy of `exc`; an unauthorized answer says whether the key is missing or wrong."""
        reason = exc.reason
        if exc.status == "unauthorized":
            reason = API_KEY_REJECTED if self._has_key else API_KEY_REQUIRED
        return FetchError(exc.status, reason, exc.http_status)


class LlamaCppProbe(LlamaServerProbe):
    """Polls one llama-server (the `HttpProbe` skeleton maps failures, times and logs).

    `counters` is set only on polls that scraped `/metrics` (rates come from
    differencing successive scrapes). `facts` come from `facts_loader` when the
    model file is readable here; they are read off the poll thread, so the first
    polls after a load may come without them (`facts_reason` says why).
    """

    def __init__(
        self, url: str, *, log_reader: Callable[[], LlamaLogReader] | None = None, **options: Any
    ) -> None:
        """`log_reader` makes the reader of the server's log instead of the default (tests)."""
        super().__init__(url, **options)
        self._make_log_reader = log_reader or LlamaLogReader
        self._log_reader: LlamaLogReader | None = None  # made at the first poll, for a local server only
        self._log_records = LogRecords()
        self._log_bugs = BugLog(log)
        self._log_reason_said: str | None = None

        self._props: PropsInfo | None = None
        self._props_at_s = 0.0
        self._meta: ModelMeta | None = None
        self._meta_at_s: float | None = None  # when /v1/models was last asked
        self._metrics_at_s: float | None = None
        self._metrics_disabled = False
        self._deferred: int | None = None  # requests waiting for a slot at the last scrape (#22)
        self._slots_disabled = False
        self._busy = True  # a slot was processing at the last /slots answer (or none was asked yet)
        self._last_spec_type: str | None = None
        self._cpu = CpuActivity()  # the server process's CPU use: the sign of new work while idle
        self._waking_since_s: float | None = None  # the first poll that saw it reload after sleeping
        self.facts_reason: str | None = None  # why the current model has no facts, when so

    def _poll(self, now_mono_s: float) -> ServerReading:
        started_s = time.monotonic()
        waking = self._was_sleeping(now_mono_s)
        # Whether the server's process used CPU since the last poll (once per poll: keeps a baseline).
        # Quiet: a server known idle and awake whose process did nothing (a server in this very process
        # is a test's fake: its CPU is ours). Nothing it answers changed then, so /props is asked at
        # most every IDLE_PROPS_REFRESH_S and /health only when /props does not answer: its fall asleep
        # or a hang (a stopped process) shows that much (plus a poll) later; a request that makes it
        # work is seen at the next poll.
        known_pid = self._pid
        cpu_work = self._cpu.worked(known_pid, now_mono_s) if known_pid is not None else None
        quiet = cpu_work is False and known_pid != os.getpid() and not self._busy
        if quiet and self._last_status == "ok" and self._quiet_props(now_mono_s):
            health: Any = {"status": "ok"}  # not asked
        else:
            # 1. /health: is it up, and done loading?
            try:
                health = self._fetch_json("/health", max_bytes=HEALTH_MAX_BYTES)
            except FetchError as exc:
                if waking and exc.status == "error":
                    return self._waking_reading(now_mono_s)
                self._forget_load()
                raise self._key_hint(exc) from exc
        if not isinstance(health, dict) or health.get("status") != "ok":
            self._forget_load()
            answer = health.get("status") if isinstance(health, dict) else health
            return ServerReading(self.kind, self.url, "error", f"/health: unexpected answer {answer!r}")
        if known_pid is None:  # first poll, or found again after a failure: the baseline starts now
            cpu_work = self._cpu.worked(self._server_pid(now_mono_s), now_mono_s)

        # 2. /props: while idle every poll (it wakes nothing and resets no idle timer) unless quiet
        #    (IDLE_PROPS_REFRESH_S); cached for props_refresh_s while busy; asleep: every poll.
        try:
            asked_s = time.monotonic()
            props = self._current_props(now_mono_s, quiet=quiet)
            answered_s = time.monotonic()
        except FetchError as exc:
            if waking and exc.status == "error":
                return self._waking_reading(now_mono_s)
            raise self._key_hint(exc) from exc
        finished = self._wake_load(props, waking, now_mono_s, answered_s - started_s, answered_s - asked_s)
        problems: list[str] = []
        status: ServerState = "ok"

        # 3. /metrics: counters, at most every metrics_interval_s (each scrape resets the server's
        #    averaging gauges for other scrapers) — or every idle poll when it is the only sign of work.
        counters: CounterReading | None = None
        metrics_on = props.endpoint_metrics and not self._metrics_disabled and not props.is_sleeping
        watch_by_metrics = not self._busy and cpu_work is None
        if metrics_on and (self._metrics_due(now_mono_s) or watch_by_metrics):
            counters = self._scrape(now_mono_s, problems)

        # 4. /slots: live progress every poll while there is work; never while asleep, and while idle
        #    only once something says work appeared (a /slots request resets the idle timer).
        slots: tuple[SlotReading, ...] = ()
        slots_at_mono_s: float | None = None  # when the server read its slots for this answer
        slots_on = props.endpoint_slots and not props.is_sleeping and not self._slots_disabled
        if slots_on and slots_needed(self._busy, cpu_work, metrics_on, counters):
            try:
                asked_s = time.monotonic()
                slots = parse_slots(self._fetch_json("/slots"))
                # Rates are tokens between two answers ÷ the time between them: the middle of this
                # request, not the tick's start (on a busy host the answer can come 100s of ms later).
                slots_at_mono_s = now_mono_s + ((asked_s + time.monotonic()) / 2 - started_s)
                was_busy, self._busy = self._busy, any(slot.is_processing for slot in slots)
                if was_busy and not self._busy and metrics_on and counters is None:
                    # A request just ended: the counters' deltas now are its own exact numbers
                    # (tokens ÷ the server's seconds); one scrape per request, not one per poll.
                    counters = self._scrape(now_mono_s, problems)
            except FetchError as exc:
                if exc.status == "unauthorized":
                    return replace(self._failure_reading(self._key_hint(exc)), version=props.build_info)
                if exc.http_status == 501:
                    self._slots_disabled = True
                else:
                    status = "error"
                    problems.append(exc.reason)

        # 5. /v1/models meta: once per model load (retried after props_refresh_s when it failed).
        if self._meta_due(now_mono_s):
            self._meta_at_s = now_mono_s
            try:
                self._meta = _pick_meta(parse_v1_models(self._fetch_json("/v1/models")), props)
            except FetchError as exc:
                problems.append(exc.reason)

        model = self._model_reading(props, slots, counters)
        reason = "; ".join(problems) if problems else None
        pid = self._server_pid(now_mono_s)  # lets NVML's per-process memory tell the model's GPU share
        if self._local:  # after /slots: a request its slots saw end is in the log by now, or next poll
            finished = (*finished, *self._from_log(props, pid))
        return ServerReading(
            self.kind, self.url, status, reason, version=props.build_info, models=(model,), pid=pid,
            finished=finished, t_mono_s=slots_at_mono_s,
        )  # fmt: skip

    @property
    def log_reason(self) -> str | None:
        """Why refusals and cut answers cannot be read from the server's log now (None while they can,
        and for a server on another machine, whose log is out of reach)."""
        return self._log_reader.reason if self._log_reader is not None else None

    @property
    def log_where(self) -> str | None:
        """What is read for them: "--log-file /x.log", "its stderr, /x.log", or "nothing"."""
        return self._log_reader.where if self._log_reader is not None else None

    def _from_log(self, props: PropsInfo, pid: int | None) -> tuple[FinishedRequest, ...]:
        """The refusals and cut answers the server's log gained since the last poll, as request records."""
        try:  # its own boundary: a bug reading the log must not cost the server's reading
            if self._log_reader is None:
                self._log_reader = self._make_log_reader()
            lines = [line for line in self._log_reader.poll(pid) if line.port is None]  # not a router's
            records = self._log_records.records(lines, props.model_name, props.n_ctx, time.time())
        except Exception as exc:
            self._log_reason_said = self._log_bugs.report(exc, f"{self.kind} {self.url}: reading its log")
            return ()
        said = self._log_reader.reason or self._log_reader.note
        if said != self._log_reason_said:
            self._log_reason_said = said
            where = self._log_reader.where
            log.info("%s %s: context overflow from %s: %s", self.kind, self.url, where, said or "reading")
        return records

    def _wake_load(
        self, props: PropsInfo, waking: bool, now_s: float, answered_after_s: float, answer_s: float
    ) -> tuple[FinishedRequest, ...]:
        """A reload after sleeping, timed from the first poll that found it reloading (or this one) to
        /props's answer, which the server holds back until the model is in memory again. Measured
        between polls, like a router's loads: it may start up to one poll interval late."""
        if not waking:
            return ()
        if props.is_sleeping:  # still asleep: nothing woke it
            self._waking_since_s = None
            return ()
        since, self._waking_since_s = self._waking_since_s, None
        if since is None and answer_s < WAKE_ANSWER_MIN_S:
            return ()  # it was back before this poll: the load was shorter than a poll interval
        start = now_s if since is None else since
        load = FinishedRequest(
            model=props.model_name,
            finished_wall_s=time.time(),
            load_s=now_s + answered_after_s - start,
            source=WAKE_LOAD_SOURCE,
        )
        return (load,)

    def _current_props(self, now_s: float, *, quiet: bool = False) -> PropsInfo:
        """/props, or the last answer while busy (`props_refresh_s`) or `quiet` (the server's process
        used no CPU since the last poll: IDLE_PROPS_REFRESH_S). Asleep: asked every poll, to see it wake."""
        props = self._props
        idle_s = IDLE_PROPS_REFRESH_S if quiet else 0.0
        if props is not None and self._props_fresh(now_s, self.props_refresh_s if self._busy else idle_s):
            return props
        try:
            data = self._fetch_json("/props")
        except FetchError as exc:
            if exc.http_status == 404:
                raise FetchError("error", f"{exc.reason} (not a llama-server?)", 404) from exc
            raise
        if not isinstance(data, dict):
            raise FetchError("error", "/props: unexpected payload (not a JSON object)")
        fresh = parse_props(data)
        if props is not None and fresh.model_path != props.model_path:
            self._meta, self._meta_at_s = None, None  # another model: look its size up again
        self._props, self._props_at_s = fresh, now_s
        return fresh

    def _quiet_props(self, now_s: float) -> bool:
        """A quiet server that answered last time: whether its last /props is younger than
        IDLE_PROPS_REFRESH_S, or else /props answers again now (then /health need not be asked: a
        server loading or down answers neither). False sends the poll the usual way, /health first,
        so a failure shows as it always did."""
        if self._props_fresh(now_s, IDLE_PROPS_REFRESH_S):
            return True
        if self._props is None or self._props.is_sleeping:
            return False
        try:
            self._current_props(now_s, quiet=True)
        except FetchError:
            return False
        return True

    def _props_fresh(self, now_s: float, max_age_s: float) -> bool:
        """Whether the last /props answer is younger than `max_age_s` and says the server is awake."""
        props = self._props
        return props is not None and not props.is_sleeping and now_s - self._props_at_s < max_age_s

    def _was_sleeping(self, now_s: float) -> bool:
        props = self._props
        return props is not None and props.is_sleeping and now_s - self._props_at_s < WAKE_GRACE_S

    def _waking_reading(self, now_s: float) -> ServerReading:
        """The server said it was asleep and now answers too slowly: it is reloading the model."""
        assert self._props is not None
        if self._waking_since_s is None:
            self._waking_since_s = now_s
        props = replace(self._props, is_sleeping=False)
        model = replace(self._model_reading(props, (), None), loading=True)
        return ServerReading(
            self.kind, self.url, "loading", WAKING_REASON, version=props.build_info, models=(model,)
        )

    def _scrape(self, now_mono_s: float, problems: list[str]) -> CounterReading | None:
        """`/metrics` now (each scrape resets the server's averaging gauges for other scrapers)."""
        self._metrics_at_s = now_mono_s
        try:
            response = self._fetch("/metrics")
            return parse_metrics(response.text, response.headers)
        except FetchError as exc:
            if exc.http_status == 501:
                self._metrics_disabled = True
            else:
                problems.append(exc.reason)
        return None

    def _metrics_due(self, now_s: float) -> bool:
        return self._metrics_at_s is None or now_s - self._metrics_at_s >= self.metrics_interval_s

    def _meta_due(self, now_s: float) -> bool:
        if self._meta is not None:
            return False
        return self._meta_at_s is None or now_s - self._meta_at_s >= self.props_refresh_s

    def _forget_load(self) -> None:
        """The server is down or loading: the next answer may come from another model or flags."""
        self._props = None
        self._busy = True
        self._waking_since_s = None
        self._last_spec_type = None
        self._meta, self._meta_at_s = None, None
        self._metrics_disabled = False
        self._slots_disabled = False

    def _model_reading(
        self, props: PropsInfo, slots: tuple[SlotReading, ...], counters: CounterReading | None
    ) -> ModelReading:
        meta = self._meta
        facts = self._model_facts(props.model_path)
        if props.is_sleeping:
            live_reason: str | None = "server is asleep (--sleep-idle-seconds); it wakes on the next request"
        elif not props.endpoint_slots or self._slots_disabled:
            live_reason = "/slots is disabled on this server (--no-slots): no live decode rate"
        else:
            live_reason = None
        return ModelReading(
            name=props.model_name,
            loaded=not props.is_sleeping,
            sleeping=props.is_sleeping,
            spec_type=self._spec_kind(props, slots),
            weights_bytes=meta.size_bytes if meta else None,
            context_length=props.n_ctx,
            quantization=props.quantization or normalize_quant_name(meta.ftype if meta else None),
            parameter_count=meta.parameter_count if meta else None,
            architecture=facts.architecture if facts else None,
            model_path=props.model_path,
            facts=facts,
            slots=slots,
            counters=counters,
            busy=any(slot.is_processing for slot in slots) if slots else None,
            queued_requests=self._queued_now(slots, counters),
            live_rate_reason=live_reason,
        )

    def _queued_now(self, slots: tuple[SlotReading, ...], counters: CounterReading | None) -> int | None:
        self._deferred = queued_between_scrapes(self._deferred, counters, slots, self._busy)
        return self._deferred

    def _spec_kind(self, props: PropsInfo, slots: tuple[SlotReading, ...]) -> str | None:
        """The speculative decoding in use: /props' defaults say "none" even with `--spec-type`, so the
        kinds a slot's last task ran with are kept (slots are not asked while idle)."""
        seen = next((slot.spec_type for slot in slots if slot.spec_type), None)
        if seen is not None:
            self._last_spec_type = seen
        return props.spec_type or self._last_spec_type

    def _model_facts(self, path: str | None) -> ModelFacts | None:
        if self._facts_loader is None or not path:
            self.facts_reason = "no model file known" if not path else None
            return None
        facts, self.facts_reason = self._facts_loader.lookup(path)
        return facts


def queued_between_scrapes(
    last_deferred: int | None, counters: CounterReading | None, slots: tuple[SlotReading, ...], busy: bool
) -> int | None:
    """Requests waiting for a slot: `requests_deferred` as the last `/metrics` scrape counted it (one
    scrape every metrics_interval_s while busy), kept while every slot is still busy, and 0 once a
    slot is free or nothing works (llama-server defers a request only while no slot is free).
    None on a server without `--metrics`. A single server and a router's child alike."""
    deferred = last_deferred
    if counters is not None and counters.requests_waiting is not None:
        deferred = max(0, int(counters.requests_waiting))
    if deferred is not None and (not busy or any(not s.is_processing for s in slots)):
        deferred = 0
    return deferred


def slots_needed(
    busy: bool, cpu_work: bool | None, metrics_on: bool, counters: CounterReading | None
) -> bool:
    """Whether to ask `/slots` (which resets the idle timer): always while busy; while idle only on a
    sign of new work — the server's CPU use, else `/metrics` showing running or queued requests, else
    (a remote server without `--metrics`: no other sign) every time."""
    if busy or cpu_work:
        return True
    if metrics_on and counters is not None:
        return bool(counters.requests_running or counters.requests_waiting)
    return cpu_work is None and not metrics_on


def _pick_meta(metas: tuple[ModelMeta, ...], props: PropsInfo) -> ModelMeta | None:
    for meta in metas:
        if meta.id in (props.model_alias, props.model_path):
            return meta
    return metas[0] if len(metas) == 1 else None
