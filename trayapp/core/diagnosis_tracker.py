"""The diagnosis stage: this tick's findings, and what diagnosis remembers between ticks.

The detectors (`diagnose.py`) are stateless: each looks at one `ModelView`. This stage builds the
views and keeps their memory, the way `EpisodeTracker` keeps the alerts': each session's decode
trend (for the KV slowdown and the regression), each model as it was before its context size last
changed (to explain an offload) and whether each server was ever up (to tell "stopped answering"
from "never answered"). It also applies the alert-kind table's `suppressed_by` rule across models:
a GPU-wide finding (`vram_pressure`) is dropped when a model on this machine has a finding that
explains it (an offload).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trayapp.core.alert_kinds import AlertKindName
from trayapp.core.context_detectors import resolved_kinds
from trayapp.core.diagnose import ModelView, TrendPoint, diagnose_model, diagnose_server, without_explained
from trayapp.core.episodes import Key as EpisodeKey
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.machine import Machine
from trayapp.core.model import Baseline, Finding, ModelKey, ModelStatus, RequestRecord, ServerStatus
from trayapp.core.overflow import OverflowWatch, overflow_finding
from trayapp.core.thresholds import Thresholds
from trayapp.core.throttle import throttle_cause
from trayapp.core.vram_holders import HolderSnapshot, keep_snapshot
from trayapp.core.vram_pressure import diagnose_hardware

TREND_POINTS = 400  # (context, rate) points kept per session for the KV trend
MAX_TRENDS = 64  # sessions whose trend is kept; the oldest are forgotten beyond this


@dataclass(frozen=True)
class ServerDiagnosisInput:
    """One server at this tick, as the diagnosis stage reads it."""

    status: ServerStatus  # with its models' statuses
    requests: Sequence[RequestRecord]  # the requests that finished at this tick
    machine: Machine
    local: bool  # on this machine: its findings can explain a GPU-wide one


@dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...]
    resolved: frozenset[EpisodeKey]  # (kind, server, model) whose cause is certainly gone now


class DiagnosisTracker:
    def __init__(self, thresholds: Thresholds) -> None:
        self.thresholds = thresholds
        self._trends: dict[str, deque[TrendPoint]] = {}  # by session id
        self._last_status: dict[ModelKey, ModelStatus] = {}
        self._before_change: dict[ModelKey, ModelStatus] = {}
        self._was_up: dict[str, bool] = {}  # by server URL
        self._overflows = OverflowWatch()
        self._holders: dict[ModelKey, HolderSnapshot] = {}  # GPU memory holders when each model was placed

    def update(
        self,
        servers: Sequence[ServerDiagnosisInput],
        hardware: HardwareSnapshot,
        baselines: Mapping[ModelKey, Baseline],
        now_wall_s: float,
    ) -> Diagnosis:
        """This tick's findings on every server, model and GPU. `baselines` are the store's
        comparable baselines of the models that were decoding (`Priors.baselines`)."""
        findings: list[Finding] = []
        resolved: set[EpisodeKey] = set()
        local_kinds: set[AlertKindName] = set()
        for server in servers:
            found = self._server(server, hardware, baselines, resolved, now_wall_s)
            findings.extend(found)
            if server.local:
                local_kinds.update(f.kind for f in found)
        local_servers = [server.status for server in servers if server.local]
        gpu_wide = diagnose_hardware(hardware, self.thresholds, local_servers)
        findings.extend(without_explained(gpu_wide, local_kinds))
        return Diagnosis(tuple(findings), frozenset(resolved))

    def _server(
        self,
        server_input: ServerDiagnosisInput,
        hardware: HardwareSnapshot,
        baselines: Mapping[ModelKey, Baseline],
        resolved: set[EpisodeKey],
        now_wall_s: float,
    ) -> list[Finding]:
        server = server_input.status
        findings = diagnose_server(server, self._was_up.get(server.url, False))
        if server.status == "ok":
            self._was_up[server.url] = True
        others = [
            p for g in hardware.gpus if not g.processes_rss for p in g.processes if p.pid != server.pid
        ]  # Apple's RAM users are not GPU memory holders
        throttles = tuple(reason for g in hardware.gpus for reason in g.throttle_reasons)
        throttle = throttle_cause(hardware) if server_input.local else None
        for status in server.models:
            key = (server.url, status.name)
            self._remember(key, status)  # first: a context change seen now explains now
            own = [r for r in server_input.requests if r.model == status.name]
            # a request finished now is judged too: `regression` weighs whole requests where it can
            judged = (status.phase == "decoding" or bool(own)) and status.session_id is not None
            view = ModelView(
                server=server,
                model=status,
                machine=server_input.machine,
                previous=self._before_change.get(key),
                trend=tuple(self._trend(status, own, fresh=server.age_s is None)),
                baseline=baselines.get(key) if judged else None,
                other_gpu_processes=[p for p in others if p.pid != status.server_pid],
                vram_holders=(
                    self._holders_at_placement(key, status, server, hardware, now_wall_s)
                    if server_input.local
                    else None
                ),
                load_s=max((r.load_s for r in own if r.load_s), default=None),
                cpu_percent=hardware.host.cpu_percent,
                throttle_reasons=throttles,
                throttle=throttle,
            )
            found = diagnose_model(view, self.thresholds)
            had_overflow = self._overflows.known(key)
            overflow = self._overflows.update(server, status, own, now_wall_s)
            if overflow is not None:
                local_hardware = hardware if server_input.local else None
                found.append(
                    overflow_finding(server, status, *overflow, server_input.machine, local_hardware)
                )
                found = without_explained(found, {f.kind for f in found})
            elif had_overflow:
                resolved.add(("context_overflow", server.url, status.name))  # a request fitted: over now
            findings.extend(found)
            resolved.update((kind, server.url, status.name) for kind in resolved_kinds(view))
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
                decoded = record.decode_tokens or 0
                # its rate is an average over the decode: placed at the decode's middle depth
                middle = max(record.context_tokens - decoded // 2, 0)
                trend.append(
                    TrendPoint(middle, record.decode_tok_s, record.exact, True, decoded / record.decode_tok_s)
                )
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

    def _holders_at_placement(
        self,
        key: ModelKey,
        status: ModelStatus,
        server: ServerStatus,
        hardware: HardwareSnapshot,
        now_wall_s: float,
    ) -> HolderSnapshot | None:
        """The GPU memory holders besides this model's server as they were when it loaded or was last
        placed (its GPU share moved): kept with its offload episode. None where no GPU lists processes."""
        if not any(g.processes for g in hardware.gpus) and key not in self._holders:
            return None
        if len(self._holders) > MAX_TRENDS and key not in self._holders:
            self._holders.pop(next(iter(self._holders)))  # forget the oldest model's
        kept = keep_snapshot(
            self._holders.get(key),
            status.phase == "loading",
            status.gpu_fraction,
            hardware,
            (server.pid, status.server_pid),
            now_wall_s,
        )
        self._holders[key] = kept
        return kept

    def _remember(self, key: ModelKey, status: ModelStatus) -> None:
        """Keep the model as it was before its context size last changed (to explain an offload)."""
        if not status.context_length:
            return  # unknown (e.g. while loading): neither a change nor a new reference
        last = self._last_status.get(key)
        if last is not None and last.context_length != status.context_length:
            self._before_change[key] = last
        self._last_status[key] = status
