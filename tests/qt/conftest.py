"""Qt component tests run headless (offscreen) with llm-tray's home in a temp dir."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

from pathlib import Path

import pytest

from trayapp.ui.qtcompat import apply_workarounds

# PySide6 6.12.0 on Python 3.11 leaks references to None on every void call; a long
# Qt session would abort with "none_dealloc". A no-op on fixed bindings (see qtcompat).
apply_workarounds()


@pytest.fixture(autouse=True)
def _tray_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Config, data, logs, the single-instance socket name and XDG autostart all point into tmp."""
    home = tmp_path / "llm-tray-home"
    monkeypatch.setenv("LLM_TRAY_HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("LLM_TRAY_TEST_EVENTS", raising=False)
    return home
