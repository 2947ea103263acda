"""`bench --json`: a BenchResult as the document docs/json.md describes (schema 1)."""

from __future__ import annotations

from typing import Any

from trayapp.core.bench import BENCH_SCHEMA, BenchResult, BenchRun


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def run_json(run: BenchRun) -> dict[str, Any]:
    return {
        "kind": run.kind,
        "warmup": run.warmup,
        "depth": run.depth_tokens,
        "prompt_tokens": run.prompt_tokens,
        "cached_tokens": run.cached_tokens,
        "decode_tokens": run.decode_tokens,
        "streamed_tokens": run.streamed_tokens,
        "decode_tok_s": _r(run.decode_tok_s),
        "decode_exact": run.decode_exact,
        "energy_j": _r(run.energy_j, 3),
        "server_decode_tok_s": _r(run.server_decode_tok_s),
        "stream_decode_tok_s": _r(run.stream_decode_tok_s),
        "ttft_s": _r(run.ttft_s, 4),
        "prompt_tok_s": _r(run.prompt_tok_s),
        "prompt_rate_upper_bound": run.prompt_rate_upper_bound,
        "wall_s": _r(run.wall_s),
        "gpu_fraction": _r(run.gpu_fraction),
        "spilled": run.spilled,
    }


def bench_json(result: BenchResult) -> dict[str, Any]:
    """The `bench --json` object (docs/json.md, "bench")."""
    target, settings, healthy = result.target, result.settings, result.healthy
    return {
        "schema": BENCH_SCHEMA,
        "kind": "bench",
        "started": result.started_wall_s,
        "finished": result.finished_wall_s,
        "server": {"url": target.server_url, "kind": target.server_kind, "version": target.server_version},
        "model": target.model,
        "quantization": target.quantization,
        "context_length": target.context_length,
        "hardware": {
            "label": target.hardware,
            **target.hardware_detail,
            "gpu_fraction": _r(target.gpu_fraction),
            "gpu_fraction_source": target.gpu_fraction_source,
            "vram_bytes": target.vram_bytes,
        },
        "settings": {
            "tokens": settings.tokens,
            "runs": settings.runs,
            "warmup": settings.warmup,
            "depths": list(settings.depths),
            "prompt_depth": settings.prompt_depth_tokens,
            "forced": settings.forced,
        },
        "decode_tok_s": _r(result.decode_tok_s),
        "decode_exact": result.decode_exact,
        "decode_j_per_token": _r(result.decode_j_per_token, 4),
        "energy_reason": result.energy_reason,
        "decode_spread": {"tok_s": _r(result.decode_spread.tok_s), "cv": _r(result.decode_spread.cv, 4)},
        "ttft_s": _r(result.ttft_s, 4),
        "prompt_tok_s": _r(result.prompt_tok_s),
        "prompt_rate_upper_bound": result.prompt_rate_upper_bound,
        "ceiling_tok_s": _r(result.ceiling_tok_s),
        "efficiency": _r(result.efficiency, 4),
        "healthy": {
            "band_tok_s": None
            if healthy.band_low_tok_s is None or healthy.band_high_tok_s is None
            else [_r(healthy.band_low_tok_s), _r(healthy.band_high_tok_s)],
            "low_efficiency_below_tok_s": _r(healthy.floor_tok_s),
            "verdict": healthy.verdict,
            "reason": healthy.reason,
        },
        "sweep": [
            {
                "depth": p.depth_tokens,
                "context_tokens": p.context_tokens,
                "decode_tok_s": _r(p.decode_tok_s),
                "decode_spread_tok_s": _r(p.spread.tok_s),
                "predicted_tok_s": _r(p.predicted_tok_s),
                "ceiling_tok_s": _r(p.ceiling_tok_s),
                "runs": p.runs,
            }
            for p in result.sweep
        ],
        "sweep_stopped": result.sweep_stopped,
        "interrupted": result.interrupted,
        "warnings": list(result.warnings),
        "runs": [run_json(r) for r in result.runs],
    }
