"""Energy on /metrics (#21): the machine's energy counter per domain, power and idle draw, and per-request
energy histograms; a request whose energy was not measured observes nothing (never a 0). Hand-made
records; bucket counts and sums worked out by hand; parsed back with prometheus_client's parser."""

from __future__ import annotations

from dataclasses import replace

from tests.support.metrics import T0, scrape, snapshot, value
from tests.support.snapshots import OLLAMA
from trayapp.core.energy_types import EnergyDomainTotal, EnergyStatus
from trayapp.core.model import RequestRecord
from trayapp.sinks.metrics import MetricsState

QWEN = {"server": OLLAMA, "kind": "ollama", "model": "qwen3:8b"}


def record(prefill_j: float | None, decode_j: float | None, per_token: float | None) -> RequestRecord:
    return RequestRecord(
        server=OLLAMA, server_kind="ollama", model="qwen3:8b", finished_wall_s=T0, session_id=None,
        exact=True, decode_tokens=100, decode_tok_s=50.0, energy_prefill_j=prefill_j,
        energy_decode_j=decode_j, energy_j_per_token=per_token,
        energy_reason=None if decode_j is not None else "decode: idle draw not measured yet",
    )  # fmt: skip


def test_machine_energy_counter_power_and_idle_draw() -> None:
    state = MetricsState()
    energy = EnergyStatus(
        power_w=212.5,
        idle_w=48.0,
        domains=(
            EnergyDomainTotal("gpu0", "nvml", 1234.5, False),
            EnergyDomainTotal("package-0", "rapl", 321.0, False),
        ),
    )
    state.observe(replace(snapshot(T0), energy=energy))
    samples = scrape(state)
    assert (
        value(samples, "llm_tray_energy_joules_total", domain="gpu0", source="nvml", estimated="false")
        == 1234.5
    )
    assert value(samples, "llm_tray_energy_joules_total", domain="package-0", source="rapl") == 321.0
    assert value(samples, "llm_tray_power_watts") == 212.5
    assert value(samples, "llm_tray_idle_power_watts") == 48.0


def test_request_energy_histograms_by_phase_and_per_token() -> None:
    state = MetricsState()
    # 3 J prefill (le 5), 70 J decode (le 100), 0.7 J/token (le 1.0); a second: 30 J, 200 J, 2.0 J/token;
    # a third unmeasured: nothing observed.
    requests = (record(3.0, 70.0, 0.7), record(30.0, 200.0, 2.0), record(None, None, None))
    state.observe(snapshot(T0, requests=requests))
    samples = scrape(state)
    name = "llm_tray_request_energy_joules"
    assert value(samples, f"{name}_count", **QWEN, phase="prefill") == 2
    assert value(samples, f"{name}_sum", **QWEN, phase="prefill") == 33.0
    assert value(samples, f"{name}_bucket", **QWEN, phase="prefill", le="5.0") == 1
    assert value(samples, f"{name}_bucket", **QWEN, phase="prefill", le="50.0") == 2
    assert value(samples, f"{name}_sum", **QWEN, phase="decode") == 270.0
    assert value(samples, f"{name}_bucket", **QWEN, phase="decode", le="100.0") == 1
    assert value(samples, f"{name}_bucket", **QWEN, phase="decode", le="250.0") == 2
    per_token = "llm_tray_request_energy_per_output_token_joules"
    assert value(samples, f"{per_token}_count", **QWEN) == 2
    assert value(samples, f"{per_token}_sum", **QWEN) == 2.7
    assert value(samples, f"{per_token}_bucket", **QWEN, le="1.0") == 1
