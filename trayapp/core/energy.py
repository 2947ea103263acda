"""Energy accounting: per-tick deltas of every energy domain, the idle draw, and each request's joules.

Pure: the hardware readings come in on the `HardwareSnapshot` (GPUs: NVML's counter or their power;
host: RAPL packages or macmon's SoC) with the tick's monotonic time. Each tick becomes one interval
(its joules over its seconds); a request's prefill and decode spans take their share of the
intervals they overlap, less the idle draw (the median power of ticks in which no server
generated). A figure that cannot be measured is None with the reason, never 0.

Limits, said where they show: an interval is as long as a tick, so a request shorter than a tick
gets its tick's average power over its own seconds; two requests served at once each get the
machine's energy over their spans (the energy is the machine's, not one stream's).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from statistics import median

from trayapp.core.energy_types import EnergyDomainTotal, EnergyReading, EnergyStatus
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import RequestRecord

HISTORY_S = 3600.0  # intervals kept for requests still to finish (an hour-long request is rare)
IDLE_TICKS = 60  # idle intervals the idle draw is the median of
IDLE_MIN_TICKS = 3  # idle intervals needed before the idle draw is known
COVERAGE = 0.98  # share of a span the intervals must cover for its energy to count as measured
NO_ENERGY = "no energy counter or power reading on this machine"
IDLE_UNKNOWN = "idle draw not measured yet (needs a few ticks with no server generating)"


def counter_delta_j(previous_j: float, now_j: float, wrap_j: float | None) -> float | None:
    """The energy between two readings of a cumulative counter; one wrap past `wrap_j` undone.
    None when it went back with no known range (the counter was reset)."""
    delta = now_j - previous_j
    if delta >= 0:
        return delta
    if wrap_j is None or wrap_j <= 0:
        return None
    return delta + wrap_j


@dataclass(frozen=True)
class _Domain:
    """One domain at one tick: its counter, or its power (integrated: estimated)."""

    domain: str
    source: str
    counter_j: float | None
    wrap_j: float | None
    power_w: float | None

    @property
    def estimated(self) -> bool:
        return self.counter_j is None


@dataclass(frozen=True)
class _Interval:
    start_s: float
    end_s: float
    joules: float
    estimated: bool
    source: str

    @property
    def power_w(self) -> float:
        return self.joules / (self.end_s - self.start_s)


@dataclass(frozen=True)
class SpanEnergy:
    """The energy over one span: joules (gross, idle included) or the reason there are none."""

    joules: float | None
    estimated: bool = False
    source: str | None = None
    reason: str | None = None


def domains_of(hardware: HardwareSnapshot) -> tuple[list[_Domain], list[str]]:
    """The domains with a counter or a power reading, and the reasons of those without."""
    found: list[_Domain] = []
    reasons: list[str] = []
    for gpu in hardware.gpus:
        if gpu.vendor == "apple":
            continue  # Apple's GPU is in macmon's SoC figure
        name = f"gpu{gpu.index}"
        if gpu.energy_j is not None:
            found.append(_Domain(name, "nvml", gpu.energy_j, None, None))
        elif gpu.power_w is not None:
            source = "nvml-power" if gpu.vendor == "nvidia" else f"{gpu.vendor}-power"
            found.append(_Domain(name, source, None, None, gpu.power_w))
        else:
            reasons.append(f"{name}: no energy counter and no power reading")
    for reading in hardware.energy:
        if reading.counter_j is not None or reading.power_w is not None:
            found.append(_domain(reading))
        elif reading.reason:
            reasons.append(f"{reading.domain}: {reading.reason}")
    if not hardware.energy and hardware.energy_reason:
        reasons.append(hardware.energy_reason)
    if not hardware.gpus and hardware.gpu_reason:
        reasons.append(f"no GPU energy ({hardware.gpu_reason})")
    return found, reasons


def _domain(reading: EnergyReading) -> _Domain:
    return _Domain(reading.domain, reading.source, reading.counter_j, reading.wrap_j, reading.power_w)


class EnergyMeter:
    """Turns each tick's energy readings into intervals; knows the idle draw; gives spans their joules."""

    def __init__(self, history_s: float = HISTORY_S) -> None:
        self._history_s = history_s
        self._last: dict[tuple[str, str], tuple[float, _Domain]] = {}
        self._last_busy: bool | None = None
        self._intervals: deque[_Interval] = deque()
        self._idle_w: deque[float] = deque(maxlen=IDLE_TICKS)
        self._totals: dict[tuple[str, str], float] = {}
        self._reasons: list[str] = []
        self._previous_s: float | None = None

    @property
    def idle_w(self) -> float | None:
        """The idle draw: the median power of the last idle ticks; None until enough were seen."""
        return median(self._idle_w) if len(self._idle_w) >= IDLE_MIN_TICKS else None

    def update(self, hardware: HardwareSnapshot, now_mono_s: float, busy: bool) -> EnergyStatus:
        """Read one tick. `busy`: some local server was reading a prompt or generating at this tick."""
        found, self._reasons = domains_of(hardware)
        joules = 0.0
        complete = bool(found)
        estimated = False
        sources: set[str] = set()
        for domain in found:
            key = (domain.domain, domain.source)
            previous = self._last.get(key)
            self._last[key] = (now_mono_s, domain)
            delta = None if previous is None else _delta(previous, domain, now_mono_s)
            if delta is None:
                complete = False
                continue
            joules += delta
            estimated |= domain.estimated
            sources.add(domain.source)
            self._totals[key] = self._totals.get(key, 0.0) + delta
        previous_s = self._previous_s
        if complete and previous_s is not None and now_mono_s > previous_s:
            interval = _Interval(previous_s, now_mono_s, joules, estimated, "+".join(sorted(sources)))
            self._intervals.append(interval)
            if not busy and self._last_busy is False:
                self._idle_w.append(interval.power_w)
        self._previous_s = now_mono_s
        self._last_busy = busy
        while self._intervals and self._intervals[0].end_s < now_mono_s - self._history_s:
            self._intervals.popleft()
        return self.status()

    def status(self) -> EnergyStatus:
        last = self._intervals[-1] if self._intervals else None
        domains = tuple(
            EnergyDomainTotal(domain, source, total, self._last[(domain, source)][1].estimated)
            for (domain, source), total in sorted(self._totals.items())
        )
        reason = "; ".join(self._reasons) if self._reasons else None
        if not self._last and reason is None:
            reason = NO_ENERGY
        return EnergyStatus(
            power_w=last.power_w if last is not None else None,
            idle_w=self.idle_w,
            domains=domains,
            estimated=any(d.estimated for d in domains),
            reason=reason,
        )

    def span(self, start_s: float, end_s: float) -> SpanEnergy:
        """The machine's energy (idle included) between two monotonic times, from the intervals."""
        if not self._intervals:
            return SpanEnergy(None, reason=self.why_none())
        if end_s <= start_s:
            return SpanEnergy(None, reason="the span has no length")
        joules = covered = 0.0
        estimated = False
        sources: set[str] = set()
        for interval in self._intervals:
            overlap = min(end_s, interval.end_s) - max(start_s, interval.start_s)
            if overlap <= 0:
                continue
            share = overlap / (interval.end_s - interval.start_s)
            joules += interval.joules * share
            covered += overlap
            estimated |= interval.estimated
            sources.update(interval.source.split("+"))
        if covered < COVERAGE * (end_s - start_s):
            return SpanEnergy(None, reason="energy was not read through the whole span")
        return SpanEnergy(joules, estimated, "+".join(sorted(sources)))

    @property
    def has_intervals(self) -> bool:
        """Whether any tick's energy was measured (else nothing can be attributed)."""
        return bool(self._intervals)

    def why_none(self) -> str:
        """Why nothing is measured: the sources' reasons (RAPL unreadable, no GPU, …)."""
        return "; ".join(self._reasons) if self._reasons else NO_ENERGY

    def above_idle(self, start_s: float, end_s: float) -> tuple[float | None, str | None, SpanEnergy]:
        """(joules above the idle draw between two monotonic times, or None; why None; the gross span)."""
        gross = self.span(start_s, end_s)
        if gross.joules is None:
            return None, gross.reason, gross
        if self.idle_w is None:
            return None, IDLE_UNKNOWN, gross
        above_j = gross.joules - self.idle_w * (end_s - start_s)
        if above_j <= 0:
            return None, "no more than the idle draw (within the measurement's noise)", gross
        return above_j, None, gross

    def attribute(self, record: RequestRecord, mono_minus_wall_s: float) -> RequestRecord:
        """The record with its prefill and decode energy above the idle draw (or the reason none)."""
        return with_energy(record, self, mono_minus_wall_s)


