"""Synthetic snapshots and records for the tests (shapes as trayapp.core.model defines them).

Builders take keyword overrides, so each test keeps its own values. The defaults of `model`,
`server`, `alert`, `request` and `snap` (and `T0`, `HW`) are the Qt tests' values.
"""

from __future__ import annotations

from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.model import Alert, ModelStatus, RequestRecord, ServerStatus, Snapshot

LLAMA = "http://127.0.0.1:8080"
OLLAMA = "http://127.0.0.1:11434"
T0 = 1_700_000_000.0


def rtx4090(**kw: object) -> GpuReading:
    """GPU 0, an RTX 4090 (25.8 GB of VRAM, 20 GB used, 1008 GB/s); `kw` overrides any field."""
    values: dict[str, object] = {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "vendor": "nvidia",
        "vram_total_bytes": 25_757_220_864,
        "vram_used_bytes": 20_000_000_000,
        "bandwidth_gbps": 1008.0,
    }
    values.update(kw)
    return GpuReading(**values)  # type: ignore[arg-type]


def hardware_snapshot(*gpus: GpuReading, **host: object) -> HardwareSnapshot:
    """`gpus` on a host with 64 GB of RAM (40 GB available, 54 GB/s); `host` overrides HostReading fields."""
    values: dict[str, object] = {
        "ram_total_bytes": 64_000_000_000,
        "ram_available_bytes": 40_000_000_000,
        "ram_bandwidth_gbps": 54.0,
    }
    values.update(host)
    return HardwareSnapshot(gpus=gpus, host=HostReading(**values))  # type: ignore[arg-type]


HW = hardware_snapshot(
    rtx4090(
        vram_total_bytes=24_000_000_000, vram_used_bytes=21_300_000_000, util_gpu_pct=97.0, temperature_c=71.0
    ),
    ram_available_bytes=45_800_000_000,
)


def model(
    name: str = "llama3.1:8b",
    phase: str = "decoding",
    rate: float | None = 42.0,
    *,
    exact: bool = False,
    **kw: object,
) -> ModelStatus:
    """A Q4_K_M model all on the GPU (ceiling 62 tok/s, context 6100 / 8192); while "decoding",
    one stream at `rate` tok/s (`exact`: timed by the server). `kw` overrides any field."""
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
        base.update(decode_tok_s=rate, decode_exact=exact, active_streams=1)
    base.update(kw)
    return ModelStatus(name=name, phase=phase, **base)  # type: ignore[arg-type]


def server(
    *models: ModelStatus,
    url: str = LLAMA,
    kind: str = "llamacpp",
    status: str = "ok",
    version: str | None = "b6000",
) -> ServerStatus:
    return ServerStatus(kind=kind, url=url, status=status, models=models, version=version)  # type: ignore[arg-type]


def alert(
    alert_id: str = "offload-1", kind: str = "offload", severity: str = "warning", **kw: object
) -> Alert:
    """An offload-style alert on qwen3:30b at the Ollama URL; `kw` overrides any other field."""
    values: dict[str, object] = {
        "server": OLLAMA,
        "model": "qwen3:30b",
        "message": "qwen3:30b spilled to the CPU (52 %)",
        "cause": "Decode ~9 tok/s instead of ~48. The context grew to 32k (+4.1 GB KV).",
        "fix": "num_ctx ≤ 12k keeps it on the GPU, or set KV cache to q8_0.",
        "since_wall_s": T0,
    }
    values.update(kw)
    return Alert(id=alert_id, kind=kind, severity=severity, **values)  # type: ignore[arg-type]


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
    t: float,
    *servers: ServerStatus,
    alerts: tuple[Alert, ...] = (),
    requests: tuple[RequestRecord, ...] = (),
    hardware: HardwareSnapshot = HW,
) -> Snapshot:
    """A snapshot `t` seconds after `T0` (its monotonic clock reads `t`)."""
    return Snapshot(
        t_wall_s=T0 + t, t_mono_s=t, servers=servers, hardware=hardware, alerts=alerts, requests=requests
    )
