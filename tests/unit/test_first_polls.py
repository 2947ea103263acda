"""The first polls of a request (#24): decoding, but no rate until two polls have both seen it
decode (core/rates.py). The icon shows it generates ('…', faintly the last request's share) rather
than a blank ring, and `status` says the rate comes after the next poll, not 'no request seen yet'."""

from __future__ import annotations

from tests.support import snapshots as s
from trayapp.core.bar import bar_line, glance_json
from trayapp.core.glance import GlanceTracker, icon_state
from trayapp.core.model import ModelStatus, Snapshot
from trayapp.core.text import model_line

# What the pipeline gives at the first poll of a request: decoding, no rate; `decode_exact`
# describes `last_decode_tok_s` (the previous request's polled rate).
AFTER_ONE = s.model("llama3.1:8b", "decoding", None, last_decode_tok_s=40.0, decode_exact=False)
FIRST_EVER = s.model("llama3.1:8b", "decoding", None, active_streams=0)  # no request before this one


def one(m: ModelStatus, t: float = 1.0) -> Snapshot:
    return s.snap(t, s.server(m))


def test_the_icon_says_it_generates_with_the_last_share_faint() -> None:
    state = icon_state(one(AFTER_ONE))
    assert (state.health, state.text) == ("ok", "…")
    assert state.ring == 0.65 and state.ring_faint  # 40 / 62 = 0.645 → 5 % steps, the last request's
    assert state.rate_tok_s is None  # no live number behind the text
    assert state.tooltip_lines == (
        "llama3.1:8b Q4_K_M · llama-server",
        "decoding (rate after the next poll) · last ~40 tok/s",
        "context 6.1k / 8k · 100 % GPU",
    )


def test_the_first_request_of_a_model_is_not_blank_either() -> None:
    state = icon_state(one(FIRST_EVER))
    assert (state.text, state.ring, state.ring_faint) == ("…", None, False)
    assert state.tooltip_lines[1] == "decoding (rate after the next poll)"


def test_status_says_the_rate_comes_after_the_next_poll() -> None:
    assert model_line(AFTER_ONE) == (
        "llama3.1:8b Q4_K_M [decoding] decoding (rate after the next poll) · last ~40 tok/s"
        " · 62 tok/s ceiling · ctx 6.1k/8k · 100 % GPU · TTFT 0.31 s"
    )
    assert model_line(FIRST_EVER).startswith(
        "llama3.1:8b Q4_K_M [decoding] decoding (rate after the next poll) · 62 tok/s ceiling"
    )
    assert "no request seen yet" not in model_line(FIRST_EVER)


def test_a_server_that_cannot_give_a_live_rate_still_says_why() -> None:
    no_slots = s.model("llama3.1:8b", "decoding", None, live_rate_reason="start llama-server with --slots")
    assert (
        icon_state(one(no_slots)).tooltip_lines[1]
        == "decoding · rate unavailable: start llama-server with --slots"
    )
    assert model_line(no_slots).startswith("llama3.1:8b Q4_K_M [decoding] no live rate · 62 tok/s ceiling")
    assert model_line(no_slots).endswith("\n      (start llama-server with --slots)")


def test_the_number_follows_once_the_rate_is_known() -> None:
    tracker = GlanceTracker()
    assert tracker.update(one(AFTER_ONE, 1.0)).text == "…"
    live = tracker.update(one(s.model("llama3.1:8b", "decoding", 44.0, last_decode_tok_s=44.0), 2.0))
    assert (live.text, live.ring, live.ring_faint, live.rate_tok_s) == ("44", 0.7, False, 44.0)


def test_the_bar_says_decoding_not_a_number() -> None:
    snapshot = one(AFTER_ONE)
    doc = glance_json(icon_state(snapshot), snapshot)
    assert doc["text"] == "…"
    assert bar_line(doc) == "llama3.1:8b decoding"
