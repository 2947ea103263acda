"""Dashboard curves from snapshots (getData), gaps while idle, no redraw while hidden; rate texts,
time span, GPU share on the cards, line labels, the ms/token view and where the labels sit."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from tests.support.snapshots import (
    HW,
    LLAMA,
    OLLAMA,
    T0,
    alert,
    hardware_snapshot,
    model,
    request,
    server,
    snap,
)
from trayapp.core.model import KvLayout, ModelFacts
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_rate
from trayapp.ui.dashboard import Dashboard, time_span_s, ttft_text


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    return widget


def _feed_session(dash: Dashboard) -> None:
    """3 decoding ticks, 2 idle ticks, 2 decoding ticks, a finished request."""
    rates = [40.0, 42.0, 41.0, None, None, 39.0, 38.5]
    for i, rate in enumerate(rates):
        phase = "decoding" if rate is not None else "idle"
        m = model(phase=phase, rate=rate, context_tokens=1000 + 500 * i)
        requests = (request(41.5, t=float(i)),) if i == 3 else ()
        dash.update_snapshot(snap(float(i), server(m), requests=requests))


def test_curves_have_the_decode_points_gaps_and_ceiling(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    _feed_session(dash)
    x, y = dash.time_plot.decode_curve.getData()
    assert x is not None and y is not None
    assert list(x) == [T0 + i for i in range(7)]
    assert list(y[:3]) == [40.0, 42.0, 41.0] and list(y[5:]) == [39.0, 38.5]
    assert math.isnan(y[3]) and math.isnan(y[4])  # gaps while idle, not zeros
    assert dash.time_plot.decode_curve.opts["connect"] == "finite"
    assert dash.time_plot.ceiling_line.value() == pytest.approx(62.0)
    assert dash.time_plot.realistic_band.getRegion() == pytest.approx((62 * 0.60, 62 * 0.75))
    assert dash.time_plot.reading_band.getRegion() == pytest.approx((5.0, 10.0))
    assert dash.time_plot.floor_line.value() == pytest.approx(3.0)
    ex, ey = dash.time_plot.exact_points.getData()
    assert list(ex) == [T0 + 3] and list(ey) == [41.5]  # the finished request, apart from the line
    px, py = dash.context_plot.context_points.getData()
    assert list(px) == [1000, 1500, 2000, 3500, 4000] and list(py) == [40.0, 42.0, 41.0, 39.0, 38.5]
    assert dash.rate_label.text() == "~38 tok/s"  # 38.5 rounds half to even; ~: polled
    assert dash.share_label.text() == "62 % of 62 tok/s ceiling"
    assert dash.ttft_label.text() == "TTFT 0.31 s"


def test_ms_per_token_toggle(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    _feed_session(dash)
    dash.ms_toggle.setChecked(True)
    _, y = dash.time_plot.decode_curve.getData()
    assert y[0] == pytest.approx(25.0)  # 1000 / 40 tok/s
    assert math.isnan(y[3])
    assert dash.time_plot.ceiling_line.value() == pytest.approx(1000 / 62)
    assert dash.time_plot.floor_line.value() == pytest.approx(1000 / 3)
    assert dash.rate_label.text() == "~26.0 ms/token"  # ~: polled


def test_hidden_dashboard_keeps_history_but_does_no_redraw(qtbot: QtBot, dash: Dashboard) -> None:
    assert not dash.isVisible()
    _feed_session(dash)
    assert dash.redraw_count == 0
    x, _ = dash.time_plot.decode_curve.getData()
    assert x is None or len(x) == 0  # nothing drawn yet
    assert len(dash.history.arrays((LLAMA, "llama3.1:8b")).t_wall_s) == 7
    with qtbot.waitSignal(dash.redrawn, timeout=2000) as blocker:
        dash.show()
    assert dash.redraw_count == 1  # one redraw on show, with everything recorded meanwhile
    assert blocker.args[0] == {"model": "llama3.1:8b", "points": 5, "total": 7}
    _, y = dash.time_plot.decode_curve.getData()
    assert len(y) == 7
    dash.update_snapshot(snap(7.0, server(model(rate=37.0))))
    assert dash.redraw_count == 2
    dash.hide()
    dash.update_snapshot(snap(8.0, server(model(rate=36.0))))
    assert dash.redraw_count == 2


def test_history_is_bounded_in_time(qtbot: QtBot) -> None:
    dash = Dashboard(window_s=60.0)
    qtbot.addWidget(dash)
    for i in range(300):
        dash.update_snapshot(snap(float(i), server(model(rate=40.0))))
    t = dash.history.arrays((LLAMA, "llama3.1:8b")).t_wall_s
    assert t.min() >= T0 + 299 - 60 and len(t) <= 61


def test_model_selector_and_cards(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    qwen = model(
        name="qwen3:30b", phase="idle", gpu_fraction=0.48, quantization="Q4_K_M", context_tokens=None
    )
    dash.update_snapshot(snap(0.0, server(model(rate=42.0)), server(qwen, url=OLLAMA, kind="ollama")))
    assert dash.selected_key() == (LLAMA, "llama3.1:8b")  # follows the decoding model
    assert dash.model_combo.count() == 3
    dash.select_model((OLLAMA, "qwen3:30b"))
    assert dash.selected_key() == (OLLAMA, "qwen3:30b")
    assert dash.rate_label.text() == "idle"
    card = dash.cards[(OLLAMA, "qwen3:30b")]
    assert card.gpu_bar.value() == 48 and "CPU 52 %" in card.gpu_bar.format()
    llama_card = dash.cards[(LLAMA, "llama3.1:8b")]
    assert llama_card.context_bar.format() == "context 6.1k/8k (74 %)"
    assert "TTFT 0.31 s" in llama_card.stats.text() and "prompt 1850 tok/s" in llama_card.stats.text()
    assert "RTX 4090" in dash.hardware_label.text() and "RAM 18.2/64 GB" in dash.hardware_label.text()
    dash.update_snapshot(snap(1.0, server(model(rate=42.0))))  # qwen unloaded: its card goes
    assert set(dash.cards) == {(LLAMA, "llama3.1:8b")}


def test_expected_curve_follows_the_kv_model(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    facts = ModelFacts(
        weights_bytes=4_900_000_000,
        bytes_per_token=4_900_000_000,
        exact=True,
        source="gguf",
        kv=KvLayout(full_elems_per_token=32 * 8 * 256),
    )  # 128 KiB/token at f16
    dash.update_snapshot(
        snap(0.0, server(model(rate=42.0, facts=facts, context_tokens=0, ceiling_tok_s=62.0)))
    )
    x, y = dash.context_plot.expected_curve.getData()
    assert x[0] == 0 and x[-1] == 8192
    assert y[0] == pytest.approx(62.0)
    kv_bytes = 8192 * 32 * 8 * 256 * 2
    assert y[-1] == pytest.approx(62.0 * 4.9e9 / (4.9e9 + kv_bytes))  # slower as the context fills
    assert np.all(np.diff(y) < 0)


def test_expected_curve_without_facts_uses_the_ceilings_seen(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    for i, (ctx, ceiling) in enumerate([(1000, 60.0), (4000, 55.0), (2000, 58.0)]):
        dash.update_snapshot(snap(float(i), server(model(context_tokens=ctx, ceiling_tok_s=ceiling))))
    x, y = dash.context_plot.expected_curve.getData()
    assert list(x) == [1000, 2000, 4000] and list(y) == [60.0, 58.0, 55.0]


def test_alert_list_and_focus(qtbot: QtBot, dash: Dashboard) -> None:
    first = alert("offload-1")
    second = replace(alert("floor-2", kind="below_floor"), message="decode under 3 tok/s")
    dash.update_snapshot(snap(0.0, server(model()), alerts=(first, second)))
    assert dash.focus_alert("floor-2")
    assert dash.isVisible()
    item = dash.alert_list.currentItem()
    assert item is not None and "decode under 3 tok/s" in item.text()
    assert "Fix: num_ctx ≤ 12k" in dash.alert_list.item(0).text() or "Fix: num_ctx ≤ 12k" in item.text()
    texts = [dash.alert_list.item(i).text() for i in range(dash.alert_list.count())]
    assert any("Cause: Decode ~9 tok/s instead of ~48" in t for t in texts)
    assert not dash.focus_alert("nope")


def test_copy_fix_puts_the_alerts_commands_on_the_clipboard(qtbot: QtBot, dash: Dashboard) -> None:
    """#20: an alert whose fix has commands shows them with a "Copy fix" button; a click puts exactly
    those lines on the clipboard. An alert without commands has no button."""
    commands = (
        "OLLAMA_CONTEXT_LENGTH=12288 ollama serve",
        "printf 'FROM qwen3:30b\\nPARAMETER num_ctx 12288\\n' > Modelfile && "
        "ollama create qwen3:30b-ctx12k -f Modelfile",
        '"options": {"num_ctx": 12288}',
    )
    fixed = alert("offload-1", fix_commands=commands)
    plain = replace(alert("floor-2", kind="below_floor"), message="decode under 3 tok/s", since_wall_s=T0 - 5)
    dash.show()
    qtbot.waitExposed(dash)
    dash.update_snapshot(snap(0.0, server(model()), alerts=(fixed, plain)))
    row = dash.alert_list.row_widget("offload-1")
    assert row is not None and dash.alert_list.row_widget("floor-2") is None
    assert row.commands_label.text() == "\n".join(commands)
    assert "Fix: num_ctx ≤ 12k" in row.text_label.text()
    texts = [dash.alert_list.item(i).text() for i in range(dash.alert_list.count())]
    assert any(t.endswith("      " + commands[-1]) for t in texts)  # the item keeps it for search
    assert row.copy_button.isVisible() and row.copy_button.text() == "Copy fix"
    clipboard = QGuiApplication.clipboard()
    clipboard.clear()
    with qtbot.waitSignal(dash.alert_list.fix_copied) as copied:
        qtbot.mouseClick(row.copy_button, Qt.MouseButton.LeftButton)
    assert copied.args == ["offload-1"]
    qtbot.waitUntil(lambda: clipboard.text() == "\n".join(commands))
    assert row.copy_button.text() == "Copied ✓"
    # The row is as tall as its wrapped text and commands need (the item does not clip it).
    item = dash.alert_list.item(0)
    assert item.sizeHint().height() >= row.heightForWidth(dash.alert_list.viewport().width())


def test_banner(qtbot: QtBot, dash: Dashboard) -> None:
    dash.set_banner("No system tray found: llm-tray runs as a window.")
    dash.show()
    assert dash.banner.isVisible() and "No system tray" in dash.banner.text()
    dash.set_banner(None)
    assert not dash.banner.isVisible()


def _shown(qtbot: QtBot, dash: Dashboard) -> Dashboard:
    dash.show()
    qtbot.waitExposed(dash)
    return dash


def _label(line: pg.InfiniteLine) -> pg.InfLineLabel:
    """The text label pyqtgraph hangs on an infinite line."""
    return next(item for item in line.childItems() if isinstance(item, pg.InfLineLabel))


@pytest.mark.parametrize(
    ("tok_s", "text"), [(1008.0, "1008"), (42.0, "42"), (7.5, "7.5"), (9.96, "10"), (-1.0, "0.0")]
)
def test_window_rates_keep_the_digits(tok_s: float, text: str) -> None:
    """The window uses units.format_rate: every digit, unlike the icon's 3-character '1k'."""
    assert format_rate(tok_s) == text


