"""Copy diagnostics: complete enough for a bug report, and redacted."""

from __future__ import annotations

from dataclasses import replace

from trayapp.core.diagnostics import diagnostics_text
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading, RamBandwidthChange
from trayapp.core.model import Alert, ModelStatus, ServerStatus, Snapshot
from trayapp.core.redact import redact, redact_url

SECRET_URL = "http://alice:hunter2@127.0.0.1:8080/v1?token=s3cr3t-tok&api_key=abc123#frag"
API_KEY = "sk-live-0123456789abcdef"


def snapshot() -> Snapshot:
    gpu = GpuReading(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        vendor="nvidia",
        vram_total_bytes=24_000_000_000,
        vram_used_bytes=21_300_000_000,
        bandwidth_gbps=1008.0,
        bandwidth_source="table",
        util_gpu_pct=97.0,
        temperature_c=71.0,
    )
    host = HostReading(
        ram_total_bytes=64_000_000_000,
        ram_available_bytes=45_800_000_000,
        ram_bandwidth_gbps=54.0,
        ram_bandwidth_source="measured",
        cpu_count=16,
    )
    model = ModelStatus(
        name="llama3.1:8b",
        phase="decoding",
        quantization="Q4_K_M",
        decode_tok_s=42.0,
        decode_exact=True,
        ceiling_tok_s=62.0,
        context_tokens=6100,
        context_length=8192,
        gpu_fraction=1.0,
        ttft_s=0.31,
        prompt_tok_s=1850.0,
        draft_acceptance=0.72,
    )
    servers = (
        ServerStatus(kind="llamacpp", url=SECRET_URL, status="ok", version="b6000", models=(model,)),
        ServerStatus(
            kind="ollama",
            url="http://127.0.0.1:11434",
            status="unauthorized",
            reason=f"HTTP 401 (sent Authorization: Bearer {API_KEY})",
        ),
    )
    alert = Alert(
        id="a1",
        kind="offload",
        severity="warning",
        server=SECRET_URL,
        model="qwen3:30b",
        message="qwen3:30b spilled to the CPU (52 %)",
        fix="num_ctx 12k",
        since_wall_s=1_700_000_000.0,
        evidence={"cpu_share": 0.52, "full_gpu_tok_s": 48.0},
        cause="context grew to 32k",
    )
    return Snapshot(
        t_wall_s=1_700_000_100.0,
        t_mono_s=5.0,
        servers=servers,
        hardware=HardwareSnapshot(gpus=(gpu,), host=host),
        alerts=(alert,),
    )


def test_urls_lose_userinfo_and_query_tokens() -> None:
    assert redact_url(SECRET_URL) == "http://127.0.0.1:8080/v1"
    assert redact("see https://bob:pw@example.com:443/x?token=1 now") == "see https://example.com:443/x now"


def test_diagnostics_has_the_facts_and_no_secrets() -> None:
    summary = f"endpoint {SECRET_URL} (api_key_env=LLAMA_KEY)\napi_key = {API_KEY}\nexporter off"
    text = diagnostics_text(snapshot(), summary, versions={"PySide6": "6.12.0"})
    for secret in ("alice", "hunter2", "s3cr3t-tok", "abc123", API_KEY, "frag"):
        assert secret not in text, secret
    assert "http://127.0.0.1:8080/v1" in text
    assert "api_key_env=LLAMA_KEY" in text  # the variable's name is not a secret
    assert "PySide6 6.12.0" in text and "llm-tray 0.1.0" in text
    assert "NVIDIA GeForce RTX 4090" in text and "1008 GB/s (table)" in text
    assert "decode 42.0 tok/s (exact)" in text and "ceiling 62.0 tok/s (68 %)" in text
    assert "[warning] offload (active) qwen3:30b" in text and "fix: num_ctx 12k" in text
    assert "unauthorized" in text and "Bearer <redacted>" in text


def test_without_a_snapshot() -> None:
    text = diagnostics_text(None, "defaults")
    assert "no snapshot yet" in text and "defaults" in text


def test_diagnostics_say_when_the_ceiling_moved_with_the_ram_bandwidth() -> None:
    """The same line `status` and the dashboard show. 1_700_000_100 is 2023-11-14 22:15 UTC; the
    change came an hour and 100 s earlier, the same day, so only the time is given."""
    base = snapshot()
    change = RamBandwidthChange(
        previous_gbps=28.4,
        gbps=31.3,
        changed_at_wall_s=1_700_000_000.0 - 3600,
        reason="first quiet measurement",
    )
    host = replace(base.hardware.host, ram_bandwidth_change=change)
    text = diagnostics_text(replace(base, hardware=replace(base.hardware, host=host)), "defaults")
    assert "  ceiling changed 28.4 → 31.3 GB/s RAM at 21:13 UTC: first quiet measurement\n" in text
    assert "ceiling changed" not in diagnostics_text(base, "defaults")
