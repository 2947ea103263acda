"""Each status bar's own rules as small grammars: `check_<bar>(text)` asserts the text follows them
and returns what the bar shows. Used on `llm-tray bar` output by tests/unit/test_bar.py (rendered in
process) and tests/integration/test_bar_cli.py (the real command).
"""

from __future__ import annotations

import json
import re
from typing import Any


def check_waybar(text: str) -> dict[str, Any]:
    """Waybar's custom module, return-type json: one JSON object per line with these keys/types."""
    assert "\n" not in text
    data = json.loads(text)
    assert set(data) == {"text", "tooltip", "class", "percentage"}
    assert isinstance(data["text"], str) and isinstance(data["tooltip"], str)
    assert isinstance(data["class"], str) and re.fullmatch(r"[a-z-]+", data["class"])
    assert isinstance(data["percentage"], int) and 0 <= data["percentage"] <= 100
    assert not re.search(r"<|&(?!amp;|lt;|gt;)", data["text"] + data["tooltip"])  # valid Pango text
    return data


def check_tmux(text: str) -> str:
    """tmux style markup: `#[...]` tags with known attributes, `##` for a literal #; the colour reset."""
    assert "\n" not in text
    visible, rest = [], text
    while rest:
        if rest.startswith("##"):
            visible.append("#")
            rest = rest[2:]
        elif rest.startswith("#["):
            tag = re.match(r"#\[(fg=(colour\d{1,3}|[a-z]+|#[0-9a-f]{6})|default)\]", rest)
            assert tag, f"bad tmux tag in {text!r}"
            rest = rest[tag.end() :]
        else:
            assert not rest.startswith("#"), f"lone # in {text!r}"
            visible.append(rest[0])
            rest = rest[1:]
    assert text.startswith("#[fg=") and text.endswith("#[default]")
    return "".join(visible)


def check_polybar(text: str) -> str:
    """Polybar / lemonbar `%{F#rrggbb}` ... `%{F-}`: every colour set is reset, no other tag opens."""
    assert "\n" not in text
    depth, visible = 0, []
    for part in re.split(r"(%\{[^}]*\})", text):
        if part.startswith("%{"):
            if re.fullmatch(r"%\{F#[0-9a-f]{6}\}", part):
                depth += 1
            else:
                assert part == "%{F-}" and depth > 0, f"bad tag {part!r} in {text!r}"
                depth -= 1
        else:
            assert "%{" not in part
            visible.append(part)
    assert depth == 0
    return "".join(visible)


def check_swiftbar(text: str) -> list[tuple[str, dict[str, str]]]:
    """SwiftBar / xbar: `text | key=value ...` lines, the title first, then `---`, then the menu."""
    lines = text.split("\n")
    assert len(lines) >= 3 and lines[1] == "---"
    items = []
    for line in lines:
        if line == "---":
            continue
        title, sep, params = line.partition(" | ")
        assert title.strip() and "|" not in title
        pairs: dict[str, str] = {}
        if sep:
            for token in re.findall(r"""(\S+=(?:'[^']*'|"[^"]*"|\S+))""", params):
                key, _, value = token.partition("=")
                pairs[key] = value
            assert " ".join(f"{k}={v}" for k, v in pairs.items()) == params.strip(), params
        items.append((title, pairs))
    return items
