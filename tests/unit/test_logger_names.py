"""Every logger lives under `trayapp`, the logger the app's log file is attached to (app.setup_logging):
a message logged elsewhere (it once was `llm_tray.monitor`) never reaches the user's log file."""

from __future__ import annotations

import ast
from pathlib import Path

import trayapp

PACKAGE = Path(trayapp.__file__).resolve().parent


def logger_names(source: str) -> list[str]:
    """The literal names passed to `logging.getLogger(...)` / `getLogger(...)` in a module."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        called = getattr(node.func, "attr", getattr(node.func, "id", None))
        first = node.args[0]
        if called == "getLogger" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.append(first.value)
    return names


def test_the_scanner_finds_literal_logger_names() -> None:
    assert logger_names('import logging\nlog = logging.getLogger("llm_tray.monitor")') == ["llm_tray.monitor"]
    assert logger_names("log = getLogger(__name__)") == []  # __name__ is under trayapp by construction


def test_every_logger_is_under_trayapp() -> None:
    outside = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in logger_names(path.read_text(encoding="utf-8"))
        if name != "trayapp" and not name.startswith("trayapp.")
    }
    assert not outside, outside
