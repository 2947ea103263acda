"""Run the real `llm-tray` command line as a subprocess (what a user types)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


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
