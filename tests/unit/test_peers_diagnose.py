"""`low_efficiency` with published peers (#23): without a bench here, the peers' median stands in for
the calibration (the floor is `low_efficiency_ratio` ÷ 0.675 × the median), the message names the
peers' band, and a rate below every peer says what usually explains it and what to try first."""

from __future__ import annotations

import pytest

from trayapp.core.diagnose import ModelView, diagnose_model, low_efficiency_share
from trayapp.core.machine import Machine
from trayapp.core.model import ModelStatus, ServerStatus
from trayapp.core.peers import PeerBand
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
