"""Prometheus energy series: the machine's energy counters and power, and per-request energy.

* `llm_tray_energy_joules_total{domain,source,estimated}`: energy each domain used since the
  monitor started (RAPL package, NVML GPU, macmon SoC; estimated="true" for power × time)
  (OpenTelemetry hardware conventions: `hw.energy`).
* `llm_tray_power_watts` and `llm_tray_idle_power_watts`: the machine's power over the last tick and
  its measured idle draw (`hw.power`).
* `llm_tray_request_energy_joules{server,kind,model,phase}`: histogram of each finished request's
  energy above the idle draw, phase "prefill" or "decode"; and
  `llm_tray_request_energy_per_output_token_joules{server,kind,model}`: decode joules per decoded
  token. Requests whose energy was not measured observe neither (never a 0).
* `llm_tray_gpu_power_limit_watts{gpu,name}`, `llm_tray_gpu_sm_clock_hertz{gpu,name,clock}`
  (clock "current" | "max"): what a power cap or throttling looks like.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from trayapp.core.model import RequestRecord, Snapshot
from trayapp.sinks.prom_histogram import Histogram

_Key = tuple[str, str, str]  # server label, kind, model
ENERGY_BUCKETS_J: tuple[float, ...] = (
    1.0,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    10000.0,
)
J_PER_TOKEN_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class EnergyHistograms:
    """Per-request energy histograms; not thread-safe: `MetricsState` holds its lock around them."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str, str, str], Histogram] = {}
        self.per_token: dict[_Key, Histogram] = {}

    def add(self, record: RequestRecord, key: _Key) -> None:
        for phase, joules in (("prefill", record.energy_prefill_j), ("decode", record.energy_decode_j)):
            if joules is not None:
                pkey = (*key, phase)
                self.phases[pkey] = self.phases.get(pkey, Histogram.empty(ENERGY_BUCKETS_J)).add(
                    ENERGY_BUCKETS_J, joules
                )
        if record.energy_j_per_token is not None:
            self.per_token[key] = self.per_token.get(key, Histogram.empty(J_PER_TOKEN_BUCKETS)).add(
                J_PER_TOKEN_BUCKETS, record.energy_j_per_token
            )

    def copy(self) -> EnergyHistograms:
        out = EnergyHistograms()
        out.phases, out.per_token = dict(self.phases), dict(self.per_token)
        return out


def request_energy_families(histograms: EnergyHistograms) -> Iterator[Metric]:
    """The per-request histograms."""
    phases = HistogramMetricFamily(
        "llm_tray_request_energy_joules",
        "Energy above the idle draw per finished request, by phase (prefill, decode).",
        labels=["server", "kind", "model", "phase"],
    )
    for pkey, buckets in sorted(histograms.phases.items()):
        phases.add_metric(list(pkey), buckets.cumulative(ENERGY_BUCKETS_J), buckets.total)
    yield phases
    per_token = HistogramMetricFamily(
        "llm_tray_request_energy_per_output_token_joules",
        "Decode energy above the idle draw per decoded token, per finished request.",
        labels=["server", "kind", "model"],
    )
    for key, buckets in sorted(histograms.per_token.items()):
        per_token.add_metric(list(key), buckets.cumulative(J_PER_TOKEN_BUCKETS), buckets.total)
    yield per_token


def machine_energy_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The machine's energy counters, power, idle draw, GPU power limits and SM clocks."""
    energy = snapshot.energy
    if energy is not None:
        total = CounterMetricFamily(
            "llm_tray_energy_joules",
            "Energy used since the monitor started, per domain (estimated: power x time).",
            labels=["domain", "source", "estimated"],
        )
        for domain in energy.domains:
            total.add_metric([domain.domain, domain.source, str(domain.estimated).lower()], domain.total_j)
        yield total
        for name, help_text, value in (
            ("llm_tray_power_watts", "The machine's measured power over the last tick.", energy.power_w),
            ("llm_tray_idle_power_watts", "The machine's idle draw (no server generating).", energy.idle_w),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
    limit = GaugeMetricFamily("llm_tray_gpu_power_limit_watts", "The GPU's enforced power limit.",
                              labels=["gpu", "name"])  # fmt: skip
    clock = GaugeMetricFamily("llm_tray_gpu_sm_clock_hertz", "The GPU's SM clock, now and its maximum.",
                              labels=["gpu", "name", "clock"])  # fmt: skip
    for gpu in snapshot.hardware.gpus:
        labels = [str(gpu.index), gpu.name]
        if gpu.power_limit_w is not None:
            limit.add_metric(labels, gpu.power_limit_w)
        for which, mhz in (("current", gpu.sm_clock_mhz), ("max", gpu.sm_clock_max_mhz)):
            if mhz is not None:
                clock.add_metric([*labels, which], mhz * 1e6)
    yield limit
    yield clock
