"""One tick as explicit stages: rates → placement → sessions → statuses → diagnosis → episodes.

Each stage is a small pure module that decides its facts once and returns immutable results:
`rates.RateTracker` (speeds, phases, finished requests), `placement.place` (facts, GPU share,
ceiling), `session.SessionTracker` (sessions), `model_status` (the one `ModelStatus` per model and
tick, bench values included), `diagnosis_tracker.DiagnosisTracker` (findings, with the trends and
earlier statuses it remembers), `episodes.EpisodeTracker` (alerts). One step goes back: the
sessions note the kinds of the alerts raised on their model (`_with_alert_kinds`), so a session
record lists them.

Pure: the monitor does the I/O (polling servers, reading the GPU, looking up baselines and benches
in the store) and hands this module readings, `Priors` and times; nothing here blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from trayapp.core.diagnosis_tracker import DiagnosisTracker, ServerDiagnosisInput
from trayapp.core.energy import EnergyMeter, without_energy
from trayapp.core.episodes import EpisodeTracker, alerts_now
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.machine import Machine
from trayapp.core.model import (
    LOG_SOURCES,
    Alert,
    Baseline,
    ModelKey,
    ModelReading,
    ModelStatus,
    RequestRecord,
    ServerReading,
    ServerStatus,
    SessionRecord,
    Snapshot,
)
from trayapp.core.peers import PeerBand
from trayapp.core.phases import is_busy
from trayapp.core.placement import Placement, ceiling_for, place, weights_bytes
from trayapp.core.rates import RateEstimate, RateTracker
from trayapp.core.session import SessionInput, SessionTracker
from trayapp.core.thresholds import Thresholds


def stored_as_request(record: RequestRecord, reading: ServerReading) -> bool:
    """Whether a finished request is a row of its own. A record read from a server's log (LOG_SOURCES)
    is, only where nothing else records that request: never behind a recording proxy (which records
    every request), and from llama-server's log only a refusal (a request it ran is recorded from its
    slots). Otherwise the log's numbers only inform the diagnosis."""
    if record.source not in LOG_SOURCES:
        return True
    if reading.proxied:
        return False
    return reading.kind != "llamacpp" or (record.http_status is not None and record.http_status >= 400)


REMOTE_ENERGY = "served by another machine: its energy is not read here"


@dataclass(frozen=True)
class Priors:
    """What the store knew of each model (server URL, model name) before this tick, as data."""

    # The comparable baseline (same speculative decoding) of each model that was decoding.
    baselines: Mapping[ModelKey, Baseline] = field(default_factory=dict)
    # The plain-decode baseline of each model decoding with speculative decoding (its speed-up).
    plain_baselines: Mapping[ModelKey, Baseline] = field(default_factory=dict)
    # Benched efficiency (decode ÷ ceiling at depth 0) of each local model on this hardware.
    calibrations: Mapping[ModelKey, float] = field(default_factory=dict)
    # Benched decode rate (tok/s) at depth 0 of each local model on this hardware.
    bench_rates: Mapping[ModelKey, float] = field(default_factory=dict)
    # The published peers' band of each local model on this hardware, for its quantization (#23).
    peer_bands: Mapping[ModelKey, PeerBand] = field(default_factory=dict)


