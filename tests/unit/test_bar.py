"""`llm-tray bar` text rules (trayapp/core/bar.py): the glance document, the line and each bar's syntax.

The format checks are small grammars of each bar's own rules (tests/support/bar_formats.py);
tests/integration/test_bar_cli.py applies the same ones to the real command's output.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support import snapshots as s
from tests.support.bar_formats import check_polybar, check_swiftbar, check_tmux, check_waybar
from trayapp.core.bar import FORMATS, NOT_RUNNING, bar_line, glance_json, render
from trayapp.core.glance import icon_state, prefill_line
from trayapp.core.model import PrefillProgress

SPILL_WORDS = "part of a model spilled to system RAM"  # ALERT_KINDS["offload"].label


def decoding_doc(**kw: Any) -> dict[str, Any]:
    """llama3.1:8b decoding at 42 of 62 tok/s (42 / 62 = 67.7 %), as the sampler would publish it."""
    doc: dict[str, Any] = {
        "schema": 1, "t": 1.0, "health": "ok", "text": "42", "ring": 0.7, "offload": False,
        "prefill": False, "tooltip": ["llama3.1:8b Q4_K_M · llama-server", "42 tok/s"],
        "model": {"server": "127.0.0.1:8080", "kind": "llamacpp", "name": "llama3.1:8b",
                  "phase": "decoding", "decode_tok_s": 42.0, "ceiling_tok_s": 62.0,
                  "efficiency": 42 / 62, "prefill_tokens_done": None, "prefill_tokens_total": None},
        "models": [], "alerts": [],
    }  # fmt: skip
    doc["models"] = [doc["model"]]
    doc.update(kw)
    return doc


SPILL = {"kind": "offload", "severity": "warning", "model": "qwen3:30b", "words": SPILL_WORDS,
         "message": "qwen3:30b spilled to the CPU (52 %)"}  # fmt: skip


# --------------------------------------------------------------------------- the line


def test_decoding_line_has_the_tray_number_and_share_of_ceiling() -> None:
    assert bar_line(decoding_doc()) == "llama3.1:8b 42 tok/s 68%"


def test_the_model_name_goes_first_then_the_alert_is_cut_never_dropped() -> None:
    doc = decoding_doc(alerts=[SPILL, SPILL], health="alert")
    full = f"llama3.1:8b 42 tok/s 68% ⚠ {SPILL_WORDS} +1"
    assert bar_line(doc, None) == full
    assert bar_line(doc, 60) == f"42 tok/s 68% ⚠ {SPILL_WORDS} +1"  # 12 + 3 + 37 + 3 = 55
    assert bar_line(doc, 30) == "42 tok/s 68% ⚠ part of a mode…"  # 12 + 18 = 30
    assert bar_line(doc, 10) == "42 tok/s …"


def test_prefill_idle_and_nothing() -> None:
    prefill = decoding_doc(text="12k", prefill=True)
    prefill["model"] = {**prefill["model"], "phase": "prefill", "prefill_tokens_done": 12_400,
                        "prefill_tokens_total": 28_000}  # fmt: skip
    assert bar_line(prefill) == "llama3.1:8b prefill 12k/28k 44%"  # 12.4 / 28 = 44.3 %
    prefill["model"]["prefill_tokens_total"] = None
    assert bar_line(prefill) == "llama3.1:8b prefill 12k"
    idle = decoding_doc(text=None, health="idle")
    idle["model"] = {**idle["model"], "phase": "idle"}
    assert bar_line(idle) == "llama3.1:8b idle"
    assert bar_line(decoding_doc(model=None, models=[], health="none")) == "LLM: no server"
    assert bar_line(decoding_doc(model=None, models=[], health="idle")) == "LLM: no model"
    assert bar_line(None) == NOT_RUNNING


# --------------------------------------------------------------------------- the document


def test_glance_json_speaks_for_the_tray_icons_model() -> None:
    snapshot = s.snap(
        1.0,
        s.server(s.model("llama3.1:8b", "decoding", 42.0)),
        s.server(s.model("qwen3:30b", "idle"), url=s.OLLAMA, kind="ollama"),
        alerts=(s.alert(),),
    )
    state = icon_state(snapshot)
    doc = glance_json(state, snapshot)
    json.dumps(doc)  # serialisable as it is
    assert doc["health"] == "alert" and doc["text"] == "42"
    assert doc["ring"] == 0.7  # 42 / 62 = 0.677 → the nearest 5 % step
    assert doc["model"]["name"] == "llama3.1:8b" and doc["model"]["server"] == "127.0.0.1:8080"
    assert doc["model"]["efficiency"] == pytest.approx(42 / 62)
    assert [m["name"] for m in doc["models"]] == ["llama3.1:8b", "qwen3:30b"]
    assert doc["alerts"] == [{**SPILL, "words": SPILL_WORDS, "commands": []}]  # s.alert() has no commands
    assert doc["tooltip"] == list(state.tooltip_lines)
    assert render("waybar", doc, max_width=None).startswith('{"text": "llama3.1:8b ~42 tok/s 68% ⚠ part')


def test_prefill_progress_reaches_the_bar() -> None:
    progress = PrefillProgress(tokens_done=12_400, cached_tokens=0, tokens_total=28_000, tok_s=250.0)
    m = s.model("llama3.1:8b", "prefill", None, prefill=progress)
    snapshot = s.snap(1.0, s.server(m))
    doc = glance_json(icon_state(snapshot), snapshot)
    assert bar_line(doc) == "llama3.1:8b prefill 12k/28k 44%"
    assert prefill_line(m) in doc["tooltip"]  # the tooltip is the tray's


# --------------------------------------------------------------------------- each bar


@pytest.mark.parametrize("doc", [decoding_doc(), decoding_doc(alerts=[SPILL], health="alert"), None])
def test_every_format_follows_its_bars_rules(doc: dict[str, Any] | None) -> None:
    line = bar_line(doc)
    waybar = check_waybar(render("waybar", doc))
    assert waybar["text"] == line and waybar["class"] == (doc["health"] if doc else "not-running")
    assert waybar["percentage"] == (68 if doc else 0)  # the line's 68 % (42 / 62), not the ring's 70
    assert check_tmux(render("tmux", doc)) == line
    assert check_polybar(render("polybar", doc)) == line
    assert check_polybar(render("lemonbar", doc)) == line
    i3 = render("i3blocks", doc)
    assert re.fullmatch(r"<span foreground='#[0-9a-f]{6}'>[^<>]*</span>", i3), i3
    assert render("plain", doc) == line
    for fmt in ("swiftbar", "xbar"):
        items = check_swiftbar(render(fmt, doc, open_command=["/usr/bin/python3", "-m", "trayapp"]))
        assert items[0][0] == line and items[0][1]["color"].startswith("#")
        assert items[-1] == ("Open dashboard", {"shell": "/usr/bin/python3", "param1": "-m",
                                                "param2": "trayapp", "terminal": "false"})  # fmt: skip
    assert set(FORMATS) == {"waybar", "polybar", "i3blocks", "lemonbar", "tmux", "swiftbar", "xbar", "plain"}


def test_hostile_model_names_cannot_break_the_markup() -> None:
    doc = decoding_doc()
    doc["model"] = {**doc["model"], "name": "a#[fg=red]%{F#000000}<b>&|x"}
    doc["models"] = [doc["model"]]
    line = bar_line(doc, None)
    assert check_tmux(render("tmux", doc, max_width=None)) == line
    assert check_polybar(render("polybar", doc, max_width=None)) == line.replace("%{", "% {")
    waybar = json.loads(render("waybar", doc, max_width=None))
    assert waybar["text"].startswith("a#[fg=red]%{F#000000}&lt;b&gt;&amp;|x")
    menu = check_swiftbar(render("swiftbar", doc, max_width=None))
    assert all("|" not in title for title, _ in menu)


def test_swiftbar_menu_lists_models_and_alerts() -> None:
    doc = decoding_doc(alerts=[SPILL], health="alert")
    titles = [title for title, _ in check_swiftbar(render("swiftbar", doc))]
    assert "llama3.1:8b · decoding · 42 tok/s · llama-server 127.0.0.1:8080" in titles
    assert "⚠ qwen3:30b spilled to the CPU (52 %)" in titles


def test_unknown_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown bar format"):
        render("conky", None)


# --------------------------------------------------------------------------- waybar agrees with its text

COLD_LOAD = {"kind": "cold_load", "severity": "info", "model": "llama3.1:8b",
             "words": "a request paid for loading the model",
             "message": "llama3.1:8b waited for a model load"}  # fmt: skip


def waybar(doc: dict[str, Any] | None) -> dict[str, Any]:
    return check_waybar(render("waybar", doc, max_width=None))


def test_waybar_percentage_is_the_share_the_text_shows() -> None:
    """decode ÷ ceiling of the model the text names, as the text rounds it, not the icon's ring."""
    decoding = waybar(decoding_doc())  # ring 0.7; 42 / 62 = 0.677
    assert (decoding["text"], decoding["percentage"]) == ("llama3.1:8b 42 tok/s 68%", 68)
    model = {**decoding_doc()["model"], "decode_tok_s": 31.0, "efficiency": 31 / 62}
    half = waybar(decoding_doc(model=model, models=[model], text="31", ring=0.55))  # a held ring
    assert (half["text"], half["percentage"]) == ("llama3.1:8b 31 tok/s 50%", 50)  # 31 / 62 = 0.5
    model = {**model, "decode_tok_s": 70.0, "efficiency": 70 / 62}
    over = waybar(decoding_doc(model=model, models=[model], text="70", ring=1.0))
    assert (over["text"], over["percentage"]) == ("llama3.1:8b 70 tok/s 113%", 100)  # 1.129; 0–100


