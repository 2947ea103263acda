"""The real tray app as a subprocess on a real X display, for the e2e tests and the bench scripts.

`TrayAppProcess` starts `python -m trayapp --endpoint llamacpp=URL --no-discover` on an
`XDisplay` (Xvfb + trayer), with its own `LLM_TRAY_HOME` and `LLM_TRAY_TEST_EVENTS` file in
`work_dir`, and waits on those JSON-lines events with deadlines; xdotool finds its windows.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.xdisplay import XDisplay

REPO = Path(__file__).resolve().parents[2]
Event = dict[str, Any]
Geometry = tuple[int, int, int, int]  # x, y, width, height in root coordinates
LIVE_NUMBER = re.compile(r"\d+(\.\d)?")
START_TIMEOUT_S = 60.0  # the app started to its first events, on a slow, shared machine


def is_event(name: str, **fields: Any) -> Callable[[Event], bool]:
    """A predicate: an event called `name` whose `fields` have these values."""
    return lambda e: e["event"] == name and all(e.get(k) == v for k, v in fields.items())


class TrayAppProcess:
    """The tray app as a subprocess on `display`, with an events file and a log in `work_dir`."""

    def __init__(
        self,
        display: XDisplay,
        server_url: str,
        work_dir: Path,
        extra_args: tuple[str, ...] = (),
        config_toml: str | None = None,
        discover: bool = False,
    ) -> None:
        self.display = display
        self.events_path = work_dir / "events.jsonl"
        self.env = {
            **display.env,
            "LLM_TRAY_HOME": str(work_dir / "llm-tray-home"),
            "LLM_TRAY_TEST_EVENTS": str(self.events_path),
        }
        self.args = [sys.executable, "-m", "trayapp", "--endpoint", f"llamacpp={server_url}"]
        self.args += [] if discover else ["--no-discover"]
        self.args += list(extra_args)
        self.events_path.unlink(missing_ok=True)  # events of an earlier run would match the waits
        if config_toml is not None:
            config_dir = work_dir / "llm-tray-home" / "config"
            config_dir.mkdir(parents=True, exist_ok=True)
            (config_dir / "config.toml").write_text(config_toml, encoding="utf-8")
        self.log_path = work_dir / "app.log"
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
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def wait_for(self, what: str, predicate: Callable[[Event], bool], timeout_s: float = 60.0) -> Event:
        """The first event after the cursor that matches; the cursor moves past it."""
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.events()
            for index in range(self.cursor, len(events)):
                if predicate(events[index]):
                    self.cursor = index + 1
                    return events[index]
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the app exited ({self.proc.returncode}) waiting for {what}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                seen = [e["event"] for e in events[self.cursor :]][-20:]
                raise TimeoutError(
                    f"no {what} within {timeout_s:.0f} s (events since: {seen})\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def skip_to_end(self) -> None:
        """Wait only for events written from now on."""
        self.cursor = len(self.events())

    def wait_live_number(self, timeout_s: float = 60.0) -> Event:
        return self.wait_for(
            "an icon with a live number",
            lambda e: e["event"] == "icon" and bool(LIVE_NUMBER.fullmatch(e.get("text") or "")),
            timeout_s,
        )

    def open_dashboard(self) -> None:
        """A second start: the running instance shows its dashboard."""
        subprocess.run(self.args, cwd=REPO, env=self.env, capture_output=True, timeout=60, check=True)
        self.wait_for("'dashboard_shown'", is_event("dashboard_shown"), 20.0)

    def quit(self, timeout_s: float = 20.0) -> int:
        """SIGINT, as Ctrl+C sends; killed if still running after `timeout_s`. The exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        self.stop()
        return self.proc.returncode

    def stop(self) -> None:
        """Kill the app if it still runs; close its log."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()

    def window_geometry(self, small: bool) -> Geometry | None:
        """The docked icon (small=True: a window inside trayer's panel) or the dashboard window."""
        panels = self.panels()
        for window in self.display.find_windows("llm-tray"):
            found = geometry(self.display, window)
            if found is None:
                continue
            if small and found[2] <= 64 and any(inside(found, panel) for panel in panels):
                return found
            if not small and found[2] > 300 and found[3] > 300:
                return found
        return None

    def panels(self) -> list[Geometry]:
        """trayer's panel windows (its other windows are tiny)."""
        found = [geometry(self.display, w) for w in self.display.find_windows("trayer")]
        return [g for g in found if g is not None and g[2] > 50]


def geometry(display: XDisplay, window: str) -> Geometry | None:
    result = subprocess.run(
        ["xdotool", "getwindowgeometry", window], env=display.env, capture_output=True, text=True, check=False
    )
    found = re.search(r"Position: (-?\d+),(-?\d+).*?Geometry: (\d+)x(\d+)", result.stdout, re.S)
    return tuple(int(v) for v in found.groups()) if found else None  # type: ignore[return-value]


def inside(inner: Geometry, outer: Geometry) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def wait_value(what: str, get: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """The first truthy value `get` returns within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = get()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
