"""One tick: readings → statuses with ceilings → findings → alerts → Snapshot.

Pure: the monitor does the I/O (polling servers, reading the GPU, the store)
and hands this module readings and times; this module never blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from trayapp.core import physics
from trayapp.core.diagnose import Baseline, ModelView, diagnose_hardware, diagnose_model, diagnose_server
from trayapp.core.episodes import EpisodeTracker, alerts_now
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Alert,
    Finding,
    HardwareSnapshot,
    ModelFacts,
    ModelStatus,
    RequestRecord,
    ServerReading,
    ServerStatus,
    SessionRecord,
    Snapshot,
)
from trayapp.core.session import SessionEngine
from trayapp.core.thresholds import Thresholds

TREND_POINTS = 400  # (context, rate) points kept per session for the KV trend
BASELINE_REFRESH_S = 120.0
FULL_GPU_SNAP = 0.9  # NVML-derived GPU shares above this are read as "all on the GPU"

BaselineLookup = Callable[[ServerStatus, ModelStatus, Machine], "Baseline | None"]


@dataclass(frozen=True)
class TickOutput:
    snapshot: Snapshot
    sessions: tuple[SessionRecord, ...]  # started, changed or ended at this tick


class Pipeline:
    def __init__(
        self,
        thresholds: Thresholds | None = None,
        *,
        idle_gap_s: float = 60.0,
        one_shot: bool = False,
        baseline_lookup: BaselineLookup | None = None,
    ) -> None:
        self.thresholds = thresholds or Thresholds()
        self.one_shot = one_shot
        self.baseline_lookup = baseline_lookup
        self.sessions = SessionEngine(idle_gap_s=idle_gap_s)
        self.episodes = EpisodeTracker(self.thresholds.confirm_s, self.thresholds.clear_s)
        self._trends: dict[str, deque[tuple[int, float]]] = {}
        self._last_status: dict[tuple[str, str], ModelStatus] = {}
        self._before_change: dict[tuple[str, str], ModelStatus] = {}
        self._was_up: dict[str, bool] = {}
        self._baselines: dict[str, tuple[float, Baseline | None]] = {}

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
    ) -> TickOutput:
        servers: list[ServerStatus] = []
        requests: list[RequestRecord] = []
        sessions: list[SessionRecord] = []
        findings: list[Finding] = []

        for reading in readings:
            machine = machines.get(reading.url, default_machine)
            result = self.sessions.update(reading, now_mono_s, now_wall_s)
            sessions.extend(result.sessions)
            models: list[ModelStatus] = []
            share_sources: dict[str, str | None] = {}
            for status in result.models:
                status, share_sources[status.name] = self._with_gpu_share(status, hardware, machine)
                status = self._with_ceilings(status, machine)
                models.append(status)
            server = ServerStatus(
                kind=reading.kind,
                url=reading.url,
                status=reading.status,
                reason=reading.reason,
                version=reading.version,
                models=tuple(models),
                pid=reading.pid,
                age_s=reading.age_s,
            )
            servers.append(server)
            by_name = {m.name: m for m in models}
            server_requests = [
                self._complete_request(r, by_name.get(r.model), machine) for r in result.requests
            ]
            requests.extend(server_requests)

            findings.extend(diagnose_server(server, self._was_up.get(server.url, False)))
            if server.status == "ok":
                self._was_up[server.url] = True
            for status in models:
                self._remember(server.url, status)  # first: a context change seen now explains now
                view = self._view(server, status, machine, hardware, server_requests, now_mono_s)
                view = replace(view, gpu_fraction_source=share_sources.get(status.name))
                findings.extend(diagnose_model(view, self.thresholds))

        hardware_findings = diagnose_hardware(hardware, self.thresholds)
        local = {r.url for r in readings if r.url not in machines}
        if any(f.kind == "offload" and f.server in local for f in findings):
            # A local model already spilled: that alert says the VRAM is full, and why.
            hardware_findings = [f for f in hardware_findings if f.kind != "vram_pressure"]
        findings.extend(hardware_findings)
        alerts: tuple[Alert, ...]
        ended: tuple[Alert, ...] = ()
        if self.one_shot:
            alerts = alerts_now(findings, now_wall_s)
        else:
            alerts, ended = self.episodes.update(findings, now_mono_s, now_wall_s)

        sessions = self._annotate_sessions(sessions, servers, machines, default_machine, alerts)
        snapshot = Snapshot(
            t_wall_s=now_wall_s,
            t_mono_s=now_mono_s,
            servers=tuple(servers),
            hardware=hardware,
            alerts=alerts,
            requests=tuple(requests),
            ended_alerts=ended,
        )
        return TickOutput(snapshot, tuple(sessions))

    # ------------------------------------------------------------------ helpers

    def _with_gpu_share(
        self, status: ModelStatus, hardware: HardwareSnapshot, machine: Machine
    ) -> tuple[ModelStatus, str | None]:
        if status.gpu_fraction is not None:
            return status, "server"
        if not machine.has_gpu or machine.unified_memory or not hardware.gpus or status.server_pid is None:
            return status, None
        if not any(g.vendor == "nvidia" for g in hardware.gpus):
            return status, None
        facts = status.facts
        if facts is None:
            return status, None
        used = [
            p.used_bytes
            for g in hardware.gpus
            for p in g.processes
            if p.pid == status.server_pid and p.used_bytes is not None
        ]
        if not used:
            # NVML often cannot see a server's process (containers, WSL, other users): that is
            # "unknown", not "all on the CPU".
            return status, None
        kv = physics.kv_cache_bytes(facts.kv, status.context_length or 0, machine.kv_type)
        share = sum(used) / physics.required_bytes(facts.weights_bytes, kv)
        share = 1.0 if share >= FULL_GPU_SNAP else max(0.0, share)
        return replace(status, gpu_fraction=share, vram_bytes=sum(used)), "nvml"

    def _with_ceilings(self, status: ModelStatus, machine: Machine) -> ModelStatus:
        facts = _facts_or_size(status)
        if facts is None:
            return status
        context = status.context_tokens or 0
        fraction = status.gpu_fraction if (machine.has_gpu and status.gpu_fraction is not None) else 1.0
        if machine.unified_memory:
            fraction = 1.0
        ceiling = physics.ceiling_at_context_tok_s(
            facts, context, machine.fast_bandwidth_gbps, machine.kv_type, fraction, machine.ram_bandwidth_gbps
        )
        full = physics.ceiling_at_context_tok_s(facts, context, machine.fast_bandwidth_gbps, machine.kv_type)
        return replace(
            status,
            ceiling_tok_s=ceiling,
            full_gpu_ceiling_tok_s=full,
            bytes_per_token=status.bytes_per_token or facts.bytes_per_token,
            facts=facts,
        )

    def _complete_request(
        self, record: RequestRecord, status: ModelStatus | None, machine: Machine
    ) -> RequestRecord:
        if status is None or status.facts is None:
            return replace(record, gpu_fraction=status.gpu_fraction if status else None)
        fraction = status.gpu_fraction if status.gpu_fraction is not None and machine.has_gpu else 1.0
        ceiling = physics.ceiling_at_context_tok_s(
            status.facts,
            record.context_tokens or 0,
            machine.fast_bandwidth_gbps,
            machine.kv_type,
            fraction,
            machine.ram_bandwidth_gbps,
        )
        return replace(record, ceiling_tok_s=ceiling, gpu_fraction=status.gpu_fraction)

    def _view(
        self,
        server: ServerStatus,
        status: ModelStatus,
        machine: Machine,
        hardware: HardwareSnapshot,
        requests: Sequence[RequestRecord],
        now_mono_s: float,
    ) -> ModelView:
        key = (server.url, status.name)
        trend = self._trend(
            status, [r for r in requests if r.model == status.name], fresh=server.age_s is None
        )
        others = [
            p
            for g in hardware.gpus
            for p in g.processes
            if p.pid != status.server_pid and p.pid != server.pid
        ]
        throttles = tuple(reason for g in hardware.gpus for reason in g.throttle_reasons)
        load_s = max((r.load_s for r in requests if r.model == status.name and r.load_s), default=None)
        return ModelView(
            server=server,
            model=status,
            machine=machine,
            previous=self._before_change.get(key),
            trend=tuple(trend),
            baseline=self._baseline(server, status, machine, now_mono_s),
            other_gpu_processes=others,
            load_s=load_s,
            cpu_percent=hardware.host.cpu_percent,
            throttle_reasons=throttles,
        )

    def _trend(
        self, status: ModelStatus, requests: Sequence[RequestRecord], fresh: bool = True
    ) -> deque[tuple[int, float]]:
        """(context, single-stream decode rate) points of the model's session, oldest first.

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
                trend.append((record.context_tokens, record.decode_tok_s))
        single = status.active_streams <= 1
        if (
            status.phase == "decoding"
            and single
            and status.decode_tok_s
            and status.context_tokens is not None
        ):
            trend.append((status.context_tokens, status.decode_tok_s))
        # Forget trends of sessions that are gone.
        if len(self._trends) > 64:
            for old in list(self._trends)[:-32]:
                del self._trends[old]
        return trend

    def _baseline(
        self, server: ServerStatus, status: ModelStatus, machine: Machine, now_mono_s: float
    ) -> Baseline | None:
        if self.baseline_lookup is None or status.session_id is None or status.phase != "decoding":
            return None
        cached = self._baselines.get(status.session_id)
        if cached is not None and now_mono_s - cached[0] < BASELINE_REFRESH_S:
            return cached[1]
        baseline = self.baseline_lookup(server, status, machine)
        self._baselines[status.session_id] = (now_mono_s, baseline)
        return baseline

    def _remember(self, url: str, status: ModelStatus) -> None:
        """Keep the model as it was before its context size last changed (to explain an offload)."""
        if not status.context_length:
            return  # unknown (e.g. while loading): neither a change nor a new reference
        key = (url, status.name)
        last = self._last_status.get(key)
        if last is not None and last.context_length != status.context_length:
            self._before_change[key] = last
        self._last_status[key] = status

    def _annotate_sessions(
        self,
        sessions: list[SessionRecord],
        servers: Sequence[ServerStatus],
        machines: Mapping[str, Machine],
        default_machine: Machine,
        alerts: Sequence,
    ) -> list[SessionRecord]:
        statuses = {(s.url, m.name): m for s in servers for m in s.models}
        out: list[SessionRecord] = []
        for session in sessions:
            status = statuses.get((session.server, session.model))
            machine = machines.get(session.server, default_machine)
            kinds = {a.kind for a in alerts if a.server == session.server and a.model == session.model}
            changes: dict[str, object] = {"hardware": hardware_label(machine)}
            if status is not None and status.facts is not None:
                fraction = status.gpu_fraction if status.gpu_fraction is not None and machine.has_gpu else 1.0
                changes["ceiling_tok_s"] = physics.ceiling_at_context_tok_s(
                    status.facts,
                    0,
                    machine.fast_bandwidth_gbps,
                    machine.kv_type,
                    fraction,
                    machine.ram_bandwidth_gbps,
                )
            merged = replace(session, **changes, alerts=tuple(sorted(set(session.alerts) | kinds)))  # type: ignore[arg-type]
            if session.ended_wall_s is None:
                self.sessions.set_session_details(
                    session.server,
                    session.model,
                    hardware=merged.hardware,
                    ceiling_tok_s=merged.ceiling_tok_s,
                    alerts=merged.alerts,
                )
            out.append(merged)
        return out


def hardware_label(machine: Machine) -> str:
    """A short, stable description of the hardware, used to compare sessions."""
    parts = [machine.label]
    if machine.fast_bandwidth_gbps:
        parts.append(f"{machine.fast_bandwidth_gbps:.0f} GB/s")
    return " @ ".join(parts)


def _facts_or_size(status: ModelStatus) -> ModelFacts | None:
    if status.facts is not None:
        return status.facts
    weights = status.weights_bytes or status.size_bytes
    if not weights:
        return None
    return ModelFacts(weights_bytes=weights, bytes_per_token=weights, exact=False, source="size")
