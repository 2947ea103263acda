"""`installers/install.sh --start` with stand-ins, run as a real process: does it tell a dead app
from a started one?

Stand-ins keep it quick and offline: `PYTHON` passes the version check, the venv's `python` makes
every pip install a no-op, and the venv's `llm-tray` (which the script links into
`LLM_TRAY_BIN_DIR` and starts) is a shell script per test. `LLM_TRAY_HOME` holds the data dir.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import TESTS_DIR

REPO_ROOT = TESTS_DIR.parent
SCRIPT = REPO_ROOT / "installers" / "install.sh"
TIMEOUT_S = 30  # the script waits at most 3 s for the app; anything near this is a hang


def executable(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


class Started:
    """Runs `install.sh --start`; remembers the pids it reported so the test can stop them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.prefix = tmp_path / "venv"
        self.home = tmp_path / "home"
        self.pids: list[int] = []
        executable(tmp_path / "python3", "exit 0")  # Python 3.10 or newer
        executable(self.prefix / "bin" / "python", "exit 0")  # `-m pip install ...`: nothing to do

    def stand_in(self, body: str) -> None:
        """The `llm-tray` the script starts."""
        executable(self.prefix / "bin" / "llm-tray", body)

    def run(self) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PYTHON": str(self.tmp_path / "python3"),
            "LLM_TRAY_PREFIX": str(self.prefix),
            "LLM_TRAY_BIN_DIR": str(self.tmp_path / "bin"),
            "LLM_TRAY_HOME": str(self.home),
        }
        result = subprocess.run(
            ["bash", str(SCRIPT), "--start"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
            check=False,
        )  # fmt: skip
        self.pids += [int(pid) for pid in re.findall(r"\(pid (\d+)\)", result.stdout)]
        return result

    @property
    def log(self) -> Path:
        return self.home / "data" / "start.log"

    def stop(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Started]:
    started = Started(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_app_that_dies_at_once_is_a_failure_with_its_log(start: Started) -> None:
    start.stand_in('echo "qt.qpa.plugin: Could not load the Qt platform plugin \\"xcb\\"" >&2\nexit 3')
    result = start.run()
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "started" not in result.stdout and "look for its icon" not in result.stdout
    assert "llm-tray failed to start (it exited with status 3)" in result.stderr
    assert str(start.log) in result.stderr
    assert 'Could not load the Qt platform plugin "xcb"' in result.stderr  # the log's last lines
    assert 'Could not load the Qt platform plugin "xcb"' in start.log.read_text()


def test_an_app_that_stays_up_is_started_and_logs_to_the_data_dir(start: Started) -> None:
    start.stand_in('echo "tray up"\nexec sleep 60')
    result = start.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert len(start.pids) == 1, result.stdout
    assert "look for its icon in the system tray" in result.stdout and str(start.log) in result.stdout
    assert alive(start.pids[0])
    assert start.log.read_text() == "tray up\n"  # written before the 3 s wait ended


def test_an_app_that_exits_cleanly_at_once_is_not_a_failure(start: Started) -> None:
    """A second copy asks the running one to show its dashboard and exits 0."""
    start.stand_in('echo "llm-tray is already running: showing its dashboard" >&2')
    result = start.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "exited at once, without an error" in result.stdout
    assert "llm-tray is already running: showing its dashboard" in result.stdout


def test_where_uvloop_cannot_install_llm_tray_installs_without_it(start: Started) -> None:
    """The `fast` extra (uvloop) is tried first; where pip cannot install it, plain llm-tray is."""
    pip_calls = start.tmp_path / "pip-calls"
    fails_on_fast = 'case "$*" in *"[fast]"*) echo "No matching distribution: uvloop" >&2; exit 1;; esac'
    # the venv's python: records each pip install; the one with `fast` fails, as where uvloop has no wheel
    executable(start.prefix / "bin" / "python", f'echo "$*" >> {pip_calls}\n{fails_on_fast}')
    start.stand_in("exec sleep 60")
    result = start.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    installs = [line for line in pip_calls.read_text().splitlines() if not line.endswith("--upgrade pip")]
    assert installs == ["-m pip install -q --upgrade .[fast]", "-m pip install -q --upgrade ."]
    assert "uvloop did not install; the proxy uses asyncio's event loop" in result.stderr
