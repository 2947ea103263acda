"""A real X display for tray tests: Xvfb + trayer (a system tray), on a free display number."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest


def xdisplay_tools_missing() -> list[str]:
    return [tool for tool in ("Xvfb", "trayer", "xdotool", "import") if shutil.which(tool) is None]


def real_tray_marks() -> list[pytest.MarkDecorator]:
    """The marks of a test that runs the app on a real X display against a real llama-server."""
    missing = xdisplay_tools_missing()
    return [
        pytest.mark.xdisplay,
        pytest.mark.llamacpp,
        pytest.mark.skipif(
            bool(missing),
            reason=f"X display tools missing: {', '.join(missing)} (tests/provision.sh installs them)",
        ),
    ]


START_TIMEOUT_S = 60.0  # Xvfb and trayer, cold, beside a busy neighbour (20 s was not enough once)


def _free_display() -> int:
    for number in range(90, 200):
        if not Path(f"/tmp/.X11-unix/X{number}").exists() and not Path(f"/tmp/.X{number}-lock").exists():
            return number
    raise RuntimeError("no free X display number")


def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class XDisplay:
    """Xvfb on `:N` with trayer docked at the top right. `env` carries DISPLAY for children."""

    def __init__(self, width: int = 1280, height: int = 800, tray: bool = True) -> None:
        self.number = _free_display()
        self.display = f":{self.number}"
        self.size = (width, height)
        self.tray = tray
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env["DISPLAY"] = self.display
        env["QT_QPA_PLATFORM"] = "xcb"
        return env

    def __enter__(self) -> XDisplay:
        width, height = self.size
        self._procs.append(
            subprocess.Popen(
                ["Xvfb", self.display, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait(lambda: Path(f"/tmp/.X11-unix/X{self.number}").exists(), START_TIMEOUT_S, "Xvfb")
        if self.tray:
            self._procs.append(
                subprocess.Popen(
                    [
                        "trayer",
                        "--edge",
                        "top",
                        "--align",
                        "right",
                        "--widthtype",
                        "pixel",
                        "--width",
                        "200",
                        "--height",
                        "40",
                        "--transparent",
                        "false",
                        "--tint",
                        "0x303030",
                    ],
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            _wait(lambda: bool(self.find_windows("trayer")), START_TIMEOUT_S, "trayer's window")
        return self

    def find_windows(self, class_name: str) -> list[str]:
        result = subprocess.run(
            ["xdotool", "search", "--class", class_name],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout.split()

    def screenshot(self, path: Path, window: str = "root", crop: str | None = None) -> Path:
        args = ["import", "-window", window]
        if crop:
            args += ["-crop", crop]
        subprocess.run([*args, str(path)], env=self.env, check=True, timeout=30)
        return path

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
