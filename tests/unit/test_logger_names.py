"""Every module logs to `logging.getLogger(__name__)`: its logger is named by where it lives, under
`trayapp`, the logger the app's log file is attached to (app/log_setup.setup_logging). A hand-written
name drifts: one was `llm_tray.monitor` (never reached the user's log file), others named a module that
had moved (`trayapp.tray` for ui/tray.py) or another module (`trayapp.app.tray_app` in app/events.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import trayapp

PACKAGE = Path(trayapp.__file__).resolve().parent

# The one logger named by hand: the package's root, where setup_logging attaches the log file.
ROOT_LOGGER = ("app/log_setup.py", "'trayapp'")


def logger_names(source: str) -> list[str]:
    """What a module passes to `logging.getLogger(...)` / `getLogger(...)`, as source text, other than
    `__name__` (`getLogger()` with no argument, the root logger, is '')."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = getattr(node.func, "attr", getattr(node.func, "id", None))
        if called != "getLogger":
            continue
        first = node.args[0] if node.args else None
        if not (isinstance(first, ast.Name) and first.id == "__name__"):
            names.append(ast.unparse(first) if first is not None else "")
    return names


def test_the_scanner_finds_every_name_but_dunder_name() -> None:
    assert logger_names('log = logging.getLogger("llm_tray.monitor")') == ["'llm_tray.monitor'"]
    assert logger_names('log = getLogger("trayapp.tray")\nother = getLogger(f"trayapp.{x}")') == [
        "'trayapp.tray'",
        "f'trayapp.{x}'",
    ]
    assert logger_names("log = logging.getLogger()") == [""]
    assert logger_names("log = getLogger(__name__)\nlevel = logging.getLevelName(10)") == []


def test_every_module_logs_under_its_own_name() -> None:
    named = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in PACKAGE.rglob("*.py")
        for name in logger_names(path.read_text(encoding="utf-8"))
    }
    assert named == {ROOT_LOGGER}
