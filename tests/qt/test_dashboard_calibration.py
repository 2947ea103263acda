"""The dashboard and a stored bench (issue #13): the realistic band centred on its calibration and its
decode drawn as a line. Values by hand:
a benched efficiency of 0.45 scales the generic 60–75 % band by 0.45 ÷ 0.675 = 2/3 → 40–50 %."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from tests.support.snapshots import model, server, snap
from trayapp.ui.dashboard import Dashboard


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_a_benched_model_has_its_band_centred_on_the_calibration(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=28.0, calibrated_efficiency=0.45))))
    assert dash.time_plot.realistic_band.getRegion() == pytest.approx((62 * 0.40, 62 * 0.50))
    assert dash.time_plot.realistic_label.toPlainText() == "benched 40–50 %"


def test_without_a_bench_the_band_is_the_generic_one(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=40.0))))
    assert dash.time_plot.realistic_band.getRegion() == pytest.approx((62 * 0.60, 62 * 0.75))
    assert dash.time_plot.realistic_label.toPlainText() == "realistic 60–75 %"


def test_a_calibration_that_is_no_share_of_the_ceiling_is_ignored(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=40.0, calibrated_efficiency=1.7))))
    assert dash.time_plot.realistic_band.getRegion() == pytest.approx((62 * 0.60, 62 * 0.75))


def test_the_band_follows_in_the_ms_per_token_view(dash: Dashboard) -> None:
    dash.time_plot.ms_per_token = True
    dash.ms_per_token = True
    dash.update_snapshot(snap(0.0, server(model(rate=28.0, calibrated_efficiency=0.45))))
    low, high = dash.time_plot.realistic_band.getRegion()
    assert (low, high) == pytest.approx((1000 / (62 * 0.50), 1000 / (62 * 0.40)))


def test_a_stored_bench_is_drawn_as_a_line_in_either_unit(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=28.0, bench_decode_tok_s=40.0))))
    assert dash.time_plot.bench_line.isVisible() and dash.time_plot.bench_line.value() == 40.0
    assert dash.time_plot.bench_line.label.toPlainText() == "bench 40"
    dash.time_plot.ms_per_token = True
    dash.ms_per_token = True
    dash.update_snapshot(snap(1.0, server(model(rate=28.0, bench_decode_tok_s=40.0))))
    assert dash.time_plot.bench_line.value() == 25.0  # 1000 ÷ 40 tok/s
    assert dash.time_plot.bench_line.label.toPlainText() == "bench 25.0 ms/token"


def test_no_bench_no_line(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=28.0))))
    assert not dash.time_plot.bench_line.isVisible()
