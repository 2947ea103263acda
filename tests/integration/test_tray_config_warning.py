"""A broken config file is not silent in the tray: the user is told, the app runs on defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trayapp.config import paths

EVENTS_ENV = "LLM_TRAY_TEST_EVENTS"


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_tray_reports_config_errors_and_keeps_the_file(tmp_path: Path) -> None:
    config = paths.config_file()
    broken = '[thresholds]\nkv_slowdown_pct = "lots"\n'
    config.write_text(broken)
    events = tmp_path / "events.jsonl"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", LLM_TRAY_TRAY_WAIT_S="1")
    env[EVENTS_ENV] = str(events)
    with subprocess.Popen(
        [sys.executable, "-m", "trayapp", "--no-discover"], env=env, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            deadline = time.monotonic() + 60
            while not any(e["event"] == "warning" for e in _events(events)):
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "no warning about the config file"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=30) == 0
            stderr = process.stderr.read() if process.stderr else ""
        finally:
            if process.poll() is None:
                process.kill()
    warnings = [e["message"] for e in _events(events) if e["event"] == "warning"]
    assert any("thresholds.kv_slowdown_pct" in w for w in warnings)
    assert any("kept as" in w for w in warnings)
    assert "thresholds.kv_slowdown_pct" in stderr
    assert config.read_text() == broken  # the user's file is untouched
    assert list(config.parent.glob("config.toml.broken-*"))  # and a backup exists
