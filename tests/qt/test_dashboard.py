"""Dashboard curves from snapshots (getData), gaps while idle, no redraw while hidden."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from pytestqt.qtbot import QtBot
from qt_snapshots import LLAMA, OLLAMA, T0, alert, model, request, server, snap

from trayapp.core.model import KvLayout, ModelFacts
from trayapp.ui.dashboard import Dashboard


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
    x, y = dash.decode_curve.getData()
    assert x is not None and y is not None
    assert list(x) == [T0 + i for i in range(7)]
    assert list(y[:3]) == [40.0, 42.0, 41.0] and list(y[5:]) == [39.0, 38.5]
    assert math.isnan(y[3]) and math.isnan(y[4])  # gaps while idle, not zeros
    assert dash.decode_curve.opts["connect"] == "finite"
    assert dash.ceiling_line.value() == pytest.approx(62.0)
    assert dash.realistic_band.getRegion() == pytest.approx((62 * 0.60, 62 * 0.75))
    assert dash.reading_band.getRegion() == pytest.approx((5.0, 10.0))
    assert dash.floor_line.value() == pytest.approx(3.0)
    ex, ey = dash.exact_points.getData()
    assert list(ex) == [T0 + 3] and list(ey) == [41.5]  # the finished request, apart from the line
    px, py = dash.context_points.getData()
    assert list(px) == [1000, 1500, 2000, 3500, 4000] and list(py) == [40.0, 42.0, 41.0, 39.0, 38.5]
    assert dash.rate_label.text() == "38 tok/s"  # 38.5 rounds half to even
    assert dash.share_label.text() == "62 % of 62 tok/s ceiling"
    assert dash.ttft_label.text() == "TTFT 0.31 s"


def test_ms_per_token_toggle(qtbot: QtBot, dash: Dashboard) -> None:
    dash.show()
    qtbot.waitExposed(dash)
    _feed_session(dash)
    dash.ms_toggle.setChecked(True)
    _, y = dash.decode_curve.getData()
    assert y[0] == pytest.approx(25.0)  # 1000 / 40 tok/s
    assert math.isnan(y[3])
    assert dash.ceiling_line.value() == pytest.approx(1000 / 62)
    assert dash.floor_line.value() == pytest.approx(1000 / 3)
    assert dash.rate_label.text() == "26.0 ms/token"


def test_hidden_dashboard_keeps_history_but_does_no_redraw(qtbot: QtBot, dash: Dashboard) -> None:
    assert not dash.isVisible()
    _feed_session(dash)
    assert dash.redraw_count == 0
    x, _ = dash.decode_curve.getData()
    assert x is None or len(x) == 0  # nothing drawn yet
    assert len(dash.history.arrays((LLAMA, "llama3.1:8b")).t_wall_s) == 7
    with qtbot.waitSignal(dash.redrawn, timeout=2000) as blocker:
        dash.show()
    assert dash.redraw_count == 1  # one redraw on show, with everything recorded meanwhile
    assert blocker.args[0] == {"model": "llama3.1:8b", "points": 5, "total": 7}
    _, y = dash.decode_curve.getData()
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
    assert "TTFT 0.31 s" in llama_card.stats.text() and "prompt 1,850 tok/s" in llama_card.stats.text()
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
    x, y = dash.expected_curve.getData()
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
    x, y = dash.expected_curve.getData()
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


def test_banner(qtbot: QtBot, dash: Dashboard) -> None:
    dash.set_banner("No system tray found: llm-tray runs as a window.")
    dash.show()
    assert dash.banner.isVisible() and "No system tray" in dash.banner.text()
    dash.set_banner(None)
    assert not dash.banner.isVisible()
