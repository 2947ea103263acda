"""The dashboard draws each past point against the ceiling it was recorded with (a step line), and
says when the RAM bandwidth behind the ceiling changed (issue 24 item 7)."""

from __future__ import annotations

import numpy as np
import pytest
from pytestqt.qtbot import QtBot

from tests.support.snapshots import T0, hardware_snapshot, model, server, snap
from trayapp.core.hardware_readings import RamBandwidthChange
from trayapp.ui.dashboard import Dashboard


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_past_points_keep_their_own_ceiling(dash: Dashboard) -> None:
    """Ceilings 115, 115, 127, 145 at t = 0, 1, 2, 3 s: steps at 2 s and 3 s, the last held to now."""
    for i, ceiling in enumerate([115.0, 115.0, 127.0, 145.0]):
        dash.update_snapshot(snap(float(i), server(model(rate=100.0, ceiling_tok_s=ceiling))))
    x, y = dash.time_plot.recorded_ceiling.getData()
    assert list(x - T0) == [0, 1, 1, 2, 2, 3, 3, 3]
    assert list(y) == [115, 115, 115, 115, 127, 127, 145, 145]
    line = dash.time_plot.ceiling_line
    assert line.value() == pytest.approx(145.0) and line.label.toPlainText() == "ceiling 145"
    assert line.pen.style().name == "NoPen"  # only its label: the step line is the ceiling drawn

    dash.ms_toggle.setChecked(True)
    _, ms = dash.time_plot.recorded_ceiling.getData()
    np.testing.assert_allclose(ms[::2], [1000 / 115, 1000 / 115, 1000 / 127, 1000 / 145])


def test_without_a_recorded_ceiling_the_line_is_drawn(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model(rate=40.0, ceiling_tok_s=None))))
    x, _ = dash.time_plot.recorded_ceiling.getData()
    assert x is None or len(x) == 0
    assert dash.time_plot.ceiling_line.pen.style().name != "NoPen"


def test_the_footer_says_when_the_ram_bandwidth_changed(dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(model())))
    assert not dash.ram_change_label.isVisible()
    # T0 is 2023-11-14 22:13:20 UTC: the change a minute before it, the same day
    change = RamBandwidthChange(28.4, 31.3, T0 - 60.0, "first quiet measurement")
    dash.update_snapshot(snap(1.0, server(model()), hardware=hardware_snapshot(ram_bandwidth_change=change)))
    assert dash.ram_change_label.isVisible()
    assert dash.ram_change_label.text() == (
        "ceiling changed 28.4 → 31.3 GB/s RAM at 22:12 UTC: first quiet measurement"
    )
