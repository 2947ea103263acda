"""The store across processes: one writer per file, named by pid, and a kill -9 mid-session."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.store_records import T0, model, rows, snapshot
from trayapp.sinks.store import Store, StoreLockedError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite3"


def test_a_writer_in_another_process_is_named_by_pid(db: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from trayapp.sinks.store import Store
        store = Store({str(db)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        store.close()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            with pytest.raises(StoreLockedError, match=rf"pid {child.pid}\b"):
                Store(db)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
    Store(db).close()  # free again


def test_kill_9_mid_session_loses_at_most_the_tick_in_flight(db: Path) -> None:
    code = textwrap.dedent(
        f"""
        from tests.support.store_records import model, session, snapshot, T0
        from trayapp.sinks.store import Store
        store = Store({str(db)!r})
        for i in range(100000):
            error = store.record(snapshot(T0 + i, (model(),)), [session(requests=i)])
            assert error is None, error
            print(i, flush=True)
        """
    )
    last = -1
    with subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:  # bounded: the child stops by itself after 100000 ticks
            last = int(line)
            if last >= 50:
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert last >= 50

    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    with Store(db, writer=False) as reader:
        count = len(rows(reader, "samples"))
        assert count >= last + 1  # every tick the child reported as recorded is there
        (stored,) = reader.sessions()
        assert stored.requests >= last
    with Store(db) as writer:  # the lock died with the process
        assert writer.record(snapshot(T0 + 10**6, (model(),))) is None
