"""`llm-tray bench` (#13): the numbers of a benchmark through the real server. Pure, no I/O.

The command (trayapp/cli/bench.py) sends the requests and turns each finished one into a
`BenchRun` (`bench_run`); `summarize` makes the `BenchResult` from the runs, the model's facts and
the machine, and `bench_json` is its `--json` shape (docs/json.md, "bench").

Decode tok/s per run is the server's own figure when it gives one (llama-server `timings`, LM Studio
`stats`, Ollama's ns durations), otherwise bench's own estimate over the streamed tokens,
(N − 1) ÷ (t_last − t_first). Warm-up runs are kept in the result but never in a median. Ceilings
come only from `placement.ceiling_for`; the sweep's prediction is the measured rate at the shallowest
depth scaled by the ratio of the ceilings (the KV-cache reads the physics adds with depth).

Hooks for what comes next (baselines, calibration): `BenchResult.baseline_key` is the (model,
quantization, hardware) a stored bench baseline would be keyed on, and `BenchResult.efficiency`
(decode ÷ ceiling at depth 0, measured runs only) is the figure a calibration would keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trayapp.core.diagnose import band_text, healthy_band_shares, low_efficiency_share, usable_calibration
from trayapp.core.machine import Machine
from trayapp.core.model import FinishedRequest, ModelFacts
from trayapp.core.placement import ceiling_for
from trayapp.core.thresholds import Thresholds

RunKind = Literal["decode", "prompt", "sweep"]
Verdict = Literal["healthy", "below_band", "low_efficiency", "not_judged"]
BENCH_SCHEMA = 1


# --------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float | None:
    """The middle value (mean of the two middle ones for an even count); None for no values."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def spread(values: Sequence[float]) -> float | None:
    """max − min; None for no values (0.0 for one)."""
    return (max(values) - min(values)) if values else None


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation ÷ mean; None for fewer than two values or a mean of 0."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    if mean == 0:
        return None
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance) / mean


def stream_decode_tok_s(tokens: int, first_s: float | None, last_s: float | None) -> float | None:
    """Steady decode over streamed tokens: (N − 1) ÷ (t_last − t_first); None when it cannot be known."""
    if tokens < 2 or first_s is None or last_s is None or last_s <= first_s:
        return None
    return (tokens - 1) / (last_s - first_s)


def efficiency(rate_tok_s: float | None, ceiling_tok_s: float | None) -> float | None:
    """The rate as a share of the ceiling (0..1+)."""
    if rate_tok_s is None or not ceiling_tok_s:
        return None
    return rate_tok_s / ceiling_tok_s


def mean_context_tokens(prompt_tokens: int | None, decode_tokens: int | None) -> int | None:
    """The KV depth a decode reads on average: the whole prompt plus half of what it generates."""
    if prompt_tokens is None:
        return None
    return prompt_tokens + (decode_tokens or 0) // 2


def predicted_tok_s(
    reference_tok_s: float | None,
    reference_context: int | None,
    context: int | None,
    facts: ModelFacts | None,
    machine: Machine,
    gpu_fraction: float | None,
) -> float | None:
    """The rate at `context` the KV model predicts from one measured at `reference_context`."""
    if reference_tok_s is None or reference_context is None or context is None:
        return None
    at_reference = ceiling_for(facts, reference_context, machine, gpu_fraction)
    at_context = ceiling_for(facts, context, machine, gpu_fraction)
    if not at_reference or at_context is None:
        return None
    return reference_tok_s * at_context / at_reference


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class BenchRun:
    """One request of the bench, as measured (never any text)."""

    kind: RunKind  # decode (short prompt), prompt (long prompt: TTFT), sweep (a prompt at a depth)
    warmup: bool
    depth_tokens: int  # the prompt depth asked for (decode runs: 0)
    prompt_tokens: int | None  # the whole prompt as the server counted it (cached included)
    cached_tokens: int | None  # of those, served from the prompt cache (None: the server does not say)
    decode_tokens: int | None  # generated, as the server counted them
    streamed_tokens: int  # pieces of generated text that arrived
    server_decode_tok_s: float | None  # the server's own timings; None when it gives none
    stream_decode_tok_s: float | None  # (N − 1) ÷ (t_last − t_first) over the streamed pieces
    ttft_s: float | None  # request sent → first generated text, on bench's clock
    prompt_tok_s: float | None  # prompt tokens processed ÷ the server's prompt time (cache excluded)
    prompt_rate_upper_bound: bool  # cached tokens unknown (Ollama): the prompt rate may be high
    wall_s: float  # the request's whole time
    gpu_fraction: float | None = None  # the model's GPU share at the tick before this run
    spilled: bool = False  # the model had spilled to the CPU (against the bench's start) for this run
    energy_j: float | None = None  # this machine's energy above its idle draw over the whole request

    @property
    def decode_tok_s(self) -> float | None:
        """The server's figure when given, else bench's own."""
        return self.server_decode_tok_s if self.server_decode_tok_s is not None else self.stream_decode_tok_s

    @property
    def decode_exact(self) -> bool:
        return self.server_decode_tok_s is not None

    @property
    def context_tokens(self) -> int | None:
        return mean_context_tokens(self.prompt_tokens, self.decode_tokens)


