"""Detector thresholds (defaults are the product's opinion; users override them in config).

Each field's facts are written once, on its line: the default, the range the config file and the
settings dialog accept, the dialog's label and the unit (`THRESHOLD_INFO` reads them back).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class ThresholdInfo:
    label: str  # the settings dialog's words for it
    low: float  # the accepted range, inclusive
    high: float
    unit: str = ""  # "s", "%", "tok/s", "×"; "" for a share or a ratio

    @property
    def caption(self) -> str:
        """The label with its unit: "Floor (tok/s)"."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


_INFO = "threshold"  # the key of a field's ThresholdInfo in its metadata


def _threshold(default: float, label: str, low: float, high: float, unit: str = "") -> float:
    return field(default=default, metadata={_INFO: ThresholdInfo(label, low, high, unit)})


@dataclass(frozen=True)
class Thresholds:
    # a rate-based finding must hold confirm_s to become an alert, and be gone clear_s for its episode to end
    confirm_s: float = _threshold(5.0, "Confirm an alert after", 0, 3600, "s")
    clear_s: float = _threshold(20.0, "Clear an alert after", 0, 3600, "s")
    kv_slowdown_pct: float = _threshold(15.0, "KV slowdown", 1, 95, "%")
    context_full_pct: float = _threshold(85.0, "Context full at", 1, 100, "%")
    below_floor_tok_s: float = _threshold(3.0, "Floor", 0, 1000, "tok/s")
    # of the ceiling, fully on GPU
    low_efficiency_ratio: float = _threshold(0.45, "Low efficiency (share of ceiling)", 0.01, 1)
    draft_acceptance_min: float = _threshold(0.5, "Minimum draft acceptance", 0, 1)
    # speculative decoding below this × plain decode is a slowdown
    spec_min_speedup: float = _threshold(0.95, "Speculative decoding: minimum speed-up", 0.1, 10, "×")
    vram_free_min_pct: float = _threshold(5.0, "Minimum free VRAM", 0, 100, "%")
    regression_pct: float = _threshold(20.0, "Regression", 1, 95, "%")
    offload_min_cpu_pct: float = _threshold(2.0, "Offload: minimum CPU share", 0, 100, "%")
    # below this share in GPU memory a model counts as offloaded
    offload_gpu_fraction: float = _threshold(0.98, "Offloaded below this GPU share", 0.5, 1)
    # a measured model load at least this long raises cold_load
    cold_load_min_s: float = _threshold(2.0, "Cold load: a model load longer than", 0, 3600, "s")


# Each field's facts, in the fields' order (the settings dialog's order).
THRESHOLD_INFO: dict[str, ThresholdInfo] = {f.name: f.metadata[_INFO] for f in fields(Thresholds)}
