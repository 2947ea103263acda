"""The tray app end to end: a real X display (Xvfb + trayer), a real llama-server, the real app.

The app runs as a subprocess (`python -m trayapp`) with `LLM_TRAY_TEST_EVENTS` pointing into
tmp_path; the test waits on those events with deadlines, checks with xdotool that the icon is
docked in trayer's panel, compares screenshots of the icon idle and generating, opens the
dashboard through a second start (single instance), and quits the app with SIGINT.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.llama import LlamaServer, generate_in_background
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

MISSING_TOOLS = xdisplay_tools_missing()
pytestmark = [
    pytest.mark.xdisplay,
    pytest.mark.llamacpp,
    pytest.mark.skipif(
        bool(MISSING_TOOLS),
        reason=f"X display tools missing: {', '.join(MISSING_TOOLS)} (tests/provision.sh installs them)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
GENERATE_TOKENS = 1000  # long enough to outlast the 5 s idle poll on a slow, shared machine
Event = dict[str, Any]
Geometry = tuple[int, int, int, int]  # x, y, width, height (root coordinates)


class AppProcess:
    """The tray app as a subprocess, and the JSON-lines events it writes."""

    def __init__(self, display: XDisplay, server_url: str, tmp_path: Path) -> None:
        self.events_path = tmp_path / "events.jsonl"
        self.env = {
            **display.env,
            "LLM_TRAY_HOME": str(tmp_path / "llm-tray-home"),
            "LLM_TRAY_TEST_EVENTS": str(self.events_path),
        }
        self.args = [sys.executable, "-m", "trayapp", "--endpoint", f"llamacpp={server_url}", "--no-discover"]
        self.log_path = tmp_path / "app.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        self.cursor = 0  # events before this index were consumed by earlier waits

    def events(self) -> list[Event]:
        try:
            text = self.events_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        lines = text.split("\n")[:-1]  # the last piece may be a line still being written
        return [json.loads(line) for line in lines if line.strip()]

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def wait_for(self, what: str, predicate: Callable[[Event], bool], timeout_s: float = 30.0) -> Event:
        """The first event after the cursor that matches; the cursor moves past it."""
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.events()
            for index in range(self.cursor, len(events)):
                if predicate(events[index]):
                    self.cursor = index + 1
                    return events[index]
            if self.proc.poll() is not None:
                pytest.fail(f"the app exited ({self.proc.returncode}) waiting for {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                seen = [e["event"] for e in events[self.cursor :]][-20:]
                pytest.fail(f"no {what} within {timeout_s:.0f} s (events since: {seen})\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def _is_event(name: str, **fields: Any) -> Callable[[Event], bool]:
    return lambda e: e["event"] == name and all(e.get(k) == v for k, v in fields.items())


def _geometry(display: XDisplay, window: str) -> Geometry | None:
    result = subprocess.run(
        ["xdotool", "getwindowgeometry", window], env=display.env, capture_output=True, text=True, check=False
    )
    found = re.search(r"Position: (-?\d+),(-?\d+).*?Geometry: (\d+)x(\d+)", result.stdout, re.S)
    return tuple(int(v) for v in found.groups()) if found else None  # type: ignore[return-value]


def _inside(inner: Geometry, outer: Geometry) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def _docked_icon(display: XDisplay) -> Geometry | None:
    """The app's window that sits inside trayer's panel (the docked tray icon), if any."""
    panels = [g for w in display.find_windows("trayer") if (g := _geometry(display, w)) and g[2] > 50]
    for window in display.find_windows("llm-tray"):
        geometry = _geometry(display, window)
        if geometry and geometry[2] <= 64 and any(_inside(geometry, panel) for panel in panels):
            return geometry
    return None


def _wait_value(what: str, get: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = get()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout_s:.0f} s")


def _magick(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    return (result.stdout + result.stderr).strip()


def _std_dev(image: Path) -> float:
    """Standard deviation of the pixels (0 for a uniform, empty crop)."""
    return float(_magick("convert", str(image), "-format", "%[fx:standard_deviation]", "info:"))


def _differing_pixels(a: Path, b: Path) -> int:
    """Pixels that differ between two same-sized images (ImageMagick `compare -metric AE`)."""
    out = _magick("compare", "-metric", "AE", "-fuzz", "3%", str(a), str(b), "null:")
    return int(float(out.split()[0]))


@pytest.fixture
def display() -> Iterator[XDisplay]:
    with XDisplay() as x:
        yield x


def test_tray_icon_dashboard_and_quit_on_a_real_display(
    display: XDisplay, llama_server: LlamaServer, tmp_path: Path
) -> None:
    app = AppProcess(display, llama_server.url, tmp_path)
    try:
        app.wait_for("'started'", _is_event("started"), START_TIMEOUT_S)
        app.wait_for("'tray_shown'", _is_event("tray_shown"), START_TIMEOUT_S)
        icon = _wait_value("tray icon docked in trayer's panel", lambda: _docked_icon(display))
        crop = f"{icon[2]}x{icon[3]}+{icon[0]}+{icon[1]}"

        app.wait_for("an idle icon", _is_event("icon", health="idle"), START_TIMEOUT_S)
        idle_shot = display.screenshot(tmp_path / "tray-idle.png", crop=crop)
        assert _std_dev(idle_shot) > 0.02, "the tray area is empty: no icon drawn"

        # A separate client generates: the icon shows the live rate, in digits, not idle.
        request = generate_in_background(
            llama_server.url, "Tell a long story about a lighthouse.", GENERATE_TOKENS, ignore_eos=True
        )
        live = app.wait_for(
            "an icon with a live number",
            lambda e: e["event"] == "icon" and bool(re.fullmatch(r"\d+(\.\d)?", e.get("text") or "")),
            60.0,
        )
        gen_shot = display.screenshot(tmp_path / "tray-generating.png", crop=crop)
        assert live["health"] not in ("idle", "none")
        assert 0 < float(live["text"]) < 10_000
        assert "tok/s" in live["tooltip"]
        changed = _differing_pixels(idle_shot, gen_shot)
        assert changed >= 20, f"the icon looks the same idle and generating ({changed} pixels differ)"

        result = request.result(timeout=180)
        assert result["timings"]["predicted_n"] > 0
        app.wait_for("the icon back to idle", _is_event("icon", health="idle"), 30.0)

        # A second start brings the running one's dashboard forward (single instance).
        second = subprocess.run(app.args, cwd=REPO, env=app.env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        app.wait_for("'dashboard_shown'", _is_event("dashboard_shown"), 20.0)
        curve = app.wait_for("a curve with points", lambda e: e["event"] == "curve" and e["points"] > 0, 20.0)
        assert curve["model"] and curve["total"] >= curve["points"]
        windows = display.find_windows("llm-tray")
        big = [g for w in windows if (g := _geometry(display, w)) and g[2] > 300 and g[3] > 300]
        assert big, "the dashboard window is not on the display"
        x, y, w, h = big[0]
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
