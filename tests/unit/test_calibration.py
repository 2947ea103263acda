"""Calibration (#13): a benched efficiency centres the healthy band and moves the low_efficiency floor.

Pure: the math (`diagnose.calibration_factor` and friends), bench's verdict (`healthy_range`), the
detector through `diagnose_model`, and the calibration passed into the pipeline as data (as the
monitor passes what the store says). Every expected value is hand arithmetic written next to it.
"""

from __future__ import annotations

import pytest

from tests.support.diagnose_inputs import WALL0, llama_hardware, llama_reading, request_slots
from trayapp.core.bench import healthy_range
from trayapp.core.diagnose import (
    ModelView,
    calibration_factor,
    diagnose_model,
    healthy_band_shares,
    low_efficiency_share,
)
from trayapp.core.machine import Machine, resolve_machine
from trayapp.core.model import ModelStatus, ServerStatus
from trayapp.core.pipeline import Pipeline, Priors
from trayapp.core.thresholds import Thresholds

GPU = Machine("Test GPU", 100.0, 24 * 10**9, 50.0, has_gpu=True)
T = Thresholds()  # low_efficiency_ratio 0.45


@pytest.mark.parametrize(
    ("calibrated", "factor"),
    [
        (None, 1.0),
        (0.675, 1.0),  # the generic middle of 60–75 %
        (0.54, 0.8),  # 0.54 ÷ 0.675
        (0.81, 1.2),  # 0.81 ÷ 0.675
        (0.0, 1.0),  # not a share of the ceiling: ignored
        (1.4, 1.0),  # above the ceiling: ignored
    ],
)
def test_the_factor_is_the_benched_efficiency_over_the_generic_one(
    calibrated: float | None, factor: float
) -> None:
    assert calibration_factor(calibrated) == pytest.approx(factor)


def test_the_band_and_the_floor_scale_together() -> None:
    assert healthy_band_shares(None) == pytest.approx((0.60, 0.75))
    assert healthy_band_shares(0.54) == pytest.approx((0.48, 0.60))  # 0.60 × 0.8, 0.75 × 0.8: centre 0.54
    assert low_efficiency_share(T, None) == pytest.approx(0.45)
    assert low_efficiency_share(T, 0.54) == pytest.approx(0.36)  # 0.45 ÷ 0.675 × 0.54
    assert low_efficiency_share(T, 0.81) == pytest.approx(0.54)  # 0.45 ÷ 0.675 × 0.81


def test_bench_verdict_uses_the_calibrated_band() -> None:
    # ceiling 100 tok/s; generic band 60–75, floor 45; calibrated 0.54: band 48–60, floor 36
    generic = healthy_range(100.0, 40.0, GPU, 1.0, T)
    calibrated = healthy_range(100.0, 40.0, GPU, 1.0, T, 0.54)
    assert generic.verdict == "low_efficiency" and generic.floor_tok_s == pytest.approx(45.0)
    assert calibrated.verdict == "below_band" and calibrated.floor_tok_s == pytest.approx(36.0)
    assert (calibrated.band_low_tok_s, calibrated.band_high_tok_s) == pytest.approx((48.0, 60.0))
    assert "48–60 %" in calibrated.reason
    assert healthy_range(100.0, 50.0, GPU, 1.0, T).verdict == "below_band"  # under 60
    assert healthy_range(100.0, 50.0, GPU, 1.0, T, 0.54).verdict == "healthy"  # within 48–60
    assert healthy_range(100.0, 50.0, GPU, 1.0, T, 0.81).verdict == "low_efficiency"  # floor 54


def view(rate: float, calibrated: float | None) -> ModelView:
    model = ModelStatus(
        name="m",
        phase="decoding",
        decode_tok_s=rate,
        ceiling_tok_s=100.0,
        gpu_fraction=1.0,
        active_streams=1,
        calibrated_efficiency=calibrated,
    )
    server = ServerStatus(kind="llamacpp", url="http://127.0.0.1:8080", status="ok", models=(model,))
    return ModelView(server=server, model=model, machine=GPU)


def kinds(v: ModelView) -> set[str]:
    return {f.kind for f in diagnose_model(v, T)}


def test_low_efficiency_fires_below_the_calibrated_floor() -> None:
    assert "low_efficiency" in kinds(view(40.0, None))  # 40 < 45
    assert "low_efficiency" not in kinds(view(40.0, 0.54))  # 40 ≥ 36: this GPU runs at 54 % when benched
    assert "low_efficiency" in kinds(view(35.0, 0.54))  # 35 < 36
    assert "low_efficiency" not in kinds(view(50.0, None))  # 50 ≥ 45
    assert "low_efficiency" in kinds(view(50.0, 0.81))  # 50 < 54
    (finding,) = [f for f in diagnose_model(view(50.0, 0.81), T) if f.kind == "low_efficiency"]
    assert finding.evidence["calibrated_efficiency"] == 0.81
    assert "81 % when benched" in finding.message and "72–90 %" in finding.message  # 0.6 × 1.2, 0.75 × 1.2


def _low_efficiency_ticks(calibrated: float | None) -> int:
    """Ticks of a throttled 60.7 tok/s decode (about 30 % of a ~202 tok/s ceiling, see
    test_diagnose_scenarios) with `calibrated` passed into every tick as data."""
    pipeline = Pipeline(T)
    hw = llama_hardware()
    machine = resolve_machine(hw)
    seen = 0
    for i, poll in enumerate(request_slots(task=1, prompt_tokens=300, rate_tok_s=60.7, decode_s=20)):
        reading = llama_reading(poll)
        calibrations = {} if calibrated is None else {(reading.url, reading.models[0].name): calibrated}
        priors = Priors(calibrations=calibrations)
        out = pipeline.process([reading], hw, {}, machine, 1.0 + i, WALL0 + 1.0 + i, priors=priors)
        seen += any(a.kind == "low_efficiency" for a in out.snapshot.alerts)
    return seen


def test_the_pipeline_takes_the_calibration_as_data() -> None:
    assert _low_efficiency_ticks(None) > 0  # 0.30 < 0.45
    assert _low_efficiency_ticks(0.27) == 0  # floor 0.45 ÷ 0.675 × 0.27 = 0.18 < 0.30


def test_the_snapshot_carries_each_models_calibration_for_the_dashboard() -> None:
    pipeline = Pipeline(T)
    hw = llama_hardware()
    machine = resolve_machine(hw)
    poll = next(iter(request_slots(task=1, prompt_tokens=300, rate_tok_s=60.7, decode_s=2)))
    reading = llama_reading(poll)
    name = reading.models[0].name
    here = Priors(calibrations={(reading.url, name): 0.54}, bench_rates={(reading.url, name): 120.0})
    benched = pipeline.process([reading], hw, {}, machine, 1.0, WALL0, priors=here)
    (model,) = [m for _, m in benched.snapshot.models()]
    assert (model.calibrated_efficiency, model.bench_decode_tok_s) == (0.54, 120.0)
    other = Priors(calibrations={("http://x:1", name): 0.5}, bench_rates={("http://x:1", name): 99.0})
    elsewhere = pipeline.process([reading], hw, {}, machine, 2.0, WALL0 + 1, priors=other)
    (model,) = [m for _, m in elsewhere.snapshot.models()]
    assert (model.calibrated_efficiency, model.bench_decode_tok_s) == (None, None)  # not this server's bench
