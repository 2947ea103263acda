"""Store test builders: the snapshot, model and session a test records, and rows read back.

Shared by the store, export, report and bench tests and tests/integration/test_store_processes.py
(whose child processes import them from here); `bench_result` is what `llm-tray bench` hands the store.
"""

from __future__ import annotations

from typing import Any

from tests.support.snapshots import hardware_snapshot, rtx4090
from trayapp.core.bench import BenchResult, BenchSettings, BenchTarget, Healthy, Spread, SweepPoint
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import Alert, ModelStatus, RequestRecord, ServerStatus, SessionRecord, Snapshot
from trayapp.sinks.store import Store

T0 = 1_750_000_000.0
HARDWARE_LABEL = "RTX 4090 (1008 GB/s) + 54 GB/s RAM"  # session()'s and bench_result()'s hardware

HARDWARE = hardware_snapshot(
    rtx4090(bandwidth_source="nvml"), ram_bandwidth_gbps=54.2, ram_bandwidth_source="measured"
)


def model(name: str = "qwen3:8b", **kw: object) -> ModelStatus:
    """qwen3:8b decoding at 81.25 tok/s in session s1; `kw` overrides any field."""
    values: dict[str, object] = {
        "phase": "decoding",
        "decode_tok_s": 81.25,
        "decode_total_tok_s": 81.25,
        "active_streams": 1,
        "decode_exact": False,
        "prompt_tok_s": 412.5,
        "ttft_s": 0.318,
        "ttft_exact": True,
        "context_tokens": 1234,
        "context_length": 8192,
        "ceiling_tok_s": 120.5,
        "full_gpu_ceiling_tok_s": 130.25,
        "gpu_fraction": 0.93,
        "vram_bytes": 5_500_000_000,
        "draft_acceptance": 0.625,
        "session_id": "s1",
    }
    values.update(kw)
    return ModelStatus(name=name, **values)  # type: ignore[arg-type]


def snapshot(
    t: float,
    models: tuple[ModelStatus, ...] = (),
    *,
    url: str = "http://127.0.0.1:11434",
    kind: str = "ollama",
    version: str = "0.30.1",
    requests: tuple[RequestRecord, ...] = (),
    alerts: tuple[Alert, ...] = (),
    ended: tuple[Alert, ...] = (),
    hardware: HardwareSnapshot = HARDWARE,
) -> Snapshot:
    """One server (Ollama 0.30.1 unless `kind`, `version`) at `url` with `models`, at wall time `t`
    (monotonic time t - T0)."""
    server = ServerStatus(kind=kind, url=url, status="ok", version=version, models=models)
    return Snapshot(
        t_wall_s=t,
        t_mono_s=t - T0,
        servers=(server,),
        hardware=hardware,
        alerts=alerts,
        requests=requests,
        ended_alerts=ended,
    )


def session(sid: str = "s1", **kw: object) -> SessionRecord:
    """An open qwen3:8b session on Ollama started at T0; `kw` overrides any field."""
    values: dict[str, object] = {
        "id": sid,
        "server": "http://127.0.0.1:11434",
        "server_kind": "ollama",
        "model": "qwen3:8b",
        "started_wall_s": T0,
        "ended_wall_s": None,
        "server_version": "0.30.1",
        "quantization": "Q4_K_M",
        "hardware": HARDWARE_LABEL,
        "requests": 3,
        "decode_tokens": 900,
        "mean_decode_tok_s": 78.5,
        "peak_decode_tok_s": 83.0,
        "mean_prompt_tok_s": 880.0,
        "mean_ttft_s": 0.52,
        "max_context_tokens": 2048,
        "ceiling_tok_s": 130.0,
        "gpu_fraction": 1.0,
        "alerts": ("kv_slowdown", "context_full"),
    }
    values.update(kw)
    return SessionRecord(**values)  # type: ignore[arg-type]


def sweep_point(depth: int, context: int, rate: float, ceiling: float, runs: int = 3) -> SweepPoint:
    """One depth of a bench's sweep: `rate` tok/s against `ceiling`, spread 1.5 tok/s (CV 0.02)."""
    return SweepPoint(depth, context, rate, Spread(1.5, 0.02), None, ceiling, runs)


def bench_result(
    started: float,
    points: tuple[SweepPoint, ...],
    *,
    version: str = "0.30.1",
    spec_type: str | None = None,
    hardware: str = HARDWARE_LABEL,
    verdict: str = "healthy",
) -> BenchResult:
    """A finished `llm-tray bench` of session()'s qwen3:8b on Ollama, with the sweep `points`."""
    target = BenchTarget(
        server_url="http://127.0.0.1:11434",
        server_kind="ollama",
        server_version=version,
        model="qwen3:8b",
        quantization="Q4_K_M",
        facts=None,
        context_length=8192,
        gpu_fraction=1.0,
        gpu_fraction_source="ollama",
        vram_bytes=5 * 10**9,
        hardware=hardware,
        spec_type=spec_type,
    )
    settings = BenchSettings(
        tokens=200, runs=3, warmup=1, depths=tuple(p.depth_tokens for p in points), prompt_depth_tokens=512
    )
    first = points[0]
    return BenchResult(
        target=target,
        settings=settings,
        runs=(),
        sweep=points,
        decode_tok_s=first.decode_tok_s,
        decode_exact=True,
        decode_spread=first.spread,
        ttft_s=0.25,
        prompt_tok_s=2048.0,
        prompt_rate_upper_bound=False,
        ceiling_tok_s=first.ceiling_tok_s,
        efficiency=None,
        healthy=Healthy(None, None, None, verdict, "test"),  # type: ignore[arg-type]
        started_wall_s=started,
        finished_wall_s=started + 30,
    )


def rows(store: Store, table: str, **kw: object) -> list[dict[str, Any]]:
    """Every row of `table`, as the store reads it back."""
    return list(store.iter_rows(table, **kw))  # type: ignore[arg-type]
