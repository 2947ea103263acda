"""Fixes you can copy (#20), where they are shown: `status` text, Copy diagnostics, the tray's
tooltip and the status bars (the glance document, Waybar's tooltip, SwiftBar / xbar's menu).
JSON's round trip is in tests/unit/test_remote_snapshot.py, the report's in test_report.py."""

from __future__ import annotations

import json

from tests.support import snapshots as s
from tests.support.bar_formats import check_swiftbar, check_waybar
from trayapp.core.bar import glance_json, render
from trayapp.core.diagnostics import diagnostics_text
from trayapp.core.glance import fix_clipboard_text, fix_line, icon_state
from trayapp.core.jsonview import alert_json
from trayapp.core.text import format_snapshot

COMMANDS = (
    "OLLAMA_CONTEXT_LENGTH=17408 ollama serve",
    "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",
)
FIXED = s.alert(fix="Lower the context to 17k tokens; or a q8_0 KV cache.", fix_commands=COMMANDS)


def test_the_json_fix_has_the_text_and_the_commands() -> None:
    assert alert_json(FIXED)["fix"] == {"text": FIXED.fix, "commands": list(COMMANDS)}
    assert alert_json(s.alert())["fix"] == {"text": s.alert().fix, "commands": []}


def test_status_text_lists_each_command_under_the_fix() -> None:
    lines = format_snapshot(s.snap(1.0, s.server(s.model()), alerts=(FIXED,))).splitlines()
    at = lines.index(f"    {FIXED.fix}")
    assert lines[at + 1 : at + 3] == [f"      {COMMANDS[0]}", f"      {COMMANDS[1]}"]
    plain = format_snapshot(s.snap(1.0, s.server(s.model()), alerts=(s.alert(),))).splitlines()
    assert plain[-1] == f"    {s.alert().fix}"  # no commands: nothing added


def test_diagnostics_carry_the_commands() -> None:
    text = diagnostics_text(s.snap(1.0, s.server(s.model()), alerts=(FIXED,)), "(settings)")
    assert f"    fix: {FIXED.fix}\n      {COMMANDS[0]}\n      {COMMANDS[1]}\n" in text


def test_the_tooltip_shows_the_first_command_and_counts_the_rest() -> None:
    assert fix_line(FIXED) == f"fix: {COMMANDS[0]} (+1 more)"
    assert fix_line(s.alert(fix_commands=COMMANDS[:1])) == f"fix: {COMMANDS[0]}"
    assert fix_line(s.alert()) is None
    assert fix_clipboard_text(FIXED) == f"{COMMANDS[0]}\n{COMMANDS[1]}"
    state = icon_state(s.snap(1.0, s.server(s.model()), alerts=(FIXED,)))
    lines = list(state.tooltip_lines)
    assert lines[-2:] == [f"⚠ {FIXED.message}", f"fix: {COMMANDS[0]} (+1 more)"]
    without = icon_state(s.snap(1.0, s.server(s.model()), alerts=(s.alert(),)))
    assert without.tooltip_lines[-1] == f"⚠ {s.alert().message}"


def test_the_bars_tooltip_and_menus_carry_the_fix() -> None:
    snapshot = s.snap(1.0, s.server(s.model()), alerts=(FIXED,))
    doc = json.loads(json.dumps(glance_json(icon_state(snapshot), snapshot)))
    assert doc["alerts"][0]["commands"] == list(COMMANDS)
    waybar = check_waybar(render("waybar", doc))
    # The tray's tooltip, wrapped at 60 characters at spaces: the command's words in order.
    assert "fix: OLLAMA_CONTEXT_LENGTH=17408 ollama serve (+1 more)" in waybar["tooltip"].replace("\n  ", " ")
    items = check_swiftbar(render("swiftbar", doc))
    titles = [title for title, _ in items]
    at = titles.index(f"⚠ {FIXED.message}")
    assert titles[at + 1 : at + 3] == [f"--{COMMANDS[0]}", f"--{COMMANDS[1]}"]  # its submenu
    assert items[at + 1][1] == {"font": "Menlo"}
    old = {k: v for k, v in doc["alerts"][0].items() if k != "commands"}  # a sampler before #20
    assert f"⚠ {FIXED.message}" in [t for t, _ in check_swiftbar(render("xbar", {**doc, "alerts": [old]}))]