def test_waybar_percentage_is_zero_when_the_text_shows_no_share() -> None:
    idle = decoding_doc(text=None, health="idle", ring=0.65)  # a faint ring: the last request's 40 / 62
    idle["model"] = {**idle["model"], "phase": "idle", "decode_tok_s": None, "efficiency": None}
    assert (waybar(idle)["text"], waybar(idle)["percentage"]) == ("llama3.1:8b idle", 0)
    unrated = decoding_doc(text=None)  # decoding, rate unavailable
    assert (waybar(unrated)["text"], waybar(unrated)["percentage"]) == ("llama3.1:8b decoding", 0)
    assert waybar(None)["percentage"] == 0


def test_waybar_percentage_follows_the_prompt_progress_the_text_shows() -> None:
    prefill = decoding_doc(text="12k", prefill=True, ring=0.45)
    prefill["model"] = {**prefill["model"], "phase": "prefill", "decode_tok_s": None, "efficiency": None,
                        "prefill_tokens_done": 12_400, "prefill_tokens_total": 28_000}  # fmt: skip
    data = waybar(prefill)
    assert (data["text"], data["percentage"]) == ("llama3.1:8b prefill 12k/28k 44%", 44)  # 0.443


def test_waybar_class_is_alert_exactly_when_the_text_shows_one() -> None:
    warned = waybar(decoding_doc(alerts=[SPILL], health="alert"))
    assert warned["class"] == "alert" and f"⚠ {SPILL_WORDS}" in warned["text"]
    # An info alert (a cold load) leaves the icon green: the line does not show it, the tooltip does.
    info = waybar(decoding_doc(alerts=[COLD_LOAD], health="ok"))
    assert info["class"] == "ok" and info["text"] == "llama3.1:8b 42 tok/s 68%"
    both = waybar(decoding_doc(alerts=[SPILL, COLD_LOAD], health="alert"))
    assert both["class"] == "alert" and both["text"] == f"llama3.1:8b 42 tok/s 68% ⚠ {SPILL_WORDS}"
    assert waybar(decoding_doc(alerts=[], health="alert"))["class"] == "ok"  # red with nothing shown


