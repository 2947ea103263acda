"""Detector thresholds (defaults are the product's opinion; users override them in config)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    confirm_s: float = 5.0  # a rate-based finding must hold this long to become an alert
    clear_s: float = 20.0  # and be absent this long for its episode to end
    kv_slowdown_pct: float = 15.0
    context_full_pct: float = 85.0
    below_floor_tok_s: float = 3.0
    low_efficiency_ratio: float = 0.45  # of the ceiling, fully on GPU
    draft_acceptance_min: float = 0.5
    spec_min_speedup: float = 0.95  # speculative decoding below this × plain decode is a slowdown
    vram_free_min_pct: float = 5.0
    regression_pct: float = 20.0
    offload_min_cpu_pct: float = 2.0
    offload_gpu_fraction: float = 0.98  # below this share in GPU memory a model counts as offloaded
    cold_load_min_s: float = 2.0  # a measured model load at least this long raises cold_load