@pytest.mark.parametrize(
    ("rate", "ceiling", "header", "share", "card"),
    [
        (1008.0, 1400.0, "~1008 tok/s", "72 % of 1400 tok/s ceiling", "ceiling 1400 tok/s"),
        (42.0, 62.0, "~42 tok/s", "68 % of 62 tok/s ceiling", "ceiling 62 tok/s"),
        (7.5, 9.4, "~7.5 tok/s", "80 % of 9.4 tok/s ceiling", "ceiling 9.4 tok/s"),
    ],
)
def test_header_and_card_show_full_rates(
    qtbot: QtBot, dash: Dashboard, rate: float, ceiling: float, header: str, share: str, card: str
) -> None:
    _shown(qtbot, dash)
    dash.update_snapshot(snap(0.0, server(model(rate=rate, ceiling_tok_s=ceiling))))
    assert dash.rate_label.text() == header  # not the icon's coarse "1k"; ~: a polled rate
    assert dash.share_label.text() == share
    assert card in dash.cards[(LLAMA, "llama3.1:8b")].stats.text().split(" · ")


def test_time_span_helper() -> None:
    now = T0 + 1000
    assert time_span_s(None, now, 600.0) == 120.0  # nothing yet: the minimum
    assert time_span_s(now - 30, now, 600.0) == 120.0
    assert time_span_s(now - 300, now, 600.0) == 300.0
    assert time_span_s(now - 900, now, 600.0) == 600.0  # never more than the window