def _delta(previous: tuple[float, _Domain], domain: _Domain, now_mono_s: float) -> float | None:
    then_s, before = previous
    if domain.counter_j is not None and before.counter_j is not None:
        return counter_delta_j(before.counter_j, domain.counter_j, domain.wrap_j)
    if domain.power_w is not None and before.power_w is not None:
        return (before.power_w + domain.power_w) / 2 * (now_mono_s - then_s)  # trapezoid
    return None


def request_spans(record: RequestRecord) -> tuple[float | None, float | None]:
    """(prefill seconds, decode seconds) of a finished request, from its own counts and rates."""
    decode_s = None
    if record.decode_tokens and record.decode_tok_s:
        decode_s = record.decode_tokens / record.decode_tok_s
    prefill_s = None
    if record.prompt_tokens and record.prompt_tok_s:
        prefill_s = record.prompt_tokens / record.prompt_tok_s
    elif record.ttft_s:
        prefill_s = record.ttft_s
    return prefill_s, decode_s


def with_energy(record: RequestRecord, meter: EnergyMeter, mono_minus_wall_s: float) -> RequestRecord:
    """`record` with `energy_*` set from the meter's intervals: its prefill span ends where its decode
    span begins, which ends when it finished. Each figure is the gross energy less the idle draw
    over the same seconds; None with `energy_reason` where it cannot be measured."""
    if not meter.has_intervals:
        reason = meter.why_none()
        return record if record.energy_reason == reason else replace(record, energy_reason=reason)
    prefill_s, decode_s = request_spans(record)
    idle_w = meter.idle_w
    end_s = record.finished_wall_s + mono_minus_wall_s
    decode_start_s = end_s - (decode_s or 0.0)
    reasons: list[str] = []
    sources: set[str] = set()
    estimated = False

    def net(start_s: float, stop_s: float, what: str) -> float | None:
        nonlocal estimated
        above_j, reason, gross = meter.above_idle(start_s, stop_s)
        if gross.joules is not None and idle_w is not None:
            estimated |= gross.estimated
            sources.update((gross.source or "").split("+"))
        if reason is not None:
            reasons.append(f"{what}: {reason}")
        return above_j

    decode_j = net(decode_start_s, end_s, "decode") if decode_s else None
    if not decode_s:
        reasons.append(
            "decode: its duration is unknown" if record.decode_tokens else "decode: no token decoded"
        )
    placed = decode_s is not None or not record.decode_tokens  # where the prefill ended is known
    prefill_j = net(decode_start_s - prefill_s, decode_start_s, "prefill") if prefill_s and placed else None
    if not prefill_s:
        reasons.append("prefill: its duration is unknown")
    elif not placed:
        reasons.append("prefill: when it ended is unknown (so is the decode's duration)")
    per_token = decode_j / record.decode_tokens if decode_j is not None and record.decode_tokens else None
    measured = decode_j is not None or prefill_j is not None
    return replace(
        record,
        energy_prefill_j=prefill_j,
        energy_decode_j=decode_j,
        energy_j_per_token=per_token,
        energy_idle_w=idle_w if measured else None,
        energy_source="+".join(sorted(s for s in sources if s)) or None,
        energy_estimated=estimated,
        energy_reason="; ".join(_unique(reasons)) or None,
    )


def without_energy(record: RequestRecord, reason: str) -> RequestRecord:
    """`record` marked unmeasured, with the reason (e.g. served by another machine)."""
    return replace(record, energy_reason=reason)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
