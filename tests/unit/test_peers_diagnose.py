"""`low_efficiency` with published peers (#23): without a bench here, the peers' median stands in for
the calibration (the floor is `low_efficiency_ratio` ÷ 0.675 × the median), the message names the
peers' band, and a rate below every peer says what usually explains it and what to try first."""

from __future__ import annotations

import pytest

from tests.support.diagnose_inputs import WALL0, llama_hardware, llama_reading, request_slots
from trayapp.core.diagnose import ModelView, diagnose_model, low_efficiency_share
from trayapp.core.machine import Machine, resolve_machine
from trayapp.core.model import ModelStatus, ServerStatus
from trayapp.core.peers import PeerBand
from trayapp.core.pipeline import Pipeline, Priors
from trayapp.core.thresholds import Thresholds

GPU = Machine("Apple M2 Ultra", 100.0, 24 * 10**9, 100.0, has_gpu=True, unified_memory=True)
T = Thresholds()  # low_efficiency_ratio 0.45
# Peers on a class that reaches less of its bandwidth than the generic 60–75 % (Apple Ultra, Q4).
ULTRA = PeerBand(
    basis="M2 Ultra, Q4",
    scope="hardware",
    quant_group="Q4",
    n=8,
    median_share=0.405,
    low_share=0.38,
    high_share=0.45,
    min_share=0.30,
    max_share=0.47,
    causes=("Q4_K_XL runs slow on this hardware class: try IQ4_NL first", "another app holding the GPU"),
)


def findings(rate: float, band: PeerBand | None, calibrated: float | None = None) -> list[str]:
    model = ModelStatus(
        name="m",
        phase="decoding",
        decode_tok_s=rate,
        ceiling_tok_s=100.0,
        gpu_fraction=1.0,
        active_streams=1,
        calibrated_efficiency=calibrated,
        peer_band=band,
    )
    server = ServerStatus(kind="llamacpp", url="http://127.0.0.1:8080", status="ok", models=(model,))
    view = ModelView(server=server, model=model, machine=GPU)
    return [f.message + " | " + f.fix for f in diagnose_model(view, T) if f.kind == "low_efficiency"]


def test_the_peers_median_moves_the_floor() -> None:
    # 0.45 ÷ 0.675 × 0.405 = 0.27: 40 % of the ceiling is normal for these peers, low for the generic band
    assert low_efficiency_share(T, ULTRA.median_share) == pytest.approx(0.27)
    assert findings(40.0, None) != []
    assert findings(40.0, ULTRA) == []


def test_below_the_floor_the_message_names_the_peers_band() -> None:
    (text,) = findings(26.0, ULTRA)  # 26 % is under the 27 % floor
    assert "its peers on M2 Ultra, Q4 reach 38–45 % (median 40 %, n=8)" in text


def test_below_every_peer_says_what_usually_explains_it_and_what_to_try_first() -> None:
    (text,) = findings(20.0, ULTRA)
    message, fix = text.split(" | ")
    assert "below every published peer; usually: Q4_K_XL runs slow on this hardware class" in message
    assert fix.startswith("Try first: Q4_K_XL runs slow on this hardware class: try IQ4_NL first.")


def test_a_bench_here_wins_over_the_peers() -> None:
    # calibrated 0.81: floor 0.45 ÷ 0.675 × 0.81 = 0.54, so 40 % fires whatever the peers say
    (text,) = findings(40.0, ULTRA, calibrated=0.81)
    assert "when benched here" in text and "peers" not in text


def _low_efficiency_ticks(band: PeerBand | None) -> int:
    """Ticks of a throttled 60.7 tok/s decode (about 30 % of a ~202 tok/s ceiling, as in
    test_calibration) with the peers' band passed into every tick as data (as the monitor does)."""
    pipeline = Pipeline(T)
    hw = llama_hardware()
    machine = resolve_machine(hw)
    seen = 0
    for i, poll in enumerate(request_slots(task=1, prompt_tokens=300, rate_tok_s=60.7, decode_s=20)):
        reading = llama_reading(poll)
        bands = {} if band is None else {(reading.url, reading.models[0].name): band}
        out = pipeline.process(
            [reading], hw, {}, machine, 1.0 + i, WALL0 + 1.0 + i, priors=Priors(peer_bands=bands)
        )
        (model,) = [m for _, m in out.snapshot.models()]
        assert model.peer_band == band  # the snapshot carries it for the dashboard and status --json
        seen += any(a.kind == "low_efficiency" for a in out.snapshot.alerts)
    return seen


def test_the_pipeline_takes_the_peers_band_as_data() -> None:
    assert _low_efficiency_ticks(None) > 0  # 0.30 < 0.45
    assert _low_efficiency_ticks(ULTRA) == 0  # floor 0.45 ÷ 0.675 × 0.405 = 0.27 < 0.30
