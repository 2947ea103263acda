"""Prefill progress (#11) as drawn: the icon while a prompt is read (violet, not the ceiling's green)
and the dashboard's header and card saying how far the prompt is, in the tooltip's words."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from tests.support.snapshots import LLAMA, model, server, snap
from trayapp.core.glance import IconState, icon_state
from trayapp.core.model import ModelStatus, PrefillProgress
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.icons import HEALTH_COLOURS, PREFILL_COLOUR, render_icon

SIZE_PX = 32
NAME = "llama3.1:8b"  # the builders' default model


def reading_prompt(progress: PrefillProgress) -> ModelStatus:
    return model(NAME, "prefill", prefill=progress, context_tokens=progress.tokens_done)


def _state(progress: PrefillProgress) -> IconState:
    return icon_state(snap(10.0, server(reading_prompt(progress))))


def _pixels(state: IconState) -> list[QColor]:
    image = render_icon(state, SIZE_PX).toImage().convertToFormat(QImage.Format.Format_ARGB32)
    return [image.pixelColor(x, y) for y in range(image.height()) for x in range(image.width())]


def _near(pixel: QColor, colour: QColor, tolerance: int = 40) -> bool:
    """An opaque-enough pixel whose hue is `colour`'s (the disc under a 35 % track shifts it a little)."""
    if pixel.alpha() < 200:
        return False
    return all(abs(a - b) <= tolerance for a, b in zip(pixel.getRgb()[:3], colour.getRgb()[:3], strict=True))


def _count(state: IconState, colour: QColor, tolerance: int = 40) -> int:
    return sum(_near(p, colour, tolerance) for p in _pixels(state))


def _blend(colour: QColor, alpha: float) -> QColor:
    """`colour` at `alpha` over the icon's dark disc (28, 31, 36): what a track pixel looks like."""
    disc = (28, 31, 36)
    rgb = [round(c * alpha + d * (1 - alpha)) for c, d in zip(colour.getRgb()[:3], disc, strict=True)]
    return QColor(*rgb)


@pytest.fixture(autouse=True)
def _fresh_icons() -> None:
    render_icon.cache_clear()


def test_icon_while_reading_a_prompt_is_violet_with_the_token_count(qtbot: QtBot) -> None:
    """llama-server gives no total: the violet track (no arc) and '3k'; no green at all."""
    state = _state(PrefillProgress(3400, 0, None, 250.0))
    assert (state.prefill, state.text, state.ring) == (True, "3k", None)
    minimum = SIZE_PX  # a visible share of the ring, not anti-aliasing
    assert _count(state, _blend(PREFILL_COLOUR, 0.35), tolerance=12) >= minimum
    assert _count(state, HEALTH_COLOURS["ok"]) == 0
    assert _count(state, _blend(HEALTH_COLOURS["ok"], 0.35), tolerance=12) == 0


def test_a_known_total_fills_the_ring_in_the_prefill_colour(qtbot: QtBot) -> None:
    half = _state(PrefillProgress(14_000, 0, 28_000, 250.0, 56.0))
    assert half.ring == 0.5
    assert _count(half, PREFILL_COLOUR, tolerance=30) >= SIZE_PX
    nearly = _state(PrefillProgress(25_200, 0, 28_000, 250.0, 11.2))  # 90 %
    assert _count(nearly, PREFILL_COLOUR, tolerance=30) > _count(half, PREFILL_COLOUR, tolerance=30)


def test_prefill_icon_differs_from_the_decoding_icon(qtbot: QtBot) -> None:
    prefill = _state(PrefillProgress(14_000, 0, 28_000, 250.0, 56.0))
    decoding = icon_state(snap(10.0, server(model(NAME, "decoding", 31.0))))  # 50 % of the 62 ceiling
    assert decoding.ring == prefill.ring == 0.5  # same share, same number of characters...
    prefill_image = render_icon(prefill, SIZE_PX).toImage()
    assert prefill_image != render_icon(decoding, SIZE_PX).toImage()  # ...yet another picture
    assert _count(decoding, HEALTH_COLOURS["ok"], tolerance=30) >= SIZE_PX
    assert _count(decoding, PREFILL_COLOUR, tolerance=30) == 0
    # The same state with the flag off is the ceiling ring: the colour comes from the flag.
    plain = IconState(prefill.health, prefill.text, prefill.ring)
    assert _count(plain, PREFILL_COLOUR, tolerance=30) == 0


def test_an_alert_wins_over_the_prefill_colour(qtbot: QtBot) -> None:
    state = IconState("alert", "3k", None, prefill=True)
    assert _count(state, PREFILL_COLOUR, tolerance=30) == 0


# --------------------------------------------------------------------------- dashboard


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_dashboard_header_and_card_say_how_far_the_prompt_is(qtbot: QtBot, dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(reading_prompt(PrefillProgress(3500, 0, None, 250.0)))))
    words = "reading prompt 3.5k tokens so far · ~250 tok/s"  # ~: a polled speed
    assert dash.rate_label.text() == words
    card = dash.cards[(LLAMA, NAME)]
    assert card.stats.text().startswith(words + " · ")
    assert card.title.text() == f"{NAME} · prefill"
    # The prompt moves on: the texts follow.
    dash.update_snapshot(snap(1.0, server(reading_prompt(PrefillProgress(3750, 0, None, 250.0)))))
    assert dash.rate_label.text() == "reading prompt 3.8k tokens so far · ~250 tok/s"


def test_dashboard_shows_total_share_and_eta_where_known(qtbot: QtBot, dash: Dashboard) -> None:
    progress = PrefillProgress(12_400, 0, 28_000, 250.0, 62.4)
    dash.update_snapshot(snap(0.0, server(reading_prompt(progress))))
    assert dash.rate_label.text() == "reading prompt 12.4k / 28k · 44 % · ~250 tok/s · ~62 s"


def test_dashboard_leaves_prefill_words_once_decoding(qtbot: QtBot, dash: Dashboard) -> None:
    dash.update_snapshot(snap(0.0, server(reading_prompt(PrefillProgress(3500, 0, None, 250.0)))))
    dash.update_snapshot(snap(1.0, server(model(NAME, "decoding", 42.0))))
    assert dash.rate_label.text() == "~42 tok/s"
    assert "reading prompt" not in dash.cards[(LLAMA, NAME)].stats.text()