def test_waybar_from_a_real_snapshot_agrees_with_its_text() -> None:
    """The sampler's path: a snapshot → icon_state → glance_json → waybar."""
    cold = s.alert("cold_load-1", "cold_load", "info", server=s.LLAMA, model="llama3.1:8b",
                   message="llama3.1:8b waited for a model load")  # fmt: skip
    snapshot = s.snap(1.0, s.server(s.model("llama3.1:8b", "decoding", 42.0)), alerts=(cold,))
    data = waybar(glance_json(icon_state(snapshot), snapshot))
    assert data["text"] == "llama3.1:8b ~42 tok/s 68%"  # polled: '~'; 42 / 62 = 0.677
    assert (data["class"], data["percentage"]) == ("ok", 68)
    assert "⚠ llama3.1:8b waited for a model load" in data["tooltip"]  # the tray's tooltip has it


def test_waybar_tooltip_wraps_like_the_trays() -> None:
    long = "qwen3:30b spilled to the CPU (52 %): decode runs at system-RAM speed, about 9 tok/s"
    data = waybar(decoding_doc(tooltip=["llama3.1:8b Q4_K_M · llama-server", f"⚠ {long}"]))
    assert data["tooltip"].split("\n") == [
        "llama3.1:8b Q4_K_M · llama-server",
        "⚠ qwen3:30b spilled to the CPU (52 %): decode runs at",  # 53; + " system-RAM" would be 64
        "  system-RAM speed, about 9 tok/s",
    ]
