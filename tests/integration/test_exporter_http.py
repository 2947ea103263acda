"""The Prometheus exporter serves /metrics over real HTTP on 127.0.0.1.

The per-request histograms are scraped by a real Prometheus (Debian's, as in
tests/integration/test_fleet_prometheus.py) and read back through the dashboard's own quantile queries.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.llama import free_port
from tests.support.metrics import T0, snapshot
from tests.support.snapshots import OLLAMA
from trayapp.core.model import RequestRecord
from trayapp.sinks.metrics import MetricsState, start_exporter


def test_the_exporter_serves_metrics_over_real_http_on_loopback() -> None:
    state = MetricsState()
    state.observe(snapshot(T0))
    exporter = start_exporter(state, port=0)
    try:
        assert exporter.address == "127.0.0.1" and exporter.port > 0
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            response = client.get(exporter.url)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(response.text)}
            (sample,) = families["llm_tray_ceiling_tokens_per_second"].samples
            assert sample.value == 100.0 and sample.labels["model"] == "qwen3:8b"

            state.observe(snapshot(T0 + 1, rate=42.0))  # the next scrape sees the new snapshot
            text = client.get(exporter.url).text
            assert 'llm_tray_decode_tokens_per_second{kind="ollama",model="qwen3:8b"' in text
            assert "} 42.0" in text
    finally:
        exporter.stop()
    with httpx.Client(trust_env=False, timeout=2.0) as client, pytest.raises(httpx.TransportError):
        client.get(exporter.url)


# --------------------------------------------------------------------------- per-request histograms

DASHBOARD = Path(__file__).resolve().parents[2] / "resources" / "grafana" / "llm-tray-dashboard.json"
PROMETHEUS_TIMEOUT_S = 60.0


def _request(ttft_s: float, decode_tok_s: float) -> RequestRecord:
    return RequestRecord(
        server=OLLAMA, server_kind="ollama", model="qwen3:8b", finished_wall_s=T0, session_id=None,
        exact=True, ttft_s=ttft_s, decode_tok_s=decode_tok_s, decode_tokens=64, source="proxy",
        http_status=200,
    )  # fmt: skip


def _panel_queries(title: str) -> list[str]:
    """The panel's PromQL with every dashboard variable on "All"."""
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    (panel,) = [p for p in panels if p["title"] == title]
    queries = [re.sub(r"\$(instance|server|model)\b", ".*", t["expr"]) for t in panel["targets"]]
    assert all("$" not in q for q in queries), queries
    return queries


def _prom_query(client: httpx.Client, base: str, promql: str) -> list[dict[str, Any]]:
    body = client.get(f"{base}/api/v1/query", params={"query": promql}).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _wait_for(
    client: httpx.Client, base: str, promql: str, want: float, prometheus: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + PROMETHEUS_TIMEOUT_S
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        assert prometheus.poll() is None, "prometheus exited"
        try:
            seen = _prom_query(client, base, promql)
            if seen and float(seen[0]["value"][1]) == want:
                return
        except (httpx.HTTPError, ValueError):
            pass  # not ready yet
        time.sleep(0.2)
    pytest.fail(f"{promql} never read {want} within {PROMETHEUS_TIMEOUT_S:g} s: {seen}")


@pytest.mark.prometheus
def test_dashboard_quantiles_of_the_histograms_on_a_real_prometheus(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; CI installs it)")
    state = MetricsState()
    # Eight requests before, in the lowest buckets: only the increase after them may reach the
    # quantiles (rate, not totals). Lowest, and twice the later increase, so every bucket starts far
    # enough above zero: rate() stops its extrapolation where a counter would reach zero, which
    # would otherwise weight the buckets unevenly (then the quantiles are not the hand values).
    state.observe(snapshot(T0, rate=None, requests=(_request(0.01, 2000.0),) * 8))
    exporter = start_exporter(state, port=0)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: llm-tray\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{prom_port}"
    try:
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            _wait_for(client, base, "sum(llm_tray_request_ttft_seconds_count)", 8.0, prometheus)
            # TTFT 0.3, 0.4, 0.45, 3.0 s; time per output token 1/50, 1/40, 1/25, 1/5 s.
            state.observe(snapshot(T0 + 1, rate=None, requests=(
                _request(0.3, 50.0), _request(0.4, 40.0), _request(0.45, 25.0), _request(3.0, 5.0),
            )))  # fmt: skip
            _wait_for(client, base, "sum(llm_tray_request_ttft_seconds_count)", 12.0, prometheus)
            ttft_p50, ttft_p95 = _panel_queries("Time to first token per request (p50, p95)")
            tpot_p50, tpot_p95 = _panel_queries("Time per output token (p50, p95)")
            # Linear interpolation inside the bucket holding rank q * 4 of the 4 new requests:
            # TTFT increases per le: 0.25: 0, 0.5: 3, 2: 3, 4: 4. p50: rank 2 in (0.25, 0.5] holding 3
            # -> 0.25 + 0.25 * 2/3; p95: rank 3.8 in (2, 4] holding 1 -> 2 + 2 * 0.8.
            # TPOT 0.02, 0.025, 0.04, 0.2: le 0.02: 1, 0.04: 3, 0.15: 3, 0.25: 4. p50: rank 2 in
            # (0.02, 0.04] holding 2 -> 0.02 + 0.02 * 1/2; p95: rank 3.8 in (0.15, 0.25] -> 0.15 + 0.1 * 0.8.
            for promql, want in ((ttft_p50, 0.25 + 0.25 * 2 / 3), (ttft_p95, 2.0 + 2.0 * 0.8),
                                 (tpot_p50, 0.03), (tpot_p95, 0.15 + 0.1 * 0.8)):  # fmt: skip
                (series,) = _prom_query(client, base, promql)
                assert series["metric"]["model"] == "qwen3:8b"
                assert float(series["value"][1]) == pytest.approx(want, rel=1e-9), promql
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait(timeout=10)
        log.close()
        exporter.stop()
