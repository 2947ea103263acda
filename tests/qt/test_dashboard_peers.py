"""The dashboard with published peers (#23): without a bench here, the band is the peers' band and is
labelled with its basis; the model card names it too; a bench still wins. The test model's ceiling
is 62 tok/s (tests/support/snapshots.py): peers at 52–62 % draw 32.24–38.44 tok/s."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from tests.support.snapshots import model, server, snap
from trayapp.core.peers import PeerBand
from trayapp.ui.dashboard import Dashboard

M2_MAX = PeerBand(
    basis="M2 Max, Q4",
    scope="hardware",
    quant_group="Q4",
    n=14,
    median_share=0.58,
    low_share=0.52,
    high_share=0.62,
    min_share=0.45,
    max_share=0.66,
)


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_the_band_is_the_peers_band_labelled_with_its_basis(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=35.0, peer_band=M2_MAX))))
    assert dash.time_plot.realistic_band.getRegion() == pytest.approx((62 * 0.52, 62 * 0.62))
    assert dash.time_plot.realistic_label.toPlainText() == "peers on M2 Max, Q4: 52–62 %, n=14"
    (card,) = dash.cards.values()
    assert "peers on M2 Max, Q4: 52–62 %, n=14" in card.stats.text()


def test_a_bench_here_wins_over_the_peers(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=28.0, calibrated_efficiency=0.45, peer_band=M2_MAX))))
    assert dash.time_plot.realistic_label.toPlainText() == "benched 40–50 %"