NO_PRIORS = Priors()


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
        thresholds = thresholds or Thresholds()
        self.one_shot = one_shot
        self.rates = RateTracker()
        self.sessions = SessionTracker(idle_gap_s=idle_gap_s)
        self.diagnosis = DiagnosisTracker(thresholds)
        self.episodes = EpisodeTracker(thresholds.confirm_s, thresholds.clear_s)
        self.energy = EnergyMeter()

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self.diagnosis.thresholds = thresholds
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
        *,
        priors: Priors = NO_PRIORS,
    ) -> TickOutput:
        """One tick. `machines` describes the servers on other machines (by URL); every other server
        runs on `default_machine`, this one."""
        servers: list[ServerStatus] = []
        requests: list[RequestRecord] = []
        sessions: list[SessionRecord] = []
        to_diagnose: list[ServerDiagnosisInput] = []
        local_urls: set[str] = set()
        for reading in readings:
            machine = machines.get(reading.url, default_machine)
            tick = self._server_tick(reading, hardware, machine, now_mono_s, now_wall_s, priors)
            servers.append(tick.status)
            requests.extend(r for r in tick.requests if stored_as_request(r, reading))
            sessions.extend(tick.sessions)
            local = reading.url not in machines
            if local:
                local_urls.add(reading.url)
            to_diagnose.append(ServerDiagnosisInput(tick.status, tick.requests, machine, local))
        busy = any(is_busy(m.phase) for s in servers if s.url in local_urls for m in s.models)
        energy = self.energy.update(hardware, now_mono_s, busy)
        requests = [
            self.energy.attribute(r, now_mono_s - now_wall_s)
            if r.server in local_urls
            else without_energy(r, REMOTE_ENERGY)
            for r in requests
        ]

        diagnosis = self.diagnosis.update(to_diagnose, hardware, priors.baselines, now_wall_s)
        ended: tuple[Alert, ...] = ()
        if self.one_shot:
            alerts = alerts_now(diagnosis.findings, now_wall_s)
        else:
            alerts, ended = self.episodes.update(
                diagnosis.findings, now_mono_s, now_wall_s, diagnosis.resolved
            )

        snapshot = Snapshot(
            t_wall_s=now_wall_s,
            t_mono_s=now_mono_s,
            servers=tuple(servers),
            hardware=hardware,
            alerts=alerts,
            requests=tuple(requests),
            ended_alerts=ended,
            energy=energy,
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
        priors: Priors,
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
                plain_baseline=priors.plain_baselines.get((reading.url, model.name)),
                calibrated_efficiency=priors.calibrations.get((reading.url, model.name)),
                bench_decode_tok_s=priors.bench_rates.get((reading.url, model.name)),
                peer_band=priors.peer_bands.get((reading.url, model.name)),
                proxied=reading.proxied,
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
            router=reading.router,
        )
        return _ServerTick(status, records, session_changes)

    def _with_alert_kinds(
        self, sessions: Sequence[SessionRecord], alerts: Sequence[Alert]
    ) -> list[SessionRecord]:
        """The changed sessions, with the kinds of the alerts raised on their model now (the one step
        back: a session record lists the alerts its model had)."""
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
    *,
    plain_baseline: Baseline | None = None,
    calibrated_efficiency: float | None = None,
    bench_decode_tok_s: float | None = None,
    peer_band: PeerBand | None = None,
    proxied: bool = False,
) -> ModelStatus:
    """The one place a `ModelStatus` is made: the reading, its rates, its placement, its session,
    and what a bench measured of it here (`Priors.calibrations`, `Priors.bench_rates`); for
    speculative decoding, the plain-decode baseline its speed-up is measured against. `proxied`: a
    recording proxy is in front of the server, so a prompt it cuts silently is seen after all."""
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
        parallel_slots=len(model.slots) or None,
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
        queued_requests=_queued(model),
        decode_exact=rate.decode_exact,
        last_decode_tok_s=rate.last_decode_tok_s,
        last_decode_context_tokens=rate.last_decode_context_tokens,
        prompt_tok_s=rate.prompt_tok_s,
        prompt_exact=rate.prompt_exact,
        ttft_s=rate.ttft_s,
        ttft_exact=rate.ttft_exact,
        draft_acceptance=rate.draft_acceptance,
        draft_acceptance_by_position=rate.draft_acceptance_by_position,
        spec_type=model.spec_type,
        spec_speedup=spec_speedup(model.spec_type, rate, plain_baseline),
        calibrated_efficiency=calibrated_efficiency,
        bench_decode_tok_s=bench_decode_tok_s,
        peer_band=peer_band,
        prefill=rate.prefill,
        session_id=session_id,
        live_rate_reason=model.live_rate_reason,
        server_pid=server_pid,
        facts=placement.facts,
        unseen_cuts_reason=None if proxied else model.unseen_cuts_reason,
    )


def _queued(model: ModelReading) -> int | None:
    """Requests waiting for a slot, as the server counts them (LM Studio's `lms ps`, llama-server
    `requests_deferred`, vLLM `num_requests_waiting`, SGLang `num_queue_reqs`); None where it does not say."""
    if model.queued_requests is not None:
        return model.queued_requests
    waiting = model.counters.requests_waiting if model.counters is not None else None
    return None if waiting is None or waiting < 0 else int(waiting)


def hardware_label(machine: Machine) -> str:
    """A short, stable description of the hardware, used to compare sessions and benches. A
    bandwidth from a spec, a table or the user is part of it; a measured one is not: a later,
    better measurement (a quieter moment, another process's figure) describes the same machine,
    and must not orphan every baseline and bench recorded under the earlier figure."""
    parts = [machine.label]
    if machine.fast_bandwidth_gbps and machine.sources.get("bandwidth") != "measured":
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
