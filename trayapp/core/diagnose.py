"""Detectors: "why is my model slow?" in numbers.

Each detector looks at one model (or one GPU, or one server) at one instant
and returns `Finding`s with the evidence, the cause in plain words and a
computed fix. The offload detector and its cause/fix arithmetic live in
`offload.py`, the KV-slowdown and context-full detectors in `context_detectors.py`, the
GPU-wide `vram_pressure` detector in `vram_pressure.py`; the memory between ticks (trends,
the model before a change) in `diagnosis_tracker.py`; the episode rules (confirmation,
hysteresis) in `episodes.py`. This module is stateless.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from statistics import median
from typing import NamedTuple

from trayapp.core.alert_kinds import ALERT_KINDS, AlertKindName
from trayapp.core.context_detectors import context_full, kv_slowdown
from trayapp.core.fixes import NVIDIA_SMI_PERFORMANCE, no_speculation_commands, report_command
from trayapp.core.hardware_readings import GpuProcess
from trayapp.core.machine import Machine
from trayapp.core.model import Baseline, Finding, ModelStatus, ServerStatus
from trayapp.core.offload import offload_finding
from trayapp.core.peers import PeerBand, peer_band_json
from trayapp.core.physics import REALISTIC_BAND
from trayapp.core.server_kinds import engine_label, judged_by_request, server_label
from trayapp.core.thresholds import Thresholds
from trayapp.core.throttle import Throttle
from trayapp.core.units import GB, format_rate
from trayapp.core.vram_holders import HolderSnapshot

GPU_WORKLOAD_BYTES = GB  # holding this much VRAM marks a real GPU workload (another model, a game)
GENERIC_EFFICIENCY = (REALISTIC_BAND[0] + REALISTIC_BAND[1]) / 2  # 0.675: the middle of 60–75 %


# --------------------------------------------------------------------------- calibration


def usable_calibration(calibrated_efficiency: float | None) -> float | None:
    """The calibrated efficiency when it is a share of the ceiling (0 < e ≤ 1), else None."""
    if calibrated_efficiency is None or not 0.0 < calibrated_efficiency <= 1.0:
        return None
    return calibrated_efficiency


def calibration_factor(calibrated_efficiency: float | None) -> float:
    """How far this (model, hardware) sits from the generic healthy share: its benched efficiency at
    depth 0 ÷ 0.675; 1 without a (usable) calibration."""
    usable = usable_calibration(calibrated_efficiency)
    return 1.0 if usable is None else usable / GENERIC_EFFICIENCY


def healthy_band_shares(calibrated_efficiency: float | None) -> tuple[float, float]:
    """The realistic band as shares of the ceiling: 60–75 %, or centred on the calibrated efficiency
    (the same band scaled by `calibration_factor`)."""
    factor = calibration_factor(calibrated_efficiency)
    return REALISTIC_BAND[0] * factor, REALISTIC_BAND[1] * factor


def low_efficiency_share(t: Thresholds, calibrated_efficiency: float | None) -> float:
    """The share of the ceiling under which `low_efficiency` fires: `low_efficiency_ratio`, scaled by
    `calibration_factor` (ratio ÷ 0.675 × the calibrated efficiency)."""
    return t.low_efficiency_ratio * calibration_factor(calibrated_efficiency)


def band_text(calibrated_efficiency: float | None) -> str:
    low, high = healthy_band_shares(calibrated_efficiency)
    return f"{low * 100:.0f}–{high * 100:.0f} %"


class TrendPoint(NamedTuple):
    """One single-stream decode rate of a session, at its context depth: a polled tick's, or a
    finished request's over its whole decode (`request`)."""

    context_tokens: int
    decode_tok_s: float
    exact: bool  # server-reported (a finished request's timings) rather than polled
    request: bool = False  # a finished request's own rate, not a tick's
    decode_s: float = 0.0  # that request's decode seconds, where known


