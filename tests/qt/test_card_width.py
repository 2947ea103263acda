"""A model card fits its panel (#24): during prefill the stats line ('reading prompt 12.4k / 28k ·
44 % · ~250 tok/s · ~14 s · 9k from the cache · TTFT … · prompt … · ceiling …') is far longer than
the card is wide; the labels wrap at spaces, so the card grows down instead of out of the panel."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QScrollArea, QWidget
from pytestqt.qtbot import QtBot

from tests.support.snapshots import LLAMA, model, server, snap
from trayapp.core.model import PrefillProgress
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.dashboard.cards import ModelCard

NAME = "llama3.1:8b"
MOSTLY_CACHED = PrefillProgress(
    tokens_done=12_400, cached_tokens=9_000, tokens_total=28_000, tok_s=250.0, eta_s=14.0
)


def scroll_area_of(card: ModelCard) -> QScrollArea:
    """The scroll area the dashboard lays its cards out in (window.py: cards_layout in a QScrollArea)."""
    widget: QWidget | None = card.parentWidget()
    while widget is not None and not isinstance(widget, QScrollArea):
        widget = widget.parentWidget()
    assert widget is not None, "the card is not in a scroll area"
    return widget


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()  # its own size, 980 × 760: the cards get about 2/5 of the width
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_a_prefill_card_stays_within_the_card_panel(qtbot: QtBot, dash: Dashboard) -> None:
    reading = model(NAME, "prefill", None, prefill=MOSTLY_CACHED, context_tokens=12_400, draft_acceptance=0.7)
    dash.update_snapshot(snap(0.0, server(reading)))
    card = dash.cards[(LLAMA, NAME)]
    stats = card.stats.text()
    assert stats.startswith("reading prompt 12.4k / 28k · 44 % · ~250 tok/s · ~14 s · 9k from the cache · ")
    scroll = scroll_area_of(card)

    def fits() -> bool:
        return card.width() <= scroll.viewport().width() and scroll.horizontalScrollBar().maximum() == 0

    qtbot.waitUntil(fits, timeout=2000)  # once the layout has settled
    panel_px = scroll.viewport().width()
    assert card.stats.fontMetrics().horizontalAdvance(stats) > panel_px  # the line alone would not fit
    assert card.sizeHint().width() <= panel_px
    assert card.minimumSizeHint().width() <= panel_px
    assert card.stats.wordWrap() and card.details.wordWrap() and card.title.wordWrap()
    # Wrapped, not cut: the label is as tall as its text needs at its width (two lines or more).
    needed_px = card.stats.heightForWidth(card.stats.width())
    assert card.stats.height() >= needed_px >= 2 * card.stats.fontMetrics().lineSpacing()


@pytest.mark.parametrize(("exact", "shown"), [(False, "prompt ~310 tok/s"), (True, "prompt 310 tok/s")])
def test_the_cards_prompt_rate_says_whether_it_is_estimated(dash: Dashboard, exact: bool, shown: str) -> None:
    """A polled prompt speed carries '~' like every other estimate (#24 item 6); the server's own does not."""
    dash.update_snapshot(snap(0.0, server(model(NAME, "idle", None, prompt_tok_s=310.0, prompt_exact=exact))))
    assert shown in dash.cards[(LLAMA, NAME)].stats.text().split(" · ")
