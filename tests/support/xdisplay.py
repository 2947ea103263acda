"""A real X display for tray tests: Xvfb + trayer (a system tray), on a display number Xvfb picks."""

from __future__ import annotations

import os
import select
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


XVFB_FLAGS = ("-nolisten", "tcp")
TRAYER_FLAGS = (
    "--edge", "top", "--align", "right", "--widthtype", "pixel", "--width", "200",
    "--height", "40", "--transparent", "false", "--tint", "0x303030",
)  # fmt: skip
# Xvfb and trayer started again on a new display when one of them exits at once: with displays started
# and stopped side by side (test runs in parallel), trayer sometimes cannot open a display number just
# freed and taken again (3 in 18 starts of 3 displays at a time here; 0 in 18 with the retry). A failed
# display is kept until the start is over, so each attempt gets a number of its own: cc71 failed all
# three on :0, each Xvfb choosing the number the one before had just freed.
START_ATTEMPTS = 3
START_TIMEOUT_S = 60.0  # Xvfb and trayer, cold, beside a busy neighbour (20 s was not enough once)


class StartFailed(RuntimeError):
    """Xvfb or trayer exited while starting."""


def _display_number(read_fd: int, xvfb: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The display number Xvfb chose and wrote to `-displayfd` once ready for clients (Xvfb picks a
    free one itself: no race with another Xvfb started at the same moment)."""
    deadline = time.monotonic() + timeout_s
    text = b""
    while not text.endswith(b"\n"):
        if xvfb.poll() is not None:
            raise StartFailed(f"Xvfb exited with {xvfb.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for Xvfb")
        ready, _, _ = select.select([read_fd], [], [], 0.1)
        if ready:
            text += os.read(read_fd, 64)
    return int(text.strip())


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
        self.number = -1  # set by __enter__: the number Xvfb chose
        self.display = ""
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
        failed: list[subprocess.Popen[bytes]] = []  # held until the start is over (see START_ATTEMPTS)
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    self._start_xvfb()
                    if self.tray:
                        self._start_trayer()
                    return self
                except StartFailed:
                    failed += self._procs
                    self._procs = []
                    if attempt == START_ATTEMPTS:
                        raise
                except BaseException:
                    self.__exit__()  # a `with` does not call it when __enter__ raises
                    raise
            raise AssertionError("unreachable")
        finally:
            _stop(failed)

    def _start_xvfb(self) -> None:
        width, height = self.size
        read_fd, write_fd = os.pipe()
        try:
            xvfb = subprocess.Popen(
                ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", f"{width}x{height}x24", *XVFB_FLAGS],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(write_fd,),
            )
            self._procs.append(xvfb)
            os.close(write_fd)
            write_fd = -1
            self.number = _display_number(read_fd, xvfb, START_TIMEOUT_S)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        self.display = f":{self.number}"

    def _start_trayer(self) -> None:
        trayer = subprocess.Popen(
            ["trayer", *TRAYER_FLAGS],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._procs.append(trayer)

        def docked() -> bool:
            if trayer.poll() is not None:  # "cannot open display": see START_ATTEMPTS
                raise StartFailed(f"trayer exited with {trayer.returncode} on {self.display}")
            return bool(self.find_windows("trayer"))

        _wait(docked, START_TIMEOUT_S, "trayer's window")

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
        procs, self._procs = self._procs, []
        _stop(procs)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate `procs`, the newest first (trayer before its Xvfb)."""
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