@pytest.mark.parametrize(
    ("history_s", "span_s", "minutes"), [(90, 120.0, 2), (300, 300.0, 5), (900, 600.0, 10)]
)
def test_time_axis_follows_the_history(
    qtbot: QtBot, dash: Dashboard, history_s: int, span_s: float, minutes: int
) -> None:
    _shown(qtbot, dash)
    for t in range(0, history_s + 1, 10):
        dash.update_snapshot(snap(float(t), server(model(rate=40.0))))
    now = T0 + history_s
    x_range, _ = dash.time_plot.getViewBox().viewRange()
    assert x_range[0] == pytest.approx(now - span_s, abs=1e-3)
    assert now < x_range[1] <= now + 0.05 * span_s  # a little room right of "now", no more
    assert dash.time_plot.getPlotItem().titleLabel.text == f"decode tok/s, last {minutes} min"


def test_model_card_says_where_the_model_lives(qtbot: QtBot, dash: Dashboard) -> None:
    _shown(qtbot, dash)
    no_gpu = hardware_snapshot()
    remote = "http://10.0.0.5:8080"
    local_cpu = model(gpu_fraction=None)
    remote_cpu = model(name="remote:7b", gpu_fraction=None)
    dash.update_snapshot(snap(0.0, server(local_cpu), server(remote_cpu, url=remote), hardware=no_gpu))
    bar = dash.cards[(LLAMA, "llama3.1:8b")].gpu_bar
    assert bar.format() == "no GPU · in system RAM" and bar.value() == 0
    # This machine's lack of a GPU says nothing about a server elsewhere.
    assert dash.cards[(remote, "remote:7b")].gpu_bar.format() == "GPU share unknown"

    dash.update_snapshot(snap(1.0, server(model(gpu_fraction=0.48)), hardware=HW))
    bar = dash.cards[(LLAMA, "llama3.1:8b")].gpu_bar
    assert bar.value() == 48 and bar.format() == "GPU 48 % · CPU 52 % ⚠"
    dash.update_snapshot(snap(2.0, server(model(gpu_fraction=None)), hardware=HW))
    assert bar.format() == "GPU share unknown"  # a GPU here, share not reported: no guess


