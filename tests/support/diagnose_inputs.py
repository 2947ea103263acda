"""Inputs of the diagnosis scenarios (tests/unit/test_diagnose_scenarios.py, test_calibration.py):
an RTX 4090 machine's hardware and the llama-server and Ollama readings it polls, one a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from trayapp.core.hardware_readings import GpuProcess, GpuReading, HardwareSnapshot, HostReading
from trayapp.core.model import CounterReading, KvLayout, ModelFacts, ModelReading, ServerReading, SlotReading

GB = 1_000_000_000
GIB = 1024**3
WALL0 = 1_750_000_000.0
LLAMA_URL = "http://127.0.0.1:8080"
OLLAMA_URL = "http://127.0.0.1:11434"
LLAMA_PID = 4242
OLLAMA_PID = 1111
RUNNER_PID = 5151  # Ollama's llama-server child for the loaded model
RAM_GBPS = 60.0  # dual-channel DDR5 as DOMAIN.md §2's worked example (60 GB/s)
VRAM_TOTAL = 24 * GIB  # 25_769_803_776 B

# Every input below is a literal worked out by hand (DOMAIN.md §1–3, reference/hardware.md §5);
# no trayapp code computes a test input. KV per token (f16 cache, hardware.md §5.3):
# n_layers × n_kv_heads × (key_length + value_length) elements × 2 B.
# Llama-3.1-8B: 32 × 8 × (128 + 128) = 65_536 elements → 131_072 B (128 KiB) per token.
KV_8B = KvLayout(full_elems_per_token=65_536, n_layers=32)
# A 32B dense model (Qwen2.5-32B shape): 64 × 8 × (128 + 128) = 131_072 elements → 262_144 B per token.
KV_32B = KvLayout(full_elems_per_token=131_072, n_layers=64)


def facts(weights_bytes: int, params: int, quant: str, kv: KvLayout) -> ModelFacts:
    return ModelFacts(
        weights_bytes=weights_bytes,
        bytes_per_token=weights_bytes,
        exact=False,
        source="estimate",
        architecture="llama",
        quantization=quant,
        parameter_count=params,
        kv=kv,
    )


# llama3.1:8b Q4_K_M: 4_920_753_328 B, the `size` of fixtures/ollama/api_tags.json (8.03e9 params ×
# 4.90 bpw; hardware.md §5.1 gives 4.89 bpw for Llama-3.1-8B Q4_K_M). Ceiling on a 4090 near empty
# context: 1008e9 / 4.92e9 ≈ 205 tok/s (DOMAIN.md §1).
LLAMA_8B = facts(4_920_753_328, 8_030_000_000, "Q4_K_M", KV_8B)
# 32.76e9 params × 8.50 bpw (Q8_0, hardware.md §5.1) ÷ 8 = 34_807_500_000 B: 34.8 GB > 24 GiB.
QWEN_32B_Q8 = facts(34_807_500_000, 32_760_000_000, "Q8_0", KV_32B)
# 32.76e9 params × 4.89 bpw (Q4_K_M) ÷ 8 = 20_024_550_000 B: 20.0 GB, fits at a 4k context.
QWEN_32B_Q4 = facts(20_024_550_000, 32_760_000_000, "Q4_K_M", KV_32B)

# Ollama's `size` (backends.md §1.2: weights + KV cache + compute buffers). The buffers are taken
# as 0.9 GB for a 32B model (api_ps.json's llama3.1:8b at 8k shows ~0.3 GB: 6_294_446_080 − 4_920_753_328
# − 8192 × 131_072 = 299_950_928 B; a 32B model's compute buffers are larger).
# Q8_0 at 32k: 34_807_500_000 + 32768 × 262_144 (8_589_934_592) + 900_000_000 = 44_297_434_592 B.
QWEN_Q8_32K_SIZE = 44_297_434_592
# `ollama ps` "52%/48% CPU/GPU": size_vram = round(44_297_434_592 × 0.48) = 21_262_768_604 B.
QWEN_Q8_32K_VRAM = 21_262_768_604
# Q4_K_M at 4k: 20_024_550_000 + 4096 × 262_144 (1_073_741_824) + 900_000_000 = 21_998_291_824 B.
QWEN_Q4_4K_SIZE = 21_998_291_824
# Q4_K_M at 8k: 20_024_550_000 + 8192 × 262_144 (2_147_483_648) + 900_000_000 = 23_072_033_648 B.
QWEN_Q4_8K_SIZE = 23_072_033_648
# Q4_K_M at 32k: 20_024_550_000 + 8_589_934_592 + 900_000_000 = 29_514_484_592 B.
QWEN_Q4_32K_SIZE = 29_514_484_592

# What NVML shows llama-server holding for LLAMA_8B at n_ctx 32768, fully on the GPU: weights
# 4_920_753_328 + KV 32768 × 131_072 = 4_294_967_296 → 9.22 GB, + ~0.3 GB CUDA context and compute
# buffers (as api_ps.json above) ≈ 9.51 GB. The core's own estimate of the need is 9.85 GB (its
# planning rule, not DOMAIN.md's: + 0.5 GiB + 2 % of the weights = 635_285_978 B), so the process
# holds 9.51 / 9.85 = 97 % of it: "all on the GPU".
LLAMA_8B_32K_HELD_BYTES = 9_510_000_000
DESKTOP_BYTES = 300_000_000  # Xorg's share of the GPU
DRIVER_RESERVED_BYTES = 400_000_000  # NVML's `used` includes driver-reserved memory (hardware.md §1.6)


# --------------------------------------------------------------------------- hardware


def hardware(
    used_bytes: int,
    processes: Sequence[GpuProcess] = (),
    throttle: tuple[str, ...] = (),
) -> HardwareSnapshot:
    gpu = GpuReading(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        vendor="nvidia",
        vram_total_bytes=VRAM_TOTAL,
        vram_used_bytes=used_bytes,
        bandwidth_gbps=1008.0,
        bandwidth_source="table",
        util_gpu_pct=95.0,
        temperature_c=84.0 if throttle else 62.0,
        throttle_reasons=throttle,
        processes=tuple(processes),
    )
    host = HostReading(
        ram_total_bytes=64 * GIB,
        ram_available_bytes=40 * GIB,
        ram_bandwidth_gbps=RAM_GBPS,
        ram_bandwidth_source="measured",
        cpu_percent=25.0,
        cpu_count=16,
    )
    return HardwareSnapshot(gpus=(gpu,), host=host)


def llama_hardware(throttle: tuple[str, ...] = ()) -> HardwareSnapshot:
    """llama-server fully on the GPU with LLAMA_8B at n_ctx 32768: NVML lists its process."""
    desktop = GpuProcess(pid=900, name="Xorg", used_bytes=DESKTOP_BYTES)
    process = GpuProcess(pid=LLAMA_PID, name="llama-server", used_bytes=LLAMA_8B_32K_HELD_BYTES)
    # used: 9_510_000_000 + 300_000_000 + 400_000_000 = 10_210_000_000 B of 25_769_803_776.
    return hardware(10_210_000_000, (process, desktop), throttle)


# --------------------------------------------------------------------------- readings


def request_slots(
    task: int, prompt_tokens: int, rate_tok_s: float, decode_s: int, prefill_s: int = 1, n_ctx: int = 32768
) -> list[SlotReading]:
    """One llama-server slot polled once a second: prefill, decode at `rate_tok_s`, then finished."""
    polls = [SlotReading(0, True, task, 0, prompt_tokens, n_ctx=n_ctx) for _ in range(prefill_s)]
    for i in range(1, decode_s + 1):
        n = round(rate_tok_s * i)
        polls.append(SlotReading(0, True, task, n, prompt_tokens + n, n_ctx=n_ctx))
    n = round(rate_tok_s * decode_s)
    polls.append(SlotReading(0, False, task, n, prompt_tokens + n, n_ctx=n_ctx))
    return polls


def idle_slots(last: SlotReading, seconds: int) -> list[SlotReading]:
    return [replace(last, is_processing=False)] * seconds


def llama_reading(
    slot: SlotReading | None,
    model_facts: ModelFacts = LLAMA_8B,
    n_ctx: int = 32768,
    counters: CounterReading | None = None,
    version: str = "b6500",
    status: str = "ok",
) -> ServerReading:
    if status != "ok":
        return ServerReading(kind="llamacpp", url=LLAMA_URL, status=status, reason="connection refused")  # type: ignore[arg-type]
    model = ModelReading(
        name="Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        weights_bytes=model_facts.weights_bytes,
        context_length=n_ctx,
        quantization=model_facts.quantization,
        facts=model_facts,
        slots=(slot,) if slot is not None else (),
        counters=counters,
        busy=slot.is_processing if slot is not None else None,
    )
    return ServerReading(
        kind="llamacpp", url=LLAMA_URL, status="ok", version=version, models=(model,), pid=LLAMA_PID
    )


def ollama_model(
    model_facts: ModelFacts, n_ctx: int, size_bytes: int, vram_bytes: int, slot: SlotReading | None = None
) -> ModelReading:
    return ModelReading(
        name="qwen2.5:32b",
        size_bytes=size_bytes,
        vram_bytes=vram_bytes,
        context_length=n_ctx,
        quantization=model_facts.quantization,
        parameter_count=model_facts.parameter_count,
        architecture="qwen2",
        facts=model_facts,
        slots=(slot,) if slot is not None else (),
        server_pid=RUNNER_PID,
    )


def ollama_reading(*models: ModelReading) -> ServerReading:
    return ServerReading(
        kind="ollama", url=OLLAMA_URL, status="ok", version="0.12.3", models=models, pid=OLLAMA_PID
    )
