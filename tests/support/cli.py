"""Run the real `llm-tray` command line as a subprocess (what a user types)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
LINE_TIMEOUT_S = 30.0  # `watch` prints one line a second; this long without one is a failure
CTRL_C_LINES = 10  # lines `watch` may still print after Ctrl-C (the tick under way, a slow host)


def run_cli(
    *args: str, timeout_s: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m trayapp ARGS`; never raises on a non-zero exit (tests check returncode)."""
    return subprocess.run(
        [sys.executable, "-m", "trayapp", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=dict(env) if env is not None else None,
    )


class Watch:
    """`python -m trayapp watch --json ...` with its stdout read line by line on a thread.

    Reading on a thread keeps the pipe drained (an unread pipe blocks the process under test).
    """

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trayapp", "watch", "--json", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[dict[str, Any]] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def next_line(self, timeout_s: float = LINE_TIMEOUT_S) -> dict[str, Any] | None:
        """The next JSON line (None at the end of output); fails when none comes in time."""
        try:
            text = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"watch printed nothing for {timeout_s:g} s")
        if text is None:
            return None
        line: dict[str, Any] = json.loads(text)
        self.lines.append(line)
        return line

    def drain(self) -> None:
        while self.next_line() is not None:
            pass

    def ctrl_c(self) -> int:
        """Ctrl-C (SIGINT), then the lines it still prints until it exits; its exit code. Fails with
        its stderr when it prints CTRL_C_LINES more: a watch that never got the Ctrl-C runs on to
        its --duration (seen in CI, where the suite inherited SIGINT ignored: tests/conftest.py)."""
        return self.stop_with(signal.SIGINT)

    def stop_with(self, stop_signal: signal.Signals) -> int:
        """`ctrl_c` with another signal (SIGTERM: what a service manager or `kill` sends)."""
        self.process.send_signal(stop_signal)
        for _ in range(CTRL_C_LINES):
            if self.next_line() is None:
                return self.process.wait(timeout=30)
        self.process.kill()
        self.process.wait(timeout=30)
        said = self.stderr()[-3000:]
        pytest.fail(f"watch printed {CTRL_C_LINES} lines after {stop_signal.name}; stderr:\n{said}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read()


def wait_for(condition: Callable[[], T | None], limit_s: float, what: str, interval_s: float = 0.25) -> T:
    """Call `condition` every `interval_s` until it returns something truthy (bounded by `limit_s`)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {limit_s:g} s waiting for {what}")
        time.sleep(interval_s)


class WatchToFile:
    """`python -m trayapp watch --json ARGS` (or another command printing JSON lines: `proxy`) with
    stdout and stderr in files (no pipe to keep drained)."""

    def __init__(self, tmp_path: Path, *args: str, command: str = "watch") -> None:
        self.out_path = tmp_path / f"{command}.jsonl"
        self.err_path = tmp_path / f"{command}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trayapp", command, "--json", *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip

    def lines(self) -> list[dict[str, Any]]:
        """Every complete line written so far."""
        text = self.out_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def wait_line(
        self, condition: Callable[[dict[str, Any]], bool], limit_s: float, what: str
    ) -> dict[str, Any]:
        """The first line that satisfies `condition` (bounded); fails if watch exits first."""

        def found() -> dict[str, Any] | None:
            assert self.process.poll() is None, f"it exited: {self.err_path.read_text()[-2000:]}"
            return next((line for line in self.lines() if condition(line)), None)

        return wait_for(found, limit_s, what)

    def stop(self) -> int:
        """Ctrl-C (watch exits 0), then kill if it lingers; always reaped. The exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return self.process.returncode
