"""The store on a shared machine and a damaged disk (#25): its files are this user's only (0600), and
a corrupt store is the message and the move-aside in every reader (export, report, sessions), as the
writer does; never a `sqlite3.DatabaseError` traceback."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from tests.support.store_records import T0, model, session, snapshot
from trayapp.cli.main import main
from trayapp.config import paths
from trayapp.sinks.export import export
from trayapp.sinks.store import Store, StoreError
from trayapp.sinks.store.writer import Store as WriterStore

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _filled(db: Path) -> None:
    with Store(db) as store:
        for i in range(30):
            store.record(snapshot(T0 + i, tuple(model(f"m{j}") for j in range(30))), [session()])
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _mangle(db: Path) -> None:
    data = bytearray(db.read_bytes())
    for offset in range(4096, len(data), 4096):  # the header page kept, every b-tree page scrambled
        data[offset : offset + 64] = b"\xa5" * 64
    db.write_bytes(bytes(data))


@posix_only
def test_the_store_and_its_wal_shm_and_lock_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "data" / "store.sqlite3"
    with Store(db) as store:
        store.record(snapshot(T0, (model(),)), [session()])
        for suffix in ("", "-wal", "-shm", ".lock"):
            assert _mode(Path(str(db) + suffix)) == 0o600, suffix
    assert _mode(db.parent) == 0o700


@posix_only
def test_an_older_loose_store_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    _filled(db)
    db.chmod(0o644)
    with Store(db):
        assert _mode(db) == 0o600


def test_a_corrupt_page_is_said_at_open_by_a_reader_and_moved_aside(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    _filled(db)
    _mangle(db)
    with pytest.raises(StoreError, match="corrupt") as info:
        Store(db, writer=False)
    assert ".corrupt-" in str(info.value) and not db.exists()
    assert list(tmp_path.glob("store.sqlite3.corrupt-*"))


def test_a_corrupt_page_met_while_exporting_is_a_store_error(tmp_path: Path, monkeypatch) -> None:
    """Past the bounded check at open (a big store's corrupt page can lie beyond it): the page goes
    bad after the reader opened the file, and the export meets it."""
    db = tmp_path / "store.sqlite3"
    _filled(db)
    monkeypatch.setattr(WriterStore, "_quick_check", lambda self, conn: None)
    store = Store(db, writer=False)
    try:
        _mangle(db)
        with pytest.raises(StoreError, match="corrupt"):
            export(store, table="samples", fmt="csv", out=tmp_path / "out.csv")
    finally:
        store.close()
    assert not (tmp_path / "out.csv").exists()


def test_a_reader_leaves_a_corrupt_store_to_the_writer_that_holds_it(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    with Store(db) as writer:
        writer.record(snapshot(T0, (model(),)), [session()])
        writer._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        reader = Store(db, writer=False)
        reader.close()
        store = Store.__new__(Store)  # a reader meeting a corrupt page now
        store.path, store.writer, store.backup_path = db, False, None
        error = store._read_failed(sqlite3.DatabaseError("database disk image is malformed"))
        assert "already recording" in str(error) and db.exists()


@pytest.mark.parametrize(
    "argv",
    [["sessions"], ["export", "--table", "requests"], ["report", "-o", "REPORT"]],
)
def test_every_reader_command_says_corrupt_and_exits_1(
    tmp_path: Path, monkeypatch, capsys, argv: list[str]
) -> None:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))
    db = paths.store_file()
    _filled(db)
    _mangle(db)
    argv = [str(tmp_path / "r.html") if a == "REPORT" else a for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "corrupt" in err and "moved it to" in err and "Traceback" not in err


@posix_only
def test_a_read_only_data_folder_still_reads(tmp_path: Path, monkeypatch, capsys) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through a 0555 folder: a read-only home needs a non-root user")
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))
    _filled(paths.store_file())
    paths.data_dir().chmod(0o555)
    try:
        assert main(["sessions"]) == 0
        assert main(["export", "--table", "sessions"]) == 0
    finally:
        paths.data_dir().chmod(0o700)
