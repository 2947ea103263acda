"""A mistyped server kind in `--endpoint` / `--upstream` is a usage error, run as a real subprocess.

One line naming the bad kind, the valid kinds and a close match, exit 2 (argparse's usage-error
code), for every command that takes a server: never a traceback, never a command that runs on.
"""

from __future__ import annotations

import os

import pytest

from tests.support.cli import run_cli
from trayapp.core.server_kinds import USER_SERVER_KINDS

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there
TIMEOUT_S = 60  # a command that runs on instead of refusing fails here, not by hanging the suite

# Every command that takes --endpoint or --upstream, with what it needs to stop on its own if the
# kind were (wrongly) accepted: no port scan, a short run.
COMMANDS: dict[str, list[str]] = {
    "tray": ["--no-discover", "--endpoint"],
    "status": ["status", "--no-discover", "--endpoint"],
    "watch": ["watch", "--no-discover", "--no-record", "--duration", "1", "--endpoint"],
    "agent": ["agent", "--no-discover", "--metrics-port", "0", "--duration", "1", "--endpoint"],
    "bench": ["bench", "--no-discover", "--endpoint"],
    "proxy": ["proxy", "--listen", "127.0.0.1:0", "--no-record", "--duration", "1", "--upstream"],
}
HIDDEN = ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")


def no_display() -> dict[str, str]:
    """This test's environment (its LLM_TRAY_HOME) without a display: a tray that started would exit."""
    return {key: value for key, value in os.environ.items() if key not in HIDDEN}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_mistyped_kind_is_one_line_naming_the_valid_kinds_and_exit_2(command: str) -> None:
    result = run_cli(*COMMANDS[command], f"llamcpp={CLOSED}", timeout_s=TIMEOUT_S, env=no_display())
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "error" in lines[0] and "unknown server kind 'llamcpp'" in lines[0]
    assert "did you mean 'llamacpp'?" in lines[0]
    assert lines[0].endswith("use one of " + ", ".join(USER_SERVER_KINDS))
    assert "unknown," not in lines[0]  # what a reading says when identification failed, not a choice


def test_a_kind_with_no_close_match_gets_no_guess() -> None:
    result = run_cli("status", "--no-discover", "--endpoint", f"zzzzzz={CLOSED}", timeout_s=TIMEOUT_S)
    assert result.returncode == 2, result.stderr
    assert "unknown server kind 'zzzzzz'" in result.stderr and "did you mean" not in result.stderr


def test_a_valid_kind_is_still_accepted() -> None:
    result = run_cli("status", "--no-discover", "--endpoint", f"llamacpp={CLOSED}", timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "unreachable" in result.stdout
