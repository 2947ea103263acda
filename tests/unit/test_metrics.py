"""The Prometheus collector: its output parsed back, gauges and counters.

The exporter over real HTTP is tested in tests/integration/test_exporter_http.py.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest

from tests.support.metrics import T0, scrape, snapshot, value
from tests.support.snapshots import LLAMA, OLLAMA
from trayapp.core.model import Alert, RequestRecord
from trayapp.sinks.metrics import MetricsState


def finished(t: float, tokens: int, model: str = "qwen3:8b", server: str = OLLAMA) -> RequestRecord:
    return RequestRecord(
        server=server,
        server_kind="ollama",
        model=model,
        finished_wall_s=t,
        session_id="s1",
        exact=True,
        decode_tokens=tokens,
    )


def test_gauges_per_server_and_model_with_units_in_names() -> None:
    state = MetricsState()
    state.observe(snapshot(T0))
    s = scrape(state)
    q = {"server": OLLAMA, "kind": "ollama", "model": "qwen3:8b"}
    assert value(s, "llm_tray_decode_tokens_per_second", **q) == 80.0
    assert value(s, "llm_tray_decode_total_tokens_per_second", **q) == 80.0
    assert value(s, "llm_tray_prompt_tokens_per_second", **q) == 400.0
    assert value(s, "llm_tray_ceiling_tokens_per_second", **q) == 100.0
    assert value(s, "llm_tray_efficiency_ratio", **q) == pytest.approx(0.8)
    assert value(s, "llm_tray_gpu_fraction_ratio", **q) == 0.75
    assert value(s, "llm_tray_context_tokens", **q) == 3000
    assert value(s, "llm_tray_context_size_tokens", **q) == 8192
    assert value(s, "llm_tray_vram_bytes", **q) == 6e9
    assert value(s, "llm_tray_ttft_seconds", **q) == 0.25
    assert value(s, "llm_tray_server_up", server=OLLAMA, kind="ollama") == 1.0
    assert value(s, "llm_tray_server_up", server=LLAMA, kind="llamacpp") == 1.0
    assert value(s, "llm_tray_gpu_vram_used_bytes", gpu="0", name="NVIDIA GeForce RTX 4090") == 2e10
    assert value(s, "llm_tray_gpu_vram_total_bytes", gpu="0") == 25_757_220_864
    assert value(s, "llm_tray_gpu_bandwidth_gigabytes_per_second", gpu="0") == 1008.0
    # Unknown is absent, not zero: no draft acceptance, no rate for the idle model.
    assert "llm_tray_draft_acceptance_ratio" not in s
    assert [lab["model"] for lab, _ in s["llm_tray_decode_tokens_per_second"]] == ["qwen3:8b"]
    assert all(name.startswith("llm_tray_") for name in s)


def test_a_server_that_is_down_reads_0() -> None:
    state = MetricsState()
    state.observe(snapshot(T0, llama_status="unreachable"))
    assert value(scrape(state), "llm_tray_server_up", server=LLAMA) == 0.0


def test_active_alerts_by_kind_severity_server_and_model() -> None:
    offload = Alert(
        id="a1", kind="offload", severity="warning", server=OLLAMA, model="qwen3:8b", message="m", fix="f",
        since_wall_s=T0,
    )  # fmt: skip
    down = Alert(
        id="a2", kind="server_down", severity="critical", server=LLAMA, model=None, message="m", fix="f",
        since_wall_s=T0,
    )  # fmt: skip
    state = MetricsState()
    state.observe(snapshot(T0, alerts=(offload, down)))
    s = scrape(state)
    assert value(s, "llm_tray_alerts_active", kind="offload", severity="warning", model="qwen3:8b") == 1
    assert (
        value(s, "llm_tray_alerts_active", kind="server_down", severity="critical", server=LLAMA, model="")
        == 1
    )
    state.observe(snapshot(T0 + 1))
    assert "llm_tray_alerts_active" not in scrape(state)


def test_counters_count_request_records_exactly() -> None:
    state = MetricsState()
    state.observe(snapshot(T0, rate=None, requests=(finished(T0, 120), finished(T0, 30))))
    state.observe(snapshot(T0 + 1, rate=None, requests=(finished(T0 + 1, 50),)))
    s = scrape(state)
    q = {"server": OLLAMA, "kind": "ollama", "model": "qwen3:8b"}
    assert value(s, "llm_tray_requests_total", **q) == 3
    assert value(s, "llm_tray_decoded_tokens_total", **q) == 200


def test_decoded_tokens_are_counted_once_from_rates_and_records() -> None:
    state = MetricsState()
    for i in range(4):  # 3 intervals of 1 s at 80 tok/s
        state.observe(snapshot(T0 + i, rate=80.0))
    state.observe(snapshot(T0 + 60, rate=80.0))  # a 56 s gap (suspend): adds nothing
    q = {"server": OLLAMA, "kind": "ollama", "model": "qwen3:8b"}
    assert value(scrape(state), "llm_tray_decoded_tokens_total", **q) == pytest.approx(240.0)

    # The request that finishes now had 250 tokens: 240 were already counted live.
    state.observe(snapshot(T0 + 61, rate=None, requests=(finished(T0 + 61, 250),)))
    assert value(scrape(state), "llm_tray_decoded_tokens_total", **q) == pytest.approx(250.0)
    # A server that reports only finished requests (no live rate) is counted from its records.
    state.observe(snapshot(T0 + 62, rate=None, requests=(finished(T0 + 62, 10),)))
    assert value(scrape(state), "llm_tray_decoded_tokens_total", **q) == pytest.approx(260.0)
    assert value(scrape(state), "llm_tray_requests_total", **q) == 2


def test_the_collector_lives_in_its_own_registry_only() -> None:
    state = MetricsState()
    state.observe(snapshot(T0))
    assert b"llm_tray_" in generate_latest(state.registry)
    assert b"llm_tray_" not in generate_latest(REGISTRY)


def test_hostile_label_values_are_escaped_and_parse_back() -> None:
    name = 'evil"model\\with\nnewline{}'
    state = MetricsState()
    state.observe(snapshot(T0, model_name=name))
    s = scrape(state)
    assert value(s, "llm_tray_decode_tokens_per_second", model=name) == 80.0


def test_no_snapshot_yet_serves_empty_counters() -> None:
    s = scrape(MetricsState())
    assert "llm_tray_server_up" not in s and "llm_tray_decode_tokens_per_second" not in s
