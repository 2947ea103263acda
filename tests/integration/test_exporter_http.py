"""The Prometheus exporter serves /metrics over real HTTP on 127.0.0.1."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.metrics import T0, snapshot
from trayapp.adapters.metrics import MetricsState, start_exporter


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
