"""A read-only `LLM_TRAY_HOME` is read-only mode (#25): every command that can work works, and what
must write says so in one line; none dies with a traceback. Here the home is a real read-only mount
(EROFS, which root cannot write through either): a read-only tmpfs for an empty home, a read-only bind
mount of a home with a recorded store. Needs root and `mount` (skipped otherwise)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.store_records import T0, model, session, snapshot
from trayapp.sinks.store import Store


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(an empty read-only home, a read-only home holding a recorded store)."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("mounting a read-only file system needs root")
    empty, full, source = tmp_path / "empty", tmp_path / "full", tmp_path / "source"
    for folder in (empty, full, source):
        folder.mkdir()
    with Store(source / "data" / "llm-tray.sqlite3") as store:
        for i in range(5):
            store.record(snapshot(T0 + i, (model(),)), [session()])
    if not _mount("-t", "tmpfs", "-o", "ro", "tmpfs", str(empty)):
        pytest.skip("mount is not allowed here")
    mounted = [empty]
    try:
        if _mount("--bind", str(source), str(full)):
            mounted.append(full)
            if not _mount("-o", "remount,bind,ro", str(full)):
                pytest.skip("a read-only bind mount is not allowed here")
        else:
            pytest.skip("a bind mount is not allowed here")
        yield empty, full
    finally:
        for folder in reversed(mounted):
            subprocess.run(["umount", str(folder)], capture_output=True, check=False)


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLM_TRAY_HOME": str(home)}
    env.pop("LLM_TRAY_TOKEN", None)
    result = run_cli(*args, env=env, timeout_s=60)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_every_command_that_can_work_works_in_a_read_only_home(
    read_only: tuple[Path, Path], tmp_path: Path
) -> None:
    empty, full = read_only
    assert (full / "data" / "llm-tray.sqlite3").exists()
    for home in (empty, full):
        assert _run(home, "sessions").returncode == 0
        assert _run(home, "export", "--table", "sessions").returncode == 0
        assert _run(home, "status", "--no-discover").returncode == 0
        assert _run(home, "ceiling", "--params", "8", "--bandwidth-gbps", "1000").returncode == 0
    listed = _run(full, "sessions")
    assert "qwen3:8b" in listed.stdout  # the recorded sessions, read from the read-only store
    exported = _run(full, "export", "--table", "samples")
    assert len(exported.stdout.splitlines()) > 1
    report = tmp_path / "report.html"
    assert _run(full, "report", "-o", str(report)).returncode == 0 and report.exists()


def test_watch_and_agent_run_without_recording_and_say_read_only(read_only: tuple[Path, Path]) -> None:
    _, full = read_only
    watch = _run(full, "watch", "--duration", "1", "--no-discover")
    assert watch.returncode == 0
    assert "read-only mode" in watch.stderr
    agent = _run(full, "agent", "--duration", "2", "--metrics-port", "0", "--no-discover")
    assert agent.returncode == 0, agent.stderr  # it refused to start: the sampler file's lock
    assert "read-only mode" in agent.stderr and "metrics on http://" in agent.stderr


def test_a_new_agent_token_in_a_read_only_home_is_said(read_only: tuple[Path, Path]) -> None:
    empty, _ = read_only
    result = _run(empty, "agent", "--new-token")
    assert result.returncode == 1 and "read-only mode" in result.stderr
