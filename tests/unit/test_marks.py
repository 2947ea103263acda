"""No estimate without a mark (#24): every rate, TTFT and count that `status`, the tray tooltip and
`bar` show says whether it is exact (unmarked: the server's or the proxy's own figure) or estimated
('~': from polling), by the one rule in core/units.py; the icon's 3-character number stays bare."""

from __future__ import annotations

from tests.support import snapshots as s
from trayapp.core.bar import bar_line, glance_json, render
from trayapp.core.glance import icon_state
from trayapp.core.model import ModelStatus, PrefillProgress, Snapshot
from trayapp.core.text import format_watch_line, model_line
from trayapp.core.units import estimate_mark, format_rate_marked, format_ttft


def one(m: ModelStatus) -> Snapshot:
    return s.snap(1.0, s.server(m))


POLLED = s.model("llama3.1:8b", "decoding", 42.0, exact=False)  # 42 / 62 = 67.7 % of the ceiling
TIMED = s.model("llama3.1:8b", "decoding", 42.0, exact=True)  # e.g. the recording proxy's figure
IDLE_POLLED = s.model("llama3.1:8b", "idle", last_decode_tok_s=40.0, decode_exact=False, ttft_exact=False)
IDLE_TIMED = s.model("llama3.1:8b", "idle", last_decode_tok_s=40.0, decode_exact=True, ttft_exact=True)


def test_the_rule() -> None:
    assert (estimate_mark(False), estimate_mark(True), estimate_mark(None)) == ("~", "", "")
    assert format_rate_marked(42.4, False) == "~42 tok/s"
    assert format_rate_marked(9.44, True) == "9.4 tok/s"
    assert format_rate_marked(1500.0, False) == "~1500 tok/s"
    assert format_rate_marked(1500.0, False, short=True) == "~2k tok/s"
    assert format_rate_marked(None, False) == "— tok/s"
    assert format_ttft(0.5, False) == "TTFT ~0.50 s"  # the same rule
    assert format_ttft(0.214, True) == "TTFT 0.21 s"


def test_status_text_marks_a_polled_rate_and_a_last_rate() -> None:
    assert model_line(POLLED) == (
        "llama3.1:8b Q4_K_M [decoding] ~42 tok/s · 68 % of 62 tok/s ceiling · ctx 6.1k/8k · 100 % GPU"
        " · TTFT 0.31 s"
    )
    assert model_line(TIMED).startswith("llama3.1:8b Q4_K_M [decoding] 42 tok/s · 68 % of")
    assert model_line(IDLE_POLLED).startswith("llama3.1:8b Q4_K_M [idle] last ~40 tok/s · 62 tok/s ceiling")
    assert model_line(IDLE_POLLED).endswith(" · TTFT ~0.31 s")
    assert model_line(IDLE_TIMED).startswith("llama3.1:8b Q4_K_M [idle] last 40 tok/s · 62 tok/s ceiling")
    assert model_line(IDLE_TIMED).endswith(" · TTFT 0.31 s")


def test_status_text_marks_the_streams_total() -> None:
    three = s.model("llama3.1:8b", "decoding", 30.0, active_streams=3, decode_total_tok_s=90.0)
    assert "[decoding] ~30 tok/s ×3 streams = ~90 total · 48 % of 62" in model_line(three)


def test_the_watch_line_marks_a_polled_rate() -> None:
    assert "llama3.1:8b decoding ~42 tok/s ctx 6.1k / 62 ceiling" in format_watch_line(one(POLLED))
    assert "llama3.1:8b decoding 42 tok/s ctx 6.1k / 62 ceiling" in format_watch_line(one(TIMED))
    assert "llama3.1:8b idle — tok/s ctx 6.1k" in format_watch_line(one(IDLE_POLLED))


def test_the_tooltip_marks_rates_and_the_icon_number_stays_bare() -> None:
    polled = icon_state(one(POLLED))
    assert polled.text == "42"  # 3 characters: no room for a mark
    assert polled.tooltip_lines[1] == "~42 tok/s · 68 % of 62 tok/s ceiling"
    assert icon_state(one(TIMED)).tooltip_lines[1] == "42 tok/s · 68 % of 62 tok/s ceiling"
    assert icon_state(one(IDLE_POLLED)).tooltip_lines[1] == (
        "idle · last ~40 tok/s · TTFT ~0.31 s · ceiling 62 tok/s"
    )
    assert (
        icon_state(one(IDLE_TIMED)).tooltip_lines[1]
        == "idle · last 40 tok/s · TTFT 0.31 s · ceiling 62 tok/s"
    )
    streams = s.model("llama3.1:8b", "decoding", 30.0, active_streams=2, decode_total_tok_s=60.0)
    assert icon_state(one(streams)).tooltip_lines[1] == (
        "~30 tok/s · 48 % of 62 tok/s ceiling · 2 streams, ~60 tok/s total"
    )


def test_the_prefill_line_marks_the_polled_speed_and_eta_not_the_counts() -> None:
    progress = PrefillProgress(
        tokens_done=12_400, cached_tokens=0, tokens_total=28_000, tok_s=250.0, eta_s=62.4
    )
    reading = s.model("llama3.1:8b", "prefill", None, prefill=progress)
    assert (
        icon_state(one(reading)).tooltip_lines[1] == "reading prompt 12.4k / 28k · 44 % · ~250 tok/s · ~62 s"
    )
    no_progress = s.model("llama3.1:8b", "prefill", None, prompt_tok_s=1850.0)  # the last prompt's speed
    assert icon_state(one(no_progress)).tooltip_lines[1] == "reading the prompt (prefill) · ~2k tok/s"


def test_the_bar_marks_a_polled_rate() -> None:
    polled = glance_json(icon_state(one(POLLED)), one(POLLED))
    assert polled["text"] == "42" and polled["model"]["decode_exact"] is False
    assert bar_line(polled) == "llama3.1:8b ~42 tok/s 68%"
    timed = glance_json(icon_state(one(TIMED)), one(TIMED))
    assert bar_line(timed) == "llama3.1:8b 42 tok/s 68%"
    menu = render("swiftbar", polled).split("\n")
    assert menu[0] == "llama3.1:8b ~42 tok/s 68% | color=#4caf50"
    assert "llama3.1:8b · decoding · ~42 tok/s · llama-server 127.0.0.1:8080" in menu
    assert "~42 tok/s · 68 % of 62 tok/s ceiling" in render("waybar", polled)  # the tooltip


def test_a_document_without_the_exactness_makes_no_claim() -> None:
    """A sampler from before `decode_exact` was in the glance: the number shows as it did."""
    doc = glance_json(icon_state(one(POLLED)), one(POLLED))
    del doc["model"]["decode_exact"]
    assert bar_line(doc) == "llama3.1:8b 42 tok/s 68%"
