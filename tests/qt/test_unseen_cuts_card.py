"""The dashboard's model card says when an Ollama's silent prompt truncation goes unseen (#20): one
line of information (no alert) while neither a proxy nor its log shows cuts, gone once they do."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from tests.support.snapshots import OLLAMA, model, server, snap
from trayapp.ui.dashboard import Dashboard

NAME = "qwen3:30b"
REASON = "reading Ollama's log is off"


@pytest.fixture
def dash(qtbot: QtBot) -> Dashboard:
    widget = Dashboard()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def test_the_card_shows_the_note_while_cuts_go_unseen(qtbot: QtBot, dash: Dashboard) -> None:
    unseen = model(NAME, "idle", None, context_length=4096, unseen_cuts_reason=REASON)
    dash.update_snapshot(snap(0.0, server(unseen, url=OLLAMA, kind="ollama", version="0.32.15")))
    card = dash.cards[(OLLAMA, NAME)]
    qtbot.waitUntil(card.cuts_note.isVisible, timeout=2000)
    assert card.cuts_note.text() == (
        "Note: prompts over 2,050 tokens are cut silently (num_ctx 4096); llm-tray sees cuts through its "
        "proxy or Ollama's log (reading Ollama's log is off)."
    )
    assert card.cuts_note.wordWrap()
    assert "cut silently" not in card.stats.text()  # one place on the card

    seen = model(NAME, "idle", None, context_length=4096)  # a proxy in front now, or the log readable
    dash.update_snapshot(snap(1.0, server(seen, url=OLLAMA, kind="ollama", version="0.32.15")))
    qtbot.waitUntil(lambda: not card.cuts_note.isVisible(), timeout=2000)
    assert card.cuts_note.text() == ""


def test_no_note_for_another_server_kind(qtbot: QtBot, dash: Dashboard) -> None:
    """Only an Ollama's reason makes a note (no other server cuts prompts behind the client's back)."""
    odd = model(NAME, "idle", None, context_length=4096, unseen_cuts_reason=REASON)
    dash.update_snapshot(snap(0.0, server(odd)))
    card = next(iter(dash.cards.values()))
    qtbot.waitUntil(lambda: card.stats.text() != "", timeout=2000)
    assert not card.cuts_note.isVisible() and card.cuts_note.text() == ""