def test_offload_mark_follows_the_threshold(qtbot: QtBot) -> None:
    dash = Dashboard(thresholds=Thresholds(offload_gpu_fraction=0.5))
    qtbot.addWidget(dash)
    _shown(qtbot, dash)
    dash.update_snapshot(snap(0.0, server(model(gpu_fraction=0.6)), hardware=HW))
    bar = dash.cards[(LLAMA, "llama3.1:8b")].gpu_bar
    assert bar.format() == "GPU 60 %"  # above the user's 50 %: not counted as offloaded
    dash.set_thresholds(Thresholds())  # the default, 98 %
    assert bar.format() == "GPU 60 % · CPU 40 % ⚠"


def test_band_and_ceiling_labels_have_text_with_a_constant_ceiling(qtbot: QtBot, dash: Dashboard) -> None:
    _shown(qtbot, dash)
    reading = _label(dash.time_plot.reading_band.lines[1])
    for i in range(3):  # the same ceiling each time: the lines do not move after the first update
        dash.update_snapshot(snap(float(i), server(model(rate=40.0 + i, ceiling_tok_s=62.0))))
        assert dash.time_plot.ceiling_line.label.isVisible() and dash.time_plot.realistic_label.isVisible()
        labels = [
            dash.time_plot.ceiling_line.label,
            dash.time_plot.realistic_label,
            reading,
            dash.time_plot.floor_line.label,
        ]
        assert [label.toPlainText() for label in labels] == [
            "ceiling 62",
            "realistic 60–75 %",
            "reading speed 5–10",
            "floor 3",
        ]