ESTIMATE_MARGIN_PCT = 10.0  # a polled rate is within ~10 % of the server's own (tested on a busy host)
REGRESSION_EVIDENCE = 3  # the fastest of this many newest rates must still be below the mark...
REGRESSION_EVIDENCE_S = 3.0  # ...or of the newest finished requests that decoded this long together


@dataclass(frozen=True)
class ModelView:
    """Everything the detectors may look at for one model: its status (with its GPU share's source
    and its benched calibration) and what the status cannot hold (earlier ticks, the machine, other
    processes)."""

    server: ServerStatus
    model: ModelStatus
    machine: Machine
    previous: ModelStatus | None = None  # the same model at an earlier tick (before a change)
    trend: Sequence[TrendPoint] = ()  # this session's single-stream decode rates, oldest first
    baseline: Baseline | None = None
    other_gpu_processes: Sequence[GpuProcess] = ()  # VRAM holders that are not this server
    vram_holders: HolderSnapshot | None = None  # those holders when the model loaded or spilled
    load_s: float | None = None  # model load time paid by a request just now
    cpu_percent: float | None = None
    throttle_reasons: Sequence[str] = ()
    throttle: Throttle | None = None  # what holds this machine's hardware back now (core/throttle.py)


# --------------------------------------------------------------------------- per model