def bench_run(
    record: FinishedRequest,
    *,
    kind: RunKind,
    warmup: bool,
    depth_tokens: int,
    streamed_tokens: int,
    first_text_s: float | None,
    last_text_s: float | None,
    wall_s: float,
    gpu_fraction: float | None = None,
    spilled: bool = False,
) -> BenchRun:
    """A run from the tap's record of the request and the stream's own times (monotonic seconds)."""
    server_rate = record.decode_tok_s if record.decode_exact else None
    prompt_rate = record.prompt_tok_s
    if prompt_rate is None and record.prompt_tokens and record.ttft_s:
        # No server prompt time (LM Studio, OpenAI usage): tokens processed over bench's TTFT
        processed = record.prompt_tokens - (record.cached_tokens or 0)
        prompt_rate = processed / record.ttft_s if processed > 0 else None
    return BenchRun(
        kind=kind,
        warmup=warmup,
        depth_tokens=depth_tokens,
        prompt_tokens=record.prompt_tokens,
        cached_tokens=record.cached_tokens,
        decode_tokens=record.decode_tokens,
        streamed_tokens=streamed_tokens,
        server_decode_tok_s=server_rate,
        stream_decode_tok_s=stream_decode_tok_s(streamed_tokens, first_text_s, last_text_s),
        ttft_s=record.ttft_s,
        prompt_tok_s=prompt_rate,
        prompt_rate_upper_bound=record.prompt_rate_upper_bound,
        wall_s=wall_s,
        gpu_fraction=gpu_fraction,
        spilled=spilled,
    )


def is_spill(start_fraction: float | None, now_fraction: float | None, thresholds: Thresholds) -> bool:
    """The model moved to the CPU since the bench started: its share fell below the offload mark."""
    if now_fraction is None:
        return False
    mark = thresholds.offload_gpu_fraction
    return now_fraction < mark and (
        start_fraction is None or start_fraction >= mark or now_fraction < start_fraction
    )


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class BenchTarget:
    """The server and model benched, and the machine, as the monitor saw them at the start."""

    server_url: str
    server_kind: str
    server_version: str | None
    model: str
    quantization: str | None
    facts: ModelFacts | None
    context_length: int | None
    gpu_fraction: float | None
    gpu_fraction_source: str | None
    vram_bytes: int | None
    hardware: str  # pipeline.hardware_label of the machine (the key sessions are compared on)
    hardware_detail: dict[str, Any] = field(default_factory=dict)  # GPUs and RAM, for the JSON
    spec_type: str | None = None  # the server's speculative decoding; None: plain decode


@dataclass(frozen=True)
class BenchSettings:
    tokens: int
    runs: int
    warmup: int
    depths: tuple[int, ...]
    prompt_depth_tokens: int  # the long prompt of the TTFT runs
    forced: bool = False


@dataclass(frozen=True)
class Spread:
    tok_s: float | None  # max − min over the measured runs
    cv: float | None  # their coefficient of variation


@dataclass(frozen=True)
class SweepPoint:
    depth_tokens: int
    context_tokens: int | None  # mean KV depth of its runs while decoding (median)
    decode_tok_s: float | None  # median over its measured runs
    spread: Spread
    predicted_tok_s: float | None
    ceiling_tok_s: float | None
    runs: int


@dataclass(frozen=True)
class Healthy:
    """What the monitor calls healthy here: the realistic band, and the low_efficiency floor."""

    band_low_tok_s: float | None
    band_high_tok_s: float | None
    floor_tok_s: float | None
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class BenchResult:
    target: BenchTarget
    settings: BenchSettings
    runs: tuple[BenchRun, ...]
    sweep: tuple[SweepPoint, ...]
    decode_tok_s: float | None
    decode_exact: bool
    decode_spread: Spread
    ttft_s: float | None
    prompt_tok_s: float | None
    prompt_rate_upper_bound: bool
    ceiling_tok_s: float | None
    efficiency: float | None
    healthy: Healthy
    started_wall_s: float
    finished_wall_s: float
    sweep_stopped: str | None = None  # why the sweep stopped early (a depth beyond the context, …)
    interrupted: bool = False
    warnings: tuple[str, ...] = ()
    decode_j_per_token: float | None = None  # decode runs' energy above idle ÷ their generated tokens
    energy_reason: str | None = None  # why J/token is not measured

    @property
    def baseline_key(self) -> tuple[str, str | None, str]:
        """(model, quantization, hardware): what a stored bench baseline is compared on."""
        return (self.target.model, self.target.quantization, self.target.hardware)