def test_floor_line_follows_the_users_threshold(qtbot: QtBot, dash: Dashboard) -> None:
    _shown(qtbot, dash)
    dash.set_thresholds(Thresholds(below_floor_tok_s=5.0))  # what the app calls when settings change
    dash.update_snapshot(snap(0.0, server(model(rate=40.0, ceiling_tok_s=62.0))))
    assert dash.time_plot.floor_line.value() == pytest.approx(5.0)
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 5"
    dash.ms_toggle.setChecked(True)
    assert dash.time_plot.floor_line.value() == pytest.approx(200.0)  # 1000 ms / 5 tok/s
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 200 ms"
    dash.set_thresholds(Thresholds(below_floor_tok_s=2.5))
    assert dash.time_plot.floor_line.value() == pytest.approx(400.0)  # 1000 / 2.5
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 400 ms"
    dash.ms_toggle.setChecked(False)
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 2.5"


def test_floor_from_the_constructor(qtbot: QtBot) -> None:
    dash = Dashboard(thresholds=Thresholds(below_floor_tok_s=5.0))
    qtbot.addWidget(dash)
    _shown(qtbot, dash)
    dash.update_snapshot(snap(0.0, server(model(rate=40.0))))
    assert dash.time_plot.floor_line.value() == pytest.approx(5.0)
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 5"


def test_ms_per_token_converts_and_zooms_to_the_data(qtbot: QtBot, dash: Dashboard) -> None:
    _shown(qtbot, dash)
    rates = [500.0, 400.0, None, 250.0]
    for i, rate in enumerate(rates):
        phase = "decoding" if rate is not None else "idle"
        requests = (request(200.0, t=float(i)),) if i == 3 else ()
        m = model(phase=phase, rate=rate, ceiling_tok_s=1000.0)
        dash.update_snapshot(snap(float(i), server(m), requests=requests))
    _, tok_s = dash.time_plot.decode_curve.getData()
    assert dash.time_plot.getViewBox().viewRange()[1] == pytest.approx([0.0, 1250.0])

    dash.ms_toggle.setChecked(True)
    _, y = dash.time_plot.decode_curve.getData()
    expected = [1000 / r if r is not None else math.nan for r in rates]
    np.testing.assert_allclose(y, expected)  # [2, 2.5, nan, 4] ms/token, the gap kept
    _, ey = dash.time_plot.exact_points.getData()
    assert list(ey) == [pytest.approx(5.0)]  # the finished request at 200 tok/s
    assert dash.time_plot.ceiling_line.label.toPlainText() == "fastest 1.0 ms/token"
    assert dash.time_plot.floor_line.label.toPlainText() == "floor 333 ms"
    # Zoomed on the data (slowest point 5 ms, plus headroom), not on the 333 ms floor.
    assert dash.time_plot.getViewBox().viewRange()[1] == pytest.approx([0.0, 5.0 * 1.25])
    assert dash.time_plot.getPlotItem().getAxis("left").labelText == "ms/token"

    dash.ms_toggle.setChecked(False)
    _, back = dash.time_plot.decode_curve.getData()
    np.testing.assert_array_equal(back, tok_s)
    assert dash.time_plot.getViewBox().viewRange()[1] == pytest.approx([0.0, 1250.0])
    assert dash.time_plot.ceiling_line.label.toPlainText() == "ceiling 1000"


