"""The tray app end to end: a real X display (Xvfb + trayer), a real llama-server, the real app.

The app runs as a subprocess (`python -m trayapp`) with `LLM_TRAY_TEST_EVENTS` pointing into
tmp_path; the test waits on those events with deadlines, checks with xdotool that the icon is
docked in trayer's panel, compares screenshots of the icon idle and generating, opens the
dashboard through a second start (single instance), and quits the app with SIGINT.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.images import differing_pixels, std_dev
from tests.support.llama import LlamaServer, OpenEndedGeneration
from tests.support.trayapp_process import (
    REPO,
    START_TIMEOUT_S,
    TrayAppProcess,
    is_event,
    wait_value,
)
from tests.support.xdisplay import XDisplay, real_tray_marks

pytestmark = real_tray_marks()


@pytest.fixture
def display() -> Iterator[XDisplay]:
    with XDisplay() as x:
        yield x


def test_tray_icon_dashboard_and_quit_on_a_real_display(
    display: XDisplay, llama_server: LlamaServer, tmp_path: Path
) -> None:
    app = TrayAppProcess(display, llama_server.url, tmp_path)
    try:
        app.wait_for("'started'", is_event("started"), START_TIMEOUT_S)
        app.wait_for("'tray_shown'", is_event("tray_shown"), START_TIMEOUT_S)
        icon = wait_value("tray icon docked in trayer's panel", lambda: app.window_geometry(small=True))
        crop = f"{icon[2]}x{icon[3]}+{icon[0]}+{icon[1]}"

        app.wait_for("an idle icon", is_event("icon", health="idle"), START_TIMEOUT_S)
        idle_shot = display.screenshot(tmp_path / "tray-idle.png", crop=crop)
        assert std_dev(idle_shot) > 0.02, "the tray area is empty: no icon drawn"

        # A separate client generates: the icon shows the live rate, in digits, not idle.
        request = OpenEndedGeneration(llama_server.url, "Tell a long story about a lighthouse.")
        live = app.wait_live_number(60.0)
        gen_shot = display.screenshot(tmp_path / "tray-generating.png", crop=crop)
        assert live["health"] not in ("idle", "none")
        assert 0 < float(live["text"]) < 10_000
        assert "tok/s" in live["tooltip"]
        changed = differing_pixels(idle_shot, gen_shot)
        assert changed >= 20, f"the icon looks the same idle and generating ({changed} pixels differ)"

        assert request.stop() > 0  # hung up: the server stops generating
        app.wait_for("the icon back to idle", is_event("icon", health="idle"), 30.0)

        # A second start brings the running one's dashboard forward (single instance).
        second = subprocess.run(app.args, cwd=REPO, env=app.env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        app.wait_for("'dashboard_shown'", is_event("dashboard_shown"), 20.0)
        curve = app.wait_for("a curve with points", lambda e: e["event"] == "curve" and e["points"] > 0, 20.0)
        assert curve["model"] and curve["total"] >= curve["points"]
        dashboard = app.window_geometry(small=False)
        assert dashboard, "the dashboard window is not on the display"
        x, y, w, h = dashboard
        display.screenshot(tmp_path / "dashboard.png", crop=f"{w}x{h}+{x}+{y}")

        app.proc.send_signal(signal.SIGINT)
        try:
            code = app.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the app did not quit within 20 s of SIGINT:\n{app.log_tail()}")
        assert code == 0, app.log_tail()
        assert app.events()[-1]["event"] == "quit"
        assert not [e for e in app.events() if e["event"] == "error"]
    finally:
        app.stop()
