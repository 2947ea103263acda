"""Per-request histograms and the requests counter (issue 12): TTFT, time per output token, outcomes.

Every expected bucket count below is worked out by hand from the hand-made records; the
exposition text is parsed back with prometheus_client's own text parser.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.metrics import T0, scrape, snapshot, value
from tests.support.snapshots import LLAMA, OLLAMA
from trayapp.core.model import RequestRecord
from trayapp.sinks.metrics import MetricsState

TTFT = "llm_tray_request_ttft_seconds"
TPOT = "llm_tray_request_time_per_output_token_seconds"
QWEN = {"server": OLLAMA, "kind": "ollama", "model": "qwen3:8b"}
TTFT_LE = ["0.05", "0.1", "0.25", "0.5", "1.0", "2.0", "4.0", "8.0", "15.0", "30.0", "60.0", "120.0", "+Inf"]
TPOT_LE = ["0.001", "0.0025", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.15", "0.25",
           "0.5", "1.0", "2.0", "+Inf"]  # fmt: skip


def record(
    ttft_s: float | None = None,
    decode_tok_s: float | None = None,
    *,
    source: str = "proxy",
    server: str = OLLAMA,
    model: str = "qwen3:8b",
    http_status: int | None = 200,
    aborted: bool = False,
) -> RequestRecord:
    return RequestRecord(
        server=server,
        server_kind="ollama",
        model=model,
        finished_wall_s=T0,
        session_id=None,
        exact=source == "proxy",
        prompt_tokens=12,
        decode_tokens=40 if decode_tok_s else None,
        ttft_s=ttft_s,
        decode_tok_s=decode_tok_s,
        source=source,
        endpoint="/api/chat",
        http_status=http_status,
        aborted=aborted,
    )


# TTFT 0.03, 0.25 (on a bound: `le` is inclusive), 3.0, 200 (above every bound), 0.7 (aborted);
# TPOT = 1 / tok/s: 1/50 = 0.02 (on a bound), 1/20 = 0.05, 1/4 = 0.25 (on a bound), 1/0.25 = 4,
# 1/100 = 0.01.
FIRST = (record(0.03, 50.0), record(0.25, 20.0), record(3.0, 4.0))
SECOND = (
    record(200.0, 0.25),
    record(0.7, None, aborted=True),
    record(0.1, 30.0, http_status=500),  # an error observes no histogram, only the counter
    record(None, 100.0, source="slots", http_status=None),  # polled record: no TTFT
)


def buckets(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> list[float]:
    """Cumulative bucket counts in `le` order, for the one series matching `labels`."""
    rows = {
        lab["le"]: v for lab, v in samples[f"{name}_bucket"] if all(lab[k] == w for k, w in labels.items())
    }
    return [rows[le] for le in (TTFT_LE if name == TTFT else TPOT_LE)]


def observed_twice() -> MetricsState:
    state = MetricsState()
    state.observe(snapshot(T0, rate=None, requests=FIRST))
    state.observe(snapshot(T0 + 1, rate=None, requests=SECOND))
    return state


def test_ttft_buckets_sum_and_count_by_hand() -> None:
    s = scrape(observed_twice())
    #            0.05 0.1 0.25 0.5 1  2  4  8  15 30 60 120 +Inf
    assert buckets(s, TTFT, **QWEN) == [1, 1, 2, 2, 3, 3, 4, 4, 4, 4, 4, 4, 5]
    assert value(s, f"{TTFT}_count", **QWEN) == 5
    assert value(s, f"{TTFT}_sum", **QWEN) == pytest.approx(0.03 + 0.25 + 3.0 + 200.0 + 0.7)


def test_time_per_output_token_is_one_over_decode_rate_by_hand() -> None:
    s = scrape(observed_twice())
    #            .001 .0025 .005 .01 .02 .04 .06 .08 .1 .15 .25 .5 1  2  +Inf
    assert buckets(s, TPOT, **QWEN) == [0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5]
    assert value(s, f"{TPOT}_count", **QWEN) == 5
    assert value(s, f"{TPOT}_sum", **QWEN) == pytest.approx(0.02 + 0.05 + 0.25 + 4.0 + 0.01)


def test_requests_counter_by_source_and_outcome() -> None:
    s = scrape(observed_twice())
    assert value(s, "llm_tray_requests_total", **QWEN, source="proxy", outcome="ok") == 4
    assert value(s, "llm_tray_requests_total", **QWEN, source="proxy", outcome="aborted") == 1
    assert value(s, "llm_tray_requests_total", **QWEN, source="proxy", outcome="error") == 1
    assert value(s, "llm_tray_requests_total", **QWEN, source="slots", outcome="ok") == 1
    assert len(s["llm_tray_requests_total"]) == 4


def test_a_request_is_counted_once_across_snapshots() -> None:
    state = MetricsState()
    state.observe(snapshot(T0, rate=None, requests=FIRST))
    s1 = scrape(state)
    assert value(s1, f"{TTFT}_count", **QWEN) == 3
    assert buckets(s1, TTFT, **QWEN) == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3]
    state.observe(snapshot(T0 + 1, rate=None))  # the next tick: nothing finished since
    state.observe(snapshot(T0 + 2, rate=None))
    s2 = scrape(state)
    assert s2[f"{TTFT}_bucket"] == s1[f"{TTFT}_bucket"]
    assert s2[f"{TPOT}_bucket"] == s1[f"{TPOT}_bucket"]
    assert value(s2, "llm_tray_requests_total", **QWEN, outcome="ok") == 3
    state.observe(snapshot(T0 + 3, rate=None, requests=(record(0.5, 10.0),)))
    s3 = scrape(state)
    assert value(s3, f"{TTFT}_count", **QWEN) == 4
    assert value(s3, f"{TTFT}_bucket", **QWEN, le="0.5") == 3  # 0.03, 0.25 and the new 0.5
    assert value(s3, f"{TPOT}_bucket", **QWEN, le="0.1") == 3  # 0.02, 0.05 and 1/10
    assert value(s3, "llm_tray_requests_total", **QWEN, outcome="ok") == 4


def test_series_per_server_and_model_with_redacted_server_and_no_text_labels() -> None:
    secret = "http://user:hunter2@127.0.0.1:8080/?api_key=abc"
    state = MetricsState()
    state.observe(snapshot(T0, rate=None, requests=(
        record(1.5, 25.0), record(0.4, 50.0, server=secret, model="gemma3"),
    )))  # fmt: skip
    text = generate_latest(state.registry).decode()
    assert "hunter2" not in text and "api_key" not in text and "/api/chat" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families[TTFT].type == "histogram" and families[TPOT].type == "histogram"
    assert families["llm_tray_requests"].type == "counter"
    for name in (TTFT, TPOT):
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == {"server", "kind", "model"}
    s = scrape(state)
    gemma = {"server": LLAMA + "/", "model": "gemma3"}
    assert value(s, f"{TTFT}_bucket", **gemma, le="0.25") == 0
    assert value(s, f"{TTFT}_bucket", **gemma, le="0.5") == 1
    assert value(s, f"{TTFT}_bucket", **QWEN, le="1.0") == 0
    assert value(s, f"{TTFT}_bucket", **QWEN, le="2.0") == 1
    assert value(s, f"{TPOT}_bucket", **gemma, le="0.02") == 1  # 1/50
    assert value(s, f"{TPOT}_bucket", **QWEN, le="0.04") == 1  # 1/25 = 0.04, on the bound
    assert value(s, f"{TPOT}_bucket", **QWEN, le="0.02") == 0


def test_no_request_yet_serves_empty_histograms() -> None:
    text = generate_latest(MetricsState().registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families[TTFT].samples == [] and families[TPOT].samples == []