def test_floor_label_clear_of_reading_label_at_a_high_ceiling(qtbot: QtBot, dash: Dashboard) -> None:
    _shown(qtbot, dash)
    for i in range(3):
        dash.update_snapshot(snap(float(i), server(model(rate=900.0, ceiling_tok_s=1000.0))))
    reading = _label(dash.time_plot.reading_band.lines[1]).sceneBoundingRect()
    floor = dash.time_plot.floor_line.label.sceneBoundingRect()
    assert reading.width() > 0 and floor.width() > 0
    # On a 0–1250 tok/s scale 3 and 10 tok/s are a pixel or two apart: the labels sit at opposite ends.
    assert abs(reading.center().y() - floor.center().y()) < reading.height()
    assert not reading.intersects(floor), (reading, floor)
    assert floor.left() > reading.right()


def test_ttft_text_marks_estimates() -> None:
    base = model()
    assert ttft_text(replace(base, ttft_s=None)) == "TTFT —"
    assert ttft_text(replace(base, ttft_s=0.31, ttft_exact=True)) == "TTFT 0.31 s"
    assert ttft_text(replace(base, ttft_s=6.0, ttft_exact=False)) == "TTFT ~6.00 s"


def test_the_gpu_card_lists_who_holds_its_memory(qtbot: QtBot, dash: Dashboard) -> None:
    """#21: the footer's GPU line is followed by the holders, largest first ("unavailable" where NVML
    does not say)."""
    from trayapp.core.hardware_readings import GpuProcess

    (gpu,) = HW.gpus
    holders = (GpuProcess(4121, "python", 5_800_000_000), GpuProcess(88, "game.exe", None))
    hw = replace(HW, gpus=(replace(gpu, processes=holders),))
    dash.show()
    qtbot.waitExposed(dash)
    dash.update_snapshot(snap(0.0, server(model(rate=42.0)), hardware=hw))
    lines = dash.hardware_label.text().splitlines()
    assert "RTX 4090" in lines[0]
    assert lines[1] == "GPU memory held by: python (pid 4121) 5.8 GB, game.exe unavailable"


def test_the_footer_shows_the_power_cap_and_the_machines_power_and_idle_draw(
    qtbot: QtBot, dash: Dashboard
) -> None:
    """#21: the GPU's draw against its power limit on its line; the machine's power and idle draw, or why
    energy is not measured, on the last line."""
    from trayapp.core.energy_types import EnergyStatus

    (gpu,) = HW.gpus
    hw = replace(HW, gpus=(replace(gpu, power_w=398.0, power_limit_w=400.0),))
    dash.show()
    qtbot.waitExposed(dash)
    measured = replace(snap(0.0, server(model(rate=42.0)), hardware=hw), energy=EnergyStatus(412.4, 61.0))
    dash.update_snapshot(measured)
    lines = dash.hardware_label.text().splitlines()
    assert "398 of 400 W" in lines[0]
    assert lines[-1] == "Power 412 W · idle 61 W"
    unread = replace(measured, energy=EnergyStatus(None, None, reason="no RAPL package counters"))
    dash.update_snapshot(unread)
    assert dash.hardware_label.text().splitlines()[-1] == "Energy not measured: no RAPL package counters"


def test_the_footer_names_the_clients_of_the_last_minutes(qtbot: QtBot, dash: Dashboard) -> None:
    """#22: who used the servers in the window, as the proxy named them; hidden when no proxy did."""
    _shown(qtbot, dash)
    dash.update_snapshot(snap(1.0, server(model()), requests=(request(40.0, t=1.0),)))
    assert not dash.clients_label.isVisible()  # a polled request names no client
    aider = replace(request(40.0, t=2.0), client_name="aider", client_pid=4121, queue_wait_s=3.0, ttft_s=0.5)
    dash.update_snapshot(snap(2.0, server(model()), requests=(aider,)))
    # 200 decode tokens at 40 tok/s + 0.5 s TTFT = 5.5 s busy; one wait of 3.0 s
    assert dash.clients_label.isVisible()
    assert dash.clients_label.text() == (
        "Clients, last 10 min: aider: 1 request, 200 decode tokens, busy 6 s, waited 3.0 s on average"
    )
    dash.update_snapshot(snap(2.0 + dash.window_s + 1, server(model())))  # the window moved past it
    assert not dash.clients_label.isVisible()
