"""One tick as explicit stages: rates → placement → sessions → statuses → diagnosis → episodes.

Each stage is a small pure module that decides its facts once and returns immutable results:
`rates.RateTracker` (speeds, phases, finished requests), `placement.place` (facts, GPU share,
ceiling), `session.SessionTracker` (sessions), `diagnose` (findings), `episodes.EpisodeTracker`
(alerts). `ModelStatus` is built exactly once per model and tick, by `model_status`.

Pure: the monitor does the I/O (polling servers, reading the GPU, looking up baselines in the
store) and hands this module readings, baselines and times; nothing here blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from trayapp.core.diagnose import (
    ModelView,
    TrendPoint,
    diagnose_hardware,
    diagnose_model,
    diagnose_server,
    resolved_kinds,
)
from trayapp.core.episodes import EpisodeTracker, alerts_now
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Alert,
    Baseline,
    Finding,
    HardwareSnapshot,
    ModelReading,
    ModelStatus,
    RequestRecord,
    ServerReading,
    ServerStatus,
    SessionRecord,
    Snapshot,
)
from trayapp.core.placement import Placement, ceiling_for, place, weights_bytes
from trayapp.core.rates import RateEstimate, RateTracker
from trayapp.core.session import SessionInput, SessionTracker
from trayapp.core.thresholds import Thresholds

TREND_POINTS = 400  # (context, rate) points kept per session for the KV trend
MAX_TRENDS = 64  # sessions whose trend is kept; the oldest are forgotten beyond this

ModelKey = tuple[str, str]  # (server URL, model name)


@dataclass(frozen=True)
class TickOutput:
    snapshot: Snapshot
    sessions: tuple[SessionRecord, ...]  # started, changed or ended at this tick


@dataclass(frozen=True)
class _ServerTick:
    status: ServerStatus
    requests: tuple[RequestRecord, ...]
    sessions: tuple[SessionRecord, ...]


class Pipeline:
    def __init__(
        self, thresholds: Thresholds | None = None, *, idle_gap_s: float = 60.0, one_shot: bool = False
    ):
        self.thresholds = thresholds or Thresholds()
        self.one_shot = one_shot
        self.rates = RateTracker()
        self.sessions = SessionTracker(idle_gap_s=idle_gap_s)
        self.episodes = EpisodeTracker(self.thresholds.confirm_s, self.thresholds.clear_s)
        self._trends: dict[str, deque[TrendPoint]] = {}
        self._last_status: dict[ModelKey, ModelStatus] = {}
        self._before_change: dict[ModelKey, ModelStatus] = {}
        self._was_up: dict[str, bool] = {}
        self._resolved: set[tuple[str, str, str | None]] = set()  # this tick's (kind, server, model) over

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds
        self.episodes.confirm_s = thresholds.confirm_s
        self.episodes.clear_s = thresholds.clear_s

    def process(
        self,
        readings: Sequence[ServerReading],
        hardware: HardwareSnapshot,
        machines: Mapping[str, Machine],
        default_machine: Machine,
        now_mono_s: float,
        now_wall_s: float,
        baselines: Mapping[ModelKey, Baseline] | None = None,
        plain_baselines: Mapping[ModelKey, Baseline] | None = None,
        calibrations: Mapping[ModelKey, float] | None = None,
        *,
        bench_rates: Mapping[ModelKey, float] | None = None,
    ) -> TickOutput:
        """One tick. `baselines` are the store's comparable baselines of the models that were decoding;
        `plain_baselines` the plain-decode ones of those decoding with speculative decoding;
        `calibrations` their benched efficiency (decode ÷ ceiling at depth 0) on this hardware and
        `bench_rates` their benched decode tok/s at depth 0 (both shown on the models)."""
        servers: list[ServerStatus] = []
        requests: list[RequestRecord] = []
        sessions: list[SessionRecord] = []
        findings: list[Finding] = []
        self._resolved.clear()  # filled by _diagnose
        for reading in readings:
            machine = machines.get(reading.url, default_machine)
            plain = plain_baselines or {}
            tick = self._server_tick(reading, hardware, machine, now_mono_s, now_wall_s, plain)
            servers.append(_with_bench(tick.status, calibrations or {}, bench_rates or {}))
            requests.extend(tick.requests)
            sessions.extend(tick.sessions)
            findings.extend(self._diagnose(tick, machine, hardware, baselines or {}, calibrations or {}))

        hardware_findings = diagnose_hardware(hardware, self.thresholds)
        local = {r.url for r in readings if r.url not in machines}
        if any(f.kind == "offload" and f.server in local for f in findings):
            # A local model already spilled: that alert says the VRAM is full, and why.
            hardware_findings = [f for f in hardware_findings if f.kind != "vram_pressure"]
        findings.extend(hardware_findings)
        ended: tuple[Alert, ...] = ()
        if self.one_shot:
            alerts = alerts_now(findings, now_wall_s)
        else:
            alerts, ended = self.episodes.update(findings, now_mono_s, now_wall_s, self._resolved)

        snapshot = Snapshot(
            t_wall_s=now_wall_s,
            t_mono_s=now_mono_s,
            servers=tuple(servers),
            hardware=hardware,
            alerts=alerts,
            requests=tuple(requests),
            ended_alerts=ended,
        )
        return TickOutput(snapshot, tuple(self._with_alert_kinds(sessions, alerts)))

    # ------------------------------------------------------------------ stages per server

    def _server_tick(
        self,
        reading: ServerReading,
        hardware: HardwareSnapshot,
        machine: Machine,
        now_mono_s: float,
        now_wall_s: float,
        plain_baselines: Mapping[ModelKey, Baseline],
    ) -> _ServerTick:
        rates = self.rates.update(reading, now_mono_s, now_wall_s)
        by_model: dict[str, list[RequestRecord]] = {}
        for record in rates.requests:
            by_model.setdefault(record.model, []).append(record)
        label = hardware_label(machine)
        placed: list[tuple[ModelReading, RateEstimate, Placement]] = []
        inputs: list[SessionInput] = []
        for model in reading.models:
            rate = rates.models.get(model.name, RateEstimate())
            placement = place(model, rate.context_tokens, model.server_pid or reading.pid, hardware, machine)
            placed.append((model, rate, placement))
            inputs.append(
                SessionInput(
                    name=model.name,
                    rate=rate,
                    quantization=_quantization(model),
                    gpu_fraction=placement.gpu_fraction,
                    ceiling_tok_s=ceiling_for(placement.facts, 0, machine, placement.gpu_fraction),
                    hardware=label,
                    requests=tuple(by_model.get(model.name, ())),
                    spec_type=model.spec_type,
                )
            )
        session_changes: tuple[SessionRecord, ...] = ()
        if reading.age_s is not None:  # a repeated earlier reading: sessions stay as they are
            ids = self.sessions.ids(reading.url)
        else:
            session_tick = self.sessions.update(reading, inputs, now_mono_s, now_wall_s)
            ids, session_changes = session_tick.ids, session_tick.sessions

        statuses = tuple(
            model_status(
                model,
                rate,
                placement,
                ids.get(model.name),
                model.server_pid or reading.pid,
                plain_baselines.get((reading.url, model.name)),
            )
            for model, rate, placement in placed
        )
        placements = {model.name: placement for model, _, placement in placed}
        records = tuple(
            _complete_request(r, ids.get(r.model), placements.get(r.model), machine) for r in rates.requests
        )
        status = ServerStatus(
            kind=reading.kind,
            url=reading.url,
            status=reading.status,
            reason=reading.reason,
            version=reading.version,
            models=statuses,
            pid=reading.pid,
            age_s=reading.age_s,
        )
        return _ServerTick(status, records, session_changes)

    def _diagnose(
        self,
        tick: _ServerTick,
        machine: Machine,
        hardware: HardwareSnapshot,
        baselines: Mapping[ModelKey, Baseline],
        calibrations: Mapping[ModelKey, float],
    ) -> list[Finding]:
        server = tick.status
        findings = diagnose_server(server, self._was_up.get(server.url, False))
        if server.status == "ok":
            self._was_up[server.url] = True
        others = [p for g in hardware.gpus for p in g.processes if p.pid != server.pid]
        throttles = tuple(reason for g in hardware.gpus for reason in g.throttle_reasons)
        for status in server.models:
            key = (server.url, status.name)
            self._remember(key, status)  # first: a context change seen now explains now
            own = [r for r in tick.requests if r.model == status.name]
            decoding = status.phase == "decoding" and status.session_id is not None
            view = ModelView(
                server=server,
                model=status,
                machine=machine,
                previous=self._before_change.get(key),
                trend=tuple(self._trend(status, own, fresh=server.age_s is None)),
                baseline=baselines.get(key) if decoding else None,
                other_gpu_processes=[p for p in others if p.pid != status.server_pid],
                load_s=max((r.load_s for r in own if r.load_s), default=None),
                cpu_percent=hardware.host.cpu_percent,
                throttle_reasons=throttles,
                gpu_fraction_source=status.gpu_fraction_source,
                calibrated_efficiency=calibrations.get(key),
            )
            findings.extend(diagnose_model(view, self.thresholds))
            self._resolved.update((kind, server.url, status.name) for kind in resolved_kinds(view))
        return findings

    def _trend(
        self, status: ModelStatus, requests: Sequence[RequestRecord], fresh: bool = True
    ) -> deque[TrendPoint]:
        """The session's single-stream decode rates (`TrendPoint`: context, rate, exact?), oldest first.

        A repeated (stale) reading adds nothing, and neither does a tick with several
        streams decoding at once: batching lowers the per-stream rate without any context
        growth, which would read as a KV slowdown or a regression.
        """
        if status.session_id is None:
            return deque()
        trend = self._trends.setdefault(status.session_id, deque(maxlen=TREND_POINTS))
        if not fresh:
            return trend
        for record in requests:
            if record.context_tokens is not None and record.decode_tok_s:
                trend.append(TrendPoint(record.context_tokens, record.decode_tok_s, record.exact))
        single = status.active_streams <= 1
        if (
            status.phase == "decoding"
            and single
            and status.decode_tok_s
            and status.context_tokens is not None
        ):
            trend.append(TrendPoint(status.context_tokens, status.decode_tok_s, bool(status.decode_exact)))
        if len(self._trends) > MAX_TRENDS:  # forget trends of sessions that are gone
            for old in list(self._trends)[: -MAX_TRENDS // 2]:
                del self._trends[old]
        return trend

    def _remember(self, key: ModelKey, status: ModelStatus) -> None:
        """Keep the model as it was before its context size last changed (to explain an offload)."""
        if not status.context_length:
            return  # unknown (e.g. while loading): neither a change nor a new reference
        last = self._last_status.get(key)
        if last is not None and last.context_length != status.context_length:
            self._before_change[key] = last
        self._last_status[key] = status

    def _with_alert_kinds(
        self, sessions: Sequence[SessionRecord], alerts: Sequence[Alert]
    ) -> list[SessionRecord]:
        """The changed sessions, with the kinds of the alerts raised on their model now."""
        changed = {s.id: s for s in sessions}
        kinds: dict[ModelKey, set[str]] = {}
        for alert in alerts:
            if alert.model is not None:
                kinds.setdefault((alert.server, alert.model), set()).add(alert.kind)
        for (server, model), found in kinds.items():
            record = self.sessions.note_alerts(server, model, found)
            if record is not None:
                changed[record.id] = record
        return list(changed.values())


def model_status(
    model: ModelReading,
    rate: RateEstimate,
    placement: Placement,
    session_id: str | None,
    server_pid: int | None,
    plain_baseline: Baseline | None = None,
) -> ModelStatus:
    """The one place a `ModelStatus` is made: the reading, its rates, its placement, its session
    (and, for speculative decoding, the plain-decode baseline its speed-up is measured against)."""
    file_facts = model.facts  # exact facts, when the server or the model file gave them
    return ModelStatus(
        name=model.name,
        phase=rate.phase,
        size_bytes=model.size_bytes,
        weights_bytes=weights_bytes(model),
        vram_bytes=placement.vram_bytes,
        gpu_fraction=placement.gpu_fraction,
        gpu_fraction_source=placement.gpu_fraction_source,
        context_length=model.context_length,
        context_tokens=rate.context_tokens,
        quantization=_quantization(model),
        parameter_count=model.parameter_count or (file_facts.parameter_count if file_facts else None),
        bytes_per_token=placement.facts.bytes_per_token if placement.facts else None,
        bytes_per_token_exact=bool(file_facts and file_facts.exact),
        ceiling_tok_s=placement.ceiling_tok_s,
        full_gpu_ceiling_tok_s=placement.full_gpu_ceiling_tok_s,
        decode_tok_s=rate.decode_tok_s,
        decode_total_tok_s=rate.decode_total_tok_s,
        active_streams=rate.active_streams,
        decode_exact=rate.decode_exact,
        last_decode_tok_s=rate.last_decode_tok_s,
        last_decode_context_tokens=rate.last_decode_context_tokens,
        prompt_tok_s=rate.prompt_tok_s,
        prompt_exact=rate.prompt_exact,
        ttft_s=rate.ttft_s,
        ttft_exact=rate.ttft_exact,
        draft_acceptance=rate.draft_acceptance,
        spec_type=model.spec_type,
        spec_speedup=spec_speedup(model.spec_type, rate, plain_baseline),
        prefill=rate.prefill,
        session_id=session_id,
        live_rate_reason=model.live_rate_reason,
        server_pid=server_pid,
        facts=placement.facts,
    )


def hardware_label(machine: Machine) -> str:
    """A short, stable description of the hardware, used to compare sessions."""
    parts = [machine.label]
    if machine.fast_bandwidth_gbps:
        parts.append(f"{machine.fast_bandwidth_gbps:.0f} GB/s")
    return " @ ".join(parts)


def spec_speedup(spec_type: str | None, rate: RateEstimate, plain: Baseline | None) -> float | None:
    """Speculative decoding's speed-up: this single stream's decode rate ÷ the plain-decode baseline
    (an earlier session of the same model, quantization and hardware without it, at comparable
    context). None without speculative decoding, a baseline or a rate; below 1 it costs speed."""
    if spec_type is None or plain is None or plain.spec_type is not None or plain.decode_tok_s <= 0:
        return None
    if rate.active_streams > 1:
        return None  # batching lowers the per-stream rate: not the drafter's doing
    decode = rate.decode_tok_s if rate.decode_tok_s is not None else rate.last_decode_tok_s
    return None if decode is None else decode / plain.decode_tok_s


def _quantization(model: ModelReading) -> str | None:
    return model.quantization or (model.facts.quantization if model.facts else None)


def _complete_request(
    record: RequestRecord, session_id: str | None, placement: Placement | None, machine: Machine
) -> RequestRecord:
    """A finished request with its session and the ceiling at its own context depth."""
    if placement is None:
        return replace(record, session_id=session_id)
    return replace(
        record,
        session_id=session_id,
        ceiling_tok_s=ceiling_for(placement.facts, record.context_tokens, machine, placement.gpu_fraction),
        gpu_fraction=placement.gpu_fraction,
    )


def _with_bench(
    server: ServerStatus, calibrations: Mapping[ModelKey, float], rates: Mapping[ModelKey, float]
) -> ServerStatus:
    """The server's models with their benched efficiency and decode rate here, where benched."""
    if not calibrations and not rates:
        return server
    models = tuple(
        replace(
            m,
            calibrated_efficiency=calibrations.get((server.url, m.name)),
            bench_decode_tok_s=rates.get((server.url, m.name)),
        )
        for m in server.models
    )
    return replace(server, models=models)
