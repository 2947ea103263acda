"""The one atomic file write (`trayapp/config/files.py`): all or nothing, never a torn file."""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trayapp.config.files import PRIVATE_PERMISSIONS, atomic_output, atomic_write_bytes, atomic_write_text


class Boom(Exception):
    """A failure injected into a writer."""


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_writes_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second, longer")
    assert target.read_text(encoding="utf-8") == "second, longer"
    atomic_write_bytes(target, b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff"
    assert _names(tmp_path) == ["a.json"]


def test_a_failure_mid_write_keeps_the_old_content_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "export.csv"
    target.write_text("old\n", encoding="utf-8")
    with pytest.raises(Boom), atomic_output(target, "w") as file:
        file.write("new row 1\n" * 1000)
        raise Boom("the writer failed after 1000 rows")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert _names(tmp_path) == ["export.csv"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failing_fsync_or_rename_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "config.toml"
    target.write_text("old", encoding="utf-8")

    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text(encoding="utf-8") == "old"
    assert _names(tmp_path) == ["config.toml"]


def test_a_missing_folder_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write_text(tmp_path / "absent" / "a.txt", "x")
    assert _names(tmp_path) == []


def test_text_newlines_as_asked(tmp_path: Path) -> None:
    target = tmp_path / "rows.csv"
    with atomic_output(target, "w", newline="") as file:
        file.write("a\r\nb\n")
    assert target.read_bytes() == b"a\r\nb\n"


@pytest.mark.skipif(sys.platform == "win32", reason="Windows refuses to replace a file a reader has open")
def test_two_concurrent_writers_never_leave_a_torn_file(tmp_path: Path) -> None:
    target = tmp_path / "sampler.json"
    size = 256 * 1024  # several write() calls' worth, so a torn file would show
    payloads = [bytes([ord("A") + i]) * size for i in range(2)]
    atomic_write_bytes(target, payloads[0])
    seen: list[bytes] = []
    errors: list[BaseException] = []
    writing = threading.Event()
    writing.set()

    def write(payload: bytes) -> None:
        try:
            for _ in range(20):
                atomic_write_bytes(target, payload, fsync=False)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def read() -> None:
        while writing.is_set():
            seen.append(target.read_bytes())

    writers = [threading.Thread(target=write, args=(p,)) for p in payloads]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(timeout=60)
    writing.clear()
    reader.join(timeout=60)
    assert not any(t.is_alive() for t in (*writers, reader)) and errors == []
    assert seen and all(content in payloads for content in seen)  # whole files only
    assert target.read_bytes() in payloads
    assert _names(tmp_path) == ["sampler.json"]


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
@pytest.mark.usefixtures("umask_022")
def test_the_file_mode_is_as_asked(tmp_path: Path) -> None:
    shared, private = tmp_path / "report.html", tmp_path / "agent-token"
    atomic_write_text(shared, "<html/>")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644  # 0o666 less the umask, as open() gives
    private.write_text("old token", encoding="utf-8")
    os.chmod(private, 0o644)
    atomic_write_text(private, "new token", permissions=PRIVATE_PERMISSIONS)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600  # the new file's, not the old one's
    with atomic_output(tmp_path / "data.parquet", "wb", permissions=0o640) as file:
        file.write(b"PAR1")
    assert stat.S_IMODE((tmp_path / "data.parquet").stat().st_mode) == 0o640