def diagnose_model(view: ModelView, t: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    for detector in (
        offload_finding,
        kv_slowdown,
        context_full,
        _below_floor,
        _low_efficiency,
        _draft_acceptance,
        _regression,
        _cold_load,
    ):
        finding = detector(view, t)
        if finding is not None:
            findings.append(finding)
    return without_explained(findings, {f.kind for f in findings})


def without_explained(findings: Sequence[Finding], explaining: Collection[AlertKindName]) -> list[Finding]:
    """`findings` less those a finding of an `explaining` kind explains (`AlertKind.suppressed_by`):
    one root cause per model (and, for a GPU-wide kind, per machine)."""
    return [f for f in findings if ALERT_KINDS[f.kind].suppressed_by.isdisjoint(explaining)]


def _below_floor(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    rate = model.decode_tok_s
    if model.phase != "decoding" or rate is None or rate >= t.below_floor_tok_s:
        return None
    message = (
        f"{model.name} decodes at {rate:.1f} tok/s: below {t.below_floor_tok_s:g} tok/s, "
        "streaming feels broken rather than slow."
    )
    fix = "Use a smaller model or quantization; check the dashboard for offload or throttling."
    cause = None
    if model.spec_type and model.draft_acceptance is None:
        # llama-server counts drafts only when a request ends: until then, the drafter is a suspect
        cause = (
            f"speculative decoding ({model.spec_type}) is on and its acceptance is not known yet: "
            "a drafter whose drafts are rejected slows every step"
        )
        fix += " Or compare without speculative decoding (--spec-type none)."
        commands = no_speculation_commands(view.server.kind, model.name, router=view.server.router)
    else:
        commands = ()
    evidence: dict[str, object] = {"decode_tok_s": round(rate, 2), "floor_tok_s": t.below_floor_tok_s}
    if view.throttle is not None:
        cause = view.throttle.text if cause is None else f"{cause}; {view.throttle.text}"
        message += f" Held back: {view.throttle.text}."
        evidence["throttle"] = view.throttle.evidence
    return Finding(
        "below_floor",
        "critical",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause=cause,
        score=-rate,
        fix_commands=commands,
    )


def _low_efficiency(view: ModelView, t: Thresholds) -> Finding | None:
    model, machine = view.model, view.machine
    if not machine.has_gpu or model.phase != "decoding":
        return None
    if model.active_streams > 1:
        return None  # batching lowers the per-stream rate by design (DOMAIN.md §6)
    if model.gpu_fraction is not None and model.gpu_fraction < t.offload_gpu_fraction:
        return None
    rate, ceiling = model.decode_tok_s, model.ceiling_tok_s
    calibrated = usable_calibration(model.calibrated_efficiency)
    # Without a bench here, the published peers' median stands in for the calibration (#23).
    peers = model.peer_band if calibrated is None else None
    reference = calibrated if calibrated is not None else (peers.median_share if peers else None)
    if rate is None or not ceiling or rate >= low_efficiency_share(t, reference) * ceiling:
        return None
    clues: list[str] = []
    if view.throttle_reasons:
        detail = f": {view.throttle.text}" if view.throttle is not None else ""
        clues.append("the GPU is throttling (" + ", ".join(view.throttle_reasons) + ")" + detail)
    elif view.throttle is not None:
        clues.append(view.throttle.text)
    # Holding ≥ 1 GB of VRAM marks a real GPU workload (another model, a game), not a desktop.
    busy = [p for p in view.other_gpu_processes if p.used_bytes and p.used_bytes >= GPU_WORKLOAD_BYTES]
    if busy:
        clues.append("other processes use the GPU: " + ", ".join(f"{p.name or p.pid}" for p in busy[:3]))
    if view.cpu_percent is not None and view.cpu_percent >= 90:
        clues.append(f"the CPU is saturated ({view.cpu_percent:.0f} %)")
    if model.gpu_fraction is None:
        clues.append("part of the model may be on the CPU (the server does not report its GPU share)")
    cause = "; ".join(clues) if clues else None
    share = rate / ceiling
    message = (
        f"{model.name} decodes at {format_rate(rate)} tok/s, {share * 100:.0f} % of its "
        f"{format_rate(ceiling)} tok/s ceiling; "
        + (
            f"it reached {calibrated * 100:.0f} % when benched here (healthy: {band_text(calibrated)})."
            if calibrated is not None
            else _peers_text(peers)
            if peers is not None
            else f"a healthy GPU reaches {band_text(None)}."
        )
    )
    if cause:
        message += f" Likely: {cause}."
    fix = (
        f"Check cooling and power limits ({NVIDIA_SMI_PERFORMANCE}), close other GPU work, update the server."
    )
    if peers is not None and share < peers.min_share and peers.causes:
        message += f" That is below every published peer; usually: {'; '.join(peers.causes[:3])}."
        fix = f"Try first: {peers.causes[0]}. {fix}"
    evidence = {
        "decode_tok_s": round(rate, 2),
        "ceiling_tok_s": round(ceiling, 2),
        "efficiency": round(share, 3),
        "calibrated_efficiency": None if calibrated is None else round(calibrated, 3),
        "peer_band": None if peers is None else peer_band_json(peers),
        "throttle_reasons": list(view.throttle_reasons),
        "cpu_percent": view.cpu_percent,
        "throttle": view.throttle.evidence if view.throttle is not None else None,
    }
    return Finding(
        "low_efficiency",
        "warning",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause,
        1 - share,
        fix_commands=(NVIDIA_SMI_PERFORMANCE,),
    )


def _peers_text(band: PeerBand) -> str:
    """ "its peers on M2 Max, Q4 reach 52–62 % (median 58 %, n=14)." """
    return (
        f"its peers on {band.basis} reach {band.low_share * 100:.0f}–{band.high_share * 100:.0f} % "
        f"(median {band.median_share * 100:.0f} %, n={band.n})."
    )


def _draft_acceptance(view: ModelView, t: Thresholds) -> Finding | None:
    """Speculative decoding that does not pay: few drafted tokens accepted, or decode measured slower
    than the same model's plain decode (an earlier session without it)."""
    model = view.model
    rate, speedup = model.draft_acceptance, model.spec_speedup
    low_acceptance = rate is not None and rate < t.draft_acceptance_min
    slower = speedup is not None and speedup < t.spec_min_speedup
    if not (low_acceptance or slower):
        return None
    kind = model.spec_type
    what = f"Speculative decoding ({kind})" if kind else "Speculative decoding"
    if low_acceptance:
        assert rate is not None
        message = (
            f"{what} on {model.name} accepts only {rate * 100:.0f} % of drafted tokens: {_spec_cost(kind)}"
        )
    else:
        message = f"{what} on {model.name} costs more than it saves: {_spec_cost(kind)}"
    if speedup is not None:
        message += f"; decode runs at {speedup:.2f}× the plain decode of an earlier session."
    else:
        message += ", and may make decode slower than without it."
    evidence = {
        "draft_acceptance": None if rate is None else round(rate, 3),
        "min_acceptance": t.draft_acceptance_min,
        "spec_type": kind,
        "speedup": None if speedup is None else round(speedup, 3),
    }
    score = max(1 - rate if rate is not None else 0.0, 1 - speedup if speedup is not None else 0.0)
    return Finding(
        "draft_acceptance",
        "warning",
        view.server.url,
        model.name,
        message,
        _spec_fix(kind),
        evidence,
        score=score,
        fix_commands=no_speculation_commands(view.server.kind, model.name, router=view.server.router),
    )


def _spec_cost(kind: str | None) -> str:
    """What a rejected draft costs, by kind of speculative decoding."""
    if kind and kind.startswith("ngram"):
        return "every rejected n-gram guess costs a wasted verification step"
    if kind == "draft-mtp":
        return "the MTP heads (a few hundred MB) run every step, and rejected drafts are wasted work"
    return "the draft model costs memory and time on every step"


def _spec_fix(kind: str | None) -> str:
    if kind and kind.startswith("ngram"):
        return (
            "n-gram drafting only pays off on repetitive text (code edits, quotes): turn it off for this "
            "workload (--spec-type none) or draft fewer tokens (--spec-draft-n-max)."
        )
    return (
        "Draft fewer tokens (--spec-draft-n-max, formerly --draft-max), try a better-matched drafter, "
        "or run without speculative decoding (--spec-type none)."
    )


def regression_evidence(view: ModelView) -> list[TrendPoint]:
    """The rates `_regression` judges, oldest first; [] while there is not enough to judge.

    Where each finished request's own rate is seen (`judged_by_request`, or some already are), the
    newest finished requests that together decoded `REGRESSION_EVIDENCE_S`, at most
    `REGRESSION_EVIDENCE` of them: a busy host's ticks dip 30-40 % below the same request's own
    average (seen beside a busy loop), and a slower build shows in whole requests anyway. Elsewhere
    (vLLM, SGLang without the proxy) the newest `REGRESSION_EVIDENCE` polled ticks."""
    trend = list(view.trend)
    requests = [p for p in trend if p.request]
    if not requests and not judged_by_request(view.server.kind):
        return trend[-REGRESSION_EVIDENCE:] if len(trend) >= REGRESSION_EVIDENCE else []
    decoded_s = 0.0
    for count, point in enumerate(reversed(requests), start=1):
        decoded_s += point.decode_s
        if count == REGRESSION_EVIDENCE or decoded_s >= REGRESSION_EVIDENCE_S:
            return requests[-count:]
    return []


def _regression(view: ModelView, t: Thresholds) -> Finding | None:
    """Slower than the baseline, like with like: exact rates against an exact baseline need
    `regression_pct`; anything estimated needs `ESTIMATE_MARGIN_PCT` more (a poll's error is no
    regression). The fastest of the rates judged (`regression_evidence`) must be that slow, so one
    noisy tick or short request raises nothing; the figure is their median."""
    base = view.baseline
    model = view.model
    if base is None or base.decode_tok_s <= 0:
        return None
    newest = regression_evidence(view)
    if not newest:
        return None
    now_ctx = median(p.context_tokens for p in newest)
    if base.context_tokens is not None and abs(now_ctx - base.context_tokens) > max(
        1024, 0.5 * base.context_tokens
    ):
        return None  # a deeper context is slower anyway (kv_slowdown's business), not a regression
    exact = base.exact and all(p.exact for p in newest)
    needed_pct = t.regression_pct + (0.0 if exact else ESTIMATE_MARGIN_PCT)
    if (1 - max(p.decode_tok_s for p in newest) / base.decode_tok_s) * 100 < needed_pct:
        return None
    # rounded once: the message and the evidence show the same figures (15.4999 read "15" in the
    # message and 15.5, "16", in the evidence)
    now_rate = round(median(p.decode_tok_s for p in newest), 2)
    base_rate = round(base.decode_tok_s, 2)
    drop = 1 - now_rate / base_rate
    old_v, new_v = base.server_version, view.server.version
    engine = engine_label(view.server.kind)
    versions = bool(old_v and new_v and old_v != new_v)
    kind = "bench" if base.source == "bench" else "session"
    baseline = f"{kind + ' ' if kind == 'bench' else ''}baseline on this hardware at a comparable context"
    if versions:  # the build that made it slower, named first
        message = (
            f"{model.name} is slower since {engine} {old_v} → {new_v}: {format_rate(base_rate)} → "
            f"{format_rate(now_rate)} tok/s, {drop * 100:.0f} % below its {baseline}."
        )
    else:
        message = (
            f"{model.name} decodes at {format_rate(now_rate)} tok/s, {drop * 100:.0f} % below its "
            f"{format_rate(base_rate)} tok/s {baseline}."
        )
    fix = (
        f"Compare with the earlier {engine} build ({old_v}): run it again to confirm, check the release "
        "notes between the two, and report it upstream with `llm-tray report`."
        if versions
        else f"Check what changed since the baseline {kind}: drivers, server flags, other GPU work."
    )
    commands = (report_command(model.session_id),) if versions else ()
    cause = None
    if view.throttle is not None:
        cause = view.throttle.text
        message += f" Held back now: {cause}."
        fix = "Check cooling and power limits before suspecting the server. " + fix
    evidence: dict[str, object] = {
        "decode_tok_s": now_rate,
        "baseline_tok_s": base_rate,
        "drop_pct": round(drop * 100, 1),
        "baseline_session": base.session_id,
        "baseline_source": base.source,
        "exact": exact,
        "needed_pct": needed_pct,
        "baseline_version": old_v,
        "version": new_v,
        "engine": engine,
        "throttle": view.throttle.evidence if view.throttle is not None else None,
    }
    return Finding(
        "regression",
        "warning",
        view.server.url,
        model.name,
        message,
        fix,
        evidence,
        cause=cause,
        score=drop,
        fix_commands=commands,
    )


def _cold_load(view: ModelView, t: Thresholds) -> Finding | None:
    model = view.model
    if view.load_s is not None and view.load_s >= t.cold_load_min_s:
        message = f"A request to {model.name} waited {view.load_s:.1f} s for the model to load."
        fix = "Keep the model loaded longer (Ollama keep_alive / OLLAMA_KEEP_ALIVE, LM Studio TTL)."
        return Finding(
            "cold_load", "info", view.server.url, model.name, message, fix, {"load_s": view.load_s}
        )
    if model.phase == "loading" and view.server.status == "loading":  # a router's loads are timed instead
        message = f"{model.name} is loading; requests wait until it is in memory."
        return Finding(
            "cold_load", "info", view.server.url, model.name, message, "Wait, or keep it loaded.", {}
        )
    return None


# --------------------------------------------------------------------------- server


def diagnose_server(server: ServerStatus, was_up: bool) -> list[Finding]:
    if server.status in ("unreachable", "error") and was_up:
        name = server_label(server.kind)
        message = f"{name} at {server.url} stopped answering: {server.reason or server.status}."
        fix = "Check that the server is running; llm-tray reconnects by itself when it is back."
        evidence = {"status": server.status, "reason": server.reason}
        return [Finding("server_down", "warning", server.url, None, message, fix, evidence)]
    return []
