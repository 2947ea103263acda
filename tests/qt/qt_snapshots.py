"""Synthetic snapshots for the Qt tests (shapes as trayapp.core.model defines them)."""

from __future__ import annotations

from trayapp.core.model import (
    Alert,
    GpuReading,
    HardwareSnapshot,
    HostReading,
    ModelStatus,
    RequestRecord,
    ServerStatus,
    Snapshot,
)

LLAMA = "http://127.0.0.1:8080"
OLLAMA = "http://127.0.0.1:11434"
T0 = 1_700_000_000.0

HW = HardwareSnapshot(
    gpus=(
        GpuReading(
            index=0,
            name="NVIDIA GeForce RTX 4090",
            vendor="nvidia",
            vram_total_bytes=24_000_000_000,
            vram_used_bytes=21_300_000_000,
            bandwidth_gbps=1008.0,
            util_gpu_pct=97.0,
            temperature_c=71.0,
        ),
    ),
    host=HostReading(
        ram_total_bytes=64_000_000_000, ram_available_bytes=45_800_000_000, ram_bandwidth_gbps=54.0
    ),
)


def model(
    name: str = "llama3.1:8b", phase: str = "decoding", rate: float | None = 42.0, **kw: object
) -> ModelStatus:
    base: dict[str, object] = dict(
        quantization="Q4_K_M",
        ceiling_tok_s=62.0,
        full_gpu_ceiling_tok_s=62.0,
        gpu_fraction=1.0,
        context_tokens=6100,
        context_length=8192,
        size_bytes=4_900_000_000,
        ttft_s=0.31,
        prompt_tok_s=1850.0,
    )
    if phase == "decoding":
        base.update(decode_tok_s=rate, decode_exact=False, active_streams=1)
    base.update(kw)
    return ModelStatus(name=name, phase=phase, **base)  # type: ignore[arg-type]


def server(
    *models: ModelStatus, url: str = LLAMA, kind: str = "llamacpp", status: str = "ok"
) -> ServerStatus:
    return ServerStatus(kind=kind, url=url, status=status, models=models, version="b6000")  # type: ignore[arg-type]


def alert(alert_id: str = "offload-1", kind: str = "offload", severity: str = "warning") -> Alert:
    return Alert(
        id=alert_id,
        kind=kind,
        severity=severity,
        server=OLLAMA,
        model="qwen3:30b",  # type: ignore[arg-type]
        message="qwen3:30b spilled to the CPU (52 %)",
        cause="Decode ~9 tok/s instead of ~48. The context grew to 32k (+4.1 GB KV).",
        fix="num_ctx ≤ 12k keeps it on the GPU, or set KV cache to q8_0.",
        since_wall_s=T0,
    )


def request(rate: float, t: float, ctx: int = 6000, exact: bool = True) -> RequestRecord:
    return RequestRecord(
        server=LLAMA,
        server_kind="llamacpp",
        model="llama3.1:8b",
        finished_wall_s=T0 + t,
        session_id="s1",
        exact=exact,
        decode_tok_s=rate,
        context_tokens=ctx,
        decode_tokens=200,
    )


def snap(
    t: float, *servers: ServerStatus, alerts: tuple[Alert, ...] = (), requests: tuple[RequestRecord, ...] = ()
) -> Snapshot:
    return Snapshot(
        t_wall_s=T0 + t, t_mono_s=t, servers=servers, hardware=HW, alerts=alerts, requests=requests
    )