def _measured(runs: Sequence[BenchRun], kind: RunKind, depth: int | None = None) -> list[BenchRun]:
    out = [r for r in runs if r.kind == kind and not r.warmup and (depth is None or r.depth_tokens == depth)]
    steady = [r for r in out if not r.spilled]
    return steady or out  # a spill is named (warnings), not averaged in, unless every run spilled


def decode_energy(decode: Sequence[BenchRun], reason: str | None) -> tuple[float | None, str | None]:
    """(J per generated token over the decode runs whose energy was measured, or None and why)."""
    measured = [r for r in decode if r.energy_j is not None and r.decode_tokens]
    tokens = sum(r.decode_tokens or 0 for r in measured)
    if not tokens:
        return None, reason or "no decode run's energy was measured"
    return sum(r.energy_j or 0.0 for r in measured) / tokens, None


def _rates(runs: Sequence[BenchRun]) -> list[float]:
    return [r.decode_tok_s for r in runs if r.decode_tok_s is not None]


def _spread(values: Sequence[float]) -> Spread:
    return Spread(spread(values), coefficient_of_variation(values))


def _int_median(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    mid = median([float(v) for v in known])
    return None if mid is None else round(mid)


def healthy_range(
    ceiling_tok_s: float | None,
    rate_tok_s: float | None,
    machine: Machine,
    gpu_fraction: float | None,
    thresholds: Thresholds,
    calibrated_efficiency: float | None = None,
) -> Healthy:
    """The band a healthy single stream reaches under this ceiling, and the verdict on the rate.

    Judged as the monitor judges it (`diagnose._low_efficiency`): only on a GPU machine with the model
    fully in GPU memory. A calibration (an earlier bench's efficiency here) centres the band and moves
    the floor (`diagnose.healthy_band_shares`, `diagnose.low_efficiency_share`).
    """
    shares = healthy_band_shares(calibrated_efficiency)
    low, high = (ceiling_tok_s * shares[0], ceiling_tok_s * shares[1]) if ceiling_tok_s else (None, None)
    floor_share = low_efficiency_share(thresholds, calibrated_efficiency)
    floor = floor_share * ceiling_tok_s if ceiling_tok_s else None
    share = efficiency(rate_tok_s, ceiling_tok_s)
    band_pct = band_text(calibrated_efficiency)
    calibrated = usable_calibration(calibrated_efficiency) is not None
    usual = "benched" if calibrated else "usual"
    if share is None or low is None or floor is None:
        return Healthy(low, high, floor, "not_judged", "no ceiling or no measured rate")
    if not machine.has_gpu:
        return Healthy(low, high, floor, "not_judged", "no GPU: the monitor judges efficiency only on a GPU")
    if gpu_fraction is not None and gpu_fraction < thresholds.offload_gpu_fraction:
        return Healthy(low, high, floor, "not_judged", "part of the model is on the CPU (offloaded)")
    pct = f"{share * 100:.0f} % of the ceiling"
    if rate_tok_s is not None and rate_tok_s < floor:
        why = f"{pct}: under {floor_share * 100:.0f} %, the monitor raises low_efficiency"
        return Healthy(low, high, floor, "low_efficiency", why)
    if rate_tok_s is not None and rate_tok_s < low:
        return Healthy(
            low, high, floor, "below_band", f"{pct}: below the {usual} {band_pct}, not yet an alert"
        )
    healthy = "the band benched here is" if calibrated else "a healthy GPU reaches"
    return Healthy(low, high, floor, "healthy", f"{pct}: {healthy} {band_pct}")


def sweep_points(
    runs: Sequence[BenchRun],
    depths: Sequence[int],
    facts: ModelFacts | None,
    machine: Machine,
    gpu_fraction: float | None,
) -> tuple[SweepPoint, ...]:
    """One point per depth measured: depth 0 is the decode runs, the others the sweep runs."""
    measured: list[tuple[int, list[BenchRun]]] = []
    for depth in depths:
        group = _measured(runs, "decode") if depth == 0 else _measured(runs, "sweep", depth)
        if group:
            measured.append((depth, group))
    if not measured:
        return ()
    ref_runs = measured[0][1]
    ref_rate, ref_context = median(_rates(ref_runs)), _int_median([r.context_tokens for r in ref_runs])
    points = []
    for depth, group in measured:
        rates = _rates(group)
        context = _int_median([r.context_tokens for r in group])
        points.append(
            SweepPoint(
                depth_tokens=depth,
                context_tokens=context,
                decode_tok_s=median(rates),
                spread=_spread(rates),
                predicted_tok_s=predicted_tok_s(ref_rate, ref_context, context, facts, machine, gpu_fraction),
                ceiling_tok_s=ceiling_for(facts, context, machine, gpu_fraction),
                runs=len(group),
            )
        )
    return tuple(points)


def summarize(
    target: BenchTarget,
    settings: BenchSettings,
    runs: Sequence[BenchRun],
    machine: Machine,
    thresholds: Thresholds,
    *,
    started_wall_s: float,
    finished_wall_s: float,
    sweep_stopped: str | None = None,
    interrupted: bool = False,
    warnings: Sequence[str] = (),
    calibrated_efficiency: float | None = None,
    energy_reason: str | None = None,
) -> BenchResult:
    """The result of the runs so far (an interrupted bench keeps what finished); the verdict uses an
    earlier bench's calibration of this (model, hardware) when one is given."""
    decode = _measured(runs, "decode")
    rates = _rates(decode)
    rate = median(rates)
    context = _int_median([r.context_tokens for r in decode])
    ceiling = ceiling_for(target.facts, context or 0, machine, target.gpu_fraction)
    prompt = _measured(runs, "prompt")
    ttfts = [r.ttft_s for r in prompt if r.ttft_s is not None]
    prompt_rates = [r.prompt_tok_s for r in prompt if r.prompt_tok_s is not None]
    notes = list(warnings)
    spilled = [r for r in runs if r.spilled]
    if spilled:
        notes.append(
            f"{len(spilled)} run(s) ran with the model spilled to the CPU (GPU share fell below "
            f"{thresholds.offload_gpu_fraction * 100:.0f} %): kept in runs, left out of the medians"
        )
    j_per_token, energy_reason = decode_energy(decode, energy_reason)
    return BenchResult(
        decode_j_per_token=j_per_token,
        energy_reason=energy_reason,
        target=target,
        settings=settings,
        runs=tuple(runs),
        sweep=sweep_points(runs, settings.depths, target.facts, machine, target.gpu_fraction),
        decode_tok_s=rate,
        decode_exact=bool(decode) and all(r.decode_exact for r in decode),
        decode_spread=_spread(rates),
        ttft_s=median(ttfts),
        prompt_tok_s=median(prompt_rates),
        prompt_rate_upper_bound=any(r.prompt_rate_upper_bound for r in prompt),
        ceiling_tok_s=ceiling,
        efficiency=efficiency(rate, ceiling),
        healthy=healthy_range(ceiling, rate, machine, target.gpu_fraction, thresholds, calibrated_efficiency),
        started_wall_s=started_wall_s,
        finished_wall_s=finished_wall_s,
        sweep_stopped=sweep_stopped,
        interrupted=interrupted,
        warnings=tuple(notes),
    )


# --------------------------------------------------------------------------- what may be a baseline

BASELINE_MAX_CV = 0.10  # a bench on a quiet machine spreads 1–3 %; past 10 % something else ran
BASELINE_RULE = (
    f"a bench is kept as the baseline only when its decode runs agree: a coefficient of variation of "
    f"at most {BASELINE_MAX_CV * 100:.0f} % over at least two measured runs"
)


def baseline_refusal(result: BenchResult) -> str | None:
    """Why `result` must not become the baseline (the rule is `BASELINE_RULE`), or None when it may:
    an interrupted bench, no decode rate, one run (no spread to judge) or a spread too wide."""
    if result.interrupted:
        return "interrupted: not stored as the baseline"
    if result.decode_tok_s is None:
        return "no decode rate measured: nothing stored as the baseline"
    cv = result.decode_spread.cv
    if cv is None:
        return "one decode run: no spread to judge, not stored as the baseline (bench with --runs 2 or more)"
    if cv > BASELINE_MAX_CV:
        return (
            f"unstable: the decode runs spread {cv * 100:.1f} % (CV, over {BASELINE_MAX_CV * 100:.0f} %), "
            "not stored as the baseline; something else used the machine — bench again when it is idle"
        )
    return None


# --------------------------------------------------------------------------- a bench to run, and its outcome


@dataclass(frozen=True)
class BenchOptions:
    tokens: int = 200
    runs: int = 5
    warmup: int = 2
    depths: tuple[int, ...] = (0, 2048, 8192)
    force: bool = False

    def total_runs(self) -> int:
        """Every run the bench will make (warm-ups included), for a progress bar."""
        sweep_runs = self.runs * sum(1 for d in self.depths if d > 0)
        return self.warmup + 2 * self.runs + (1 if self.warmup else 0) + sweep_runs


@dataclass(frozen=True)
class BenchOutcome:
    result: BenchResult
    failure: str | None  # the request error that stopped it, if one did

    @property
    def measured(self) -> bool:
        return any(not r.warmup for r in self.result.runs)
