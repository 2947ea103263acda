"""What the CLI hands the running sampler: a proxy's record of one request and a finished bench's
result, each with every kind of field the wire must carry (numbers as llama-server gives them)."""

from __future__ import annotations

from typing import Any

from trayapp.core.bench import BenchResult, BenchRun, BenchSettings, BenchTarget, Healthy, Spread, SweepPoint
from trayapp.core.model import FinishedRequest, KvLayout, ModelFacts

UPSTREAM = "http://127.0.0.1:8080"


def proxy_record(**fields: Any) -> FinishedRequest:
    """A proxy's record of one streamed llama-server request (numbers as the server gives them)."""
    base: dict[str, Any] = {
        "model": "gemma-3-270m-q4_k_m.gguf",
        "finished_wall_s": 1_764_590_400.25,
        "prompt_tokens": 1_536,
        "cached_tokens": 512,
        "decode_tokens": 24,
        "prompt_tok_s": 412.7,
        "decode_tok_s": 31.4159,
        "ttft_s": 3.73,
        "context_tokens": 1_560,
        "source": "proxy",
        "endpoint": "/completion",
        "http_status": 200,
    }
    return FinishedRequest(**{**base, **fields})


def _run(kind: str, rate: float, warmup: bool = False) -> BenchRun:
    return BenchRun(
        kind=kind,  # type: ignore[arg-type]
        warmup=warmup,
        depth_tokens=0,
        prompt_tokens=24,
        cached_tokens=0,
        decode_tokens=16,
        streamed_tokens=16,
        server_decode_tok_s=rate,
        stream_decode_tok_s=rate * 0.98,
        ttft_s=0.081,
        prompt_tok_s=296.3,
        prompt_rate_upper_bound=False,
        wall_s=0.6,
        gpu_fraction=0.0,
    )


def bench_result(rates: tuple[float, ...] = (30.1, 30.4), **fields: Any) -> BenchResult:
    """A finished `llm-tray bench` with every kind of field the wire must carry."""
    facts = ModelFacts(
        weights_bytes=241_000_000,
        bytes_per_token=160_000_000,
        exact=True,
        source="gguf",
        architecture="gemma3",
        quantization="Q4_K_M",
        parameter_count=268_000_000,
        kv=KvLayout(full_elems_per_token=2_048, swa_elems_per_token=10_240, sliding_window=512, n_layers=18),
    )
    target = BenchTarget(
        server_url=UPSTREAM,
        server_kind="llamacpp",
        server_version="b11434",
        model="gemma-3-270m-q4_k_m.gguf",
        quantization="Q4_K_M",
        facts=facts,
        context_length=8_192,
        gpu_fraction=0.0,
        gpu_fraction_source="no-gpu",
        vram_bytes=None,
        hardware="CPU + 50 GB/s RAM",
        hardware_detail={"gpus": [], "ram_bandwidth_gbps": 50.0, "ram_bandwidth_source": "configured"},
        spec_type=None,
    )
    runs = (*(_run("decode", r) for r in rates), _run("prompt", 30.0))
    spread = Spread(max(rates) - min(rates), 0.007)
    base: dict[str, Any] = {
        "target": target,
        "settings": BenchSettings(tokens=16, runs=2, warmup=0, depths=(0,), prompt_depth_tokens=2_048),
        "runs": runs,
        "sweep": (SweepPoint(0, 40, 30.25, spread, None, 312.5, 2),),
        "decode_tok_s": 30.25,
        "decode_exact": True,
        "decode_spread": spread,
        "ttft_s": 6.91,
        "prompt_tok_s": 296.3,
        "prompt_rate_upper_bound": False,
        "ceiling_tok_s": 312.5,
        "efficiency": 0.0968,
        "healthy": Healthy(None, None, None, "not_judged", "no GPU: not judged"),
        "started_wall_s": 1_764_590_000.5,
        "finished_wall_s": 1_764_590_031.75,
        "warnings": ("the machine was busy",),
    }
    return BenchResult(**{**base, **fields})
