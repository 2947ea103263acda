"""Store test builders: the snapshot, model and session a test records, and rows read back.

Shared by tests/unit/test_store.py and tests/integration/test_store_processes.py (whose child
processes import them from here).
"""

from __future__ import annotations

from typing import Any

from tests.support.snapshots import hardware_snapshot, rtx4090
from trayapp.core.model import (
    Alert,
    HardwareSnapshot,
    ModelStatus,
    RequestRecord,
    ServerStatus,
    SessionRecord,
    Snapshot,
)
from trayapp.sinks.store import Store

T0 = 1_750_000_000.0

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
    requests: tuple[RequestRecord, ...] = (),
    alerts: tuple[Alert, ...] = (),
    ended: tuple[Alert, ...] = (),
    hardware: HardwareSnapshot = HARDWARE,
) -> Snapshot:
    """One Ollama server at `url` with `models`, at wall time `t` (monotonic time t - T0)."""
    server = ServerStatus(kind="ollama", url=url, status="ok", version="0.30.1", models=models)
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
        "hardware": "RTX 4090 (1008 GB/s) + 54 GB/s RAM",
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


def rows(store: Store, table: str, **kw: object) -> list[dict[str, Any]]:
    """Every row of `table`, as the store reads it back."""
    return list(store.iter_rows(table, **kw))  # type: ignore[arg-type]
