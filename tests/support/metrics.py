"""Prometheus test helpers: a two-server snapshot, and the collector's output parsed back.

Shared by tests/unit/test_metrics.py, tests/integration/test_exporter_http.py and the Qt tests.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.snapshots import LLAMA, OLLAMA, hardware_snapshot, rtx4090
from trayapp.core.model import Alert, ModelStatus, RequestRecord, ServerStatus, Snapshot
from trayapp.sinks.metrics import MetricsState

T0 = 1_750_000_000.0

HARDWARE = hardware_snapshot(rtx4090())


def snapshot(
    t: float,
    *,
    rate: float | None = 80.0,
    requests: tuple[RequestRecord, ...] = (),
    alerts: tuple[Alert, ...] = (),
    llama_status: str = "ok",
    model_name: str = "qwen3:8b",
) -> Snapshot:
    """Ollama decoding qwen3:8b (80 tok/s of a 100 tok/s ceiling), llama.cpp idle on gemma3."""
    qwen = ModelStatus(
        name=model_name,
        phase="decoding" if rate else "idle",
        decode_tok_s=rate,
        decode_total_tok_s=rate,
        active_streams=1 if rate else 0,
        decode_exact=False,
        prompt_tok_s=400.0,
        ceiling_tok_s=100.0,
        full_gpu_ceiling_tok_s=125.0,
        gpu_fraction=0.75,
        context_tokens=3000,
        context_length=8192,
        vram_bytes=6_000_000_000,
        size_bytes=8_000_000_000,
        ttft_s=0.25,
        draft_acceptance=None,
    )
    gemma = ModelStatus(name="gemma3", phase="idle")
    servers = (
        ServerStatus(kind="ollama", url=OLLAMA, status="ok", models=(qwen,)),
        ServerStatus(kind="llamacpp", url=LLAMA, status=llama_status, models=(gemma,)),  # type: ignore[arg-type]
    )
    return Snapshot(
        t_wall_s=t,
        t_mono_s=t - T0,
        servers=servers,
        hardware=HARDWARE,
        alerts=alerts,
        requests=requests,
    )


def scrape(state: MetricsState) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The collector's text output parsed back: metric name → [(labels, value)]."""
    text = generate_latest(state.registry).decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], metric: str, **labels: str) -> float:
    """The one sample of `metric` whose labels include `labels` (fails unless exactly one)."""
    matches = [
        v for lab, v in samples.get(metric, []) if all(lab.get(k) == want for k, want in labels.items())
    ]
    assert len(matches) == 1, (metric, labels, samples.get(metric))
    return matches[0]
