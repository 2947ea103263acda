"""Opening the store (`StoreOpening`, a half of `Store`): the writer's lock, private files, a bounded
integrity check and a corrupt file moved aside; a reader's read-only and immutable fallbacks."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from trayapp.config.files import create_private_file, make_private, private_dir
from trayapp.config.paths import unwritable
from trayapp.sinks.store.lock import acquire_lock, lock_path_for, release_lock
from trayapp.sinks.store.schema import StoreError, StoreLockedError, migrate

log = logging.getLogger(__name__)

# Sessions still open when a writer starts were left by one that died (kill -9, a power cut: the
# writer lock allows one at a time; one that stops ends its own): ended at the last moment recorded
# of them, so none reads "live" with nothing recording it.
_END_ORPHANED_SESSIONS_SQL = (
    "UPDATE sessions SET ended_wall_s = max(started_wall_s, "
    "COALESCE((SELECT max(t_wall_s) FROM samples WHERE samples.session_id = sessions.session_id), 0), "
    "COALESCE((SELECT max(finished_wall_s) FROM requests "
    "WHERE requests.session_id = sessions.session_id), 0)) WHERE ended_wall_s IS NULL"
)
# ...and its alerts, at the last moment it recorded anything (its newest sample or hardware row)
_END_ORPHANED_ALERTS_SQL = (
    "UPDATE alerts SET ended_wall_s = max(started_wall_s, COALESCE((SELECT max(t_wall_s) FROM samples), 0), "
    "COALESCE((SELECT max(t_wall_s) FROM hardware), 0)) WHERE ended_wall_s IS NULL"
)

_QUICK_CHECK_BUDGET_S = 1.0


def _is_corrupt(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("not a database", "malformed", "corrupt", "integrity check"))


class StoreOpening:
    """How `Store` opens `path`: as the one writer (`_open_writer`) or as a reader (`_open_reader`)."""

    path: Path
    backup_path: Path | None
    _lock_fd: int | None

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.row_factory = sqlite3.Row
        return conn

    def _open_writer(self) -> sqlite3.Connection:
        private_dir(self.path.parent)
        try:
            self._lock_fd = acquire_lock(lock_path_for(self.path), self.path)
        except StoreLockedError:
            raise
        except OSError as exc:  # a read-only home: say so, as every other store failure
            why = unwritable(self.path.parent)
            reason = f"read-only mode ({why})" if why else str(exc.strerror or exc)
            raise StoreError(f"cannot record to {self.path}: {reason}") from exc
        try:
            try:
                self._make_files_private()
                return self._prepare_writer()
            except sqlite3.DatabaseError as exc:
                if not _is_corrupt(exc):
                    raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
                self.backup_path = self._move_aside()
                log.warning(
                    "store %s is corrupt (%s); moved it to %s and started a new one",
                    self.path,
                    exc,
                    self.backup_path,
                )
                try:
                    self._make_files_private()
                    return self._prepare_writer()
                except sqlite3.DatabaseError as exc2:
                    raise StoreError(f"cannot open the store {self.path}: {exc2}") from exc2
        except BaseException:
            release_lock(self._lock_fd)
            self._lock_fd = None
            raise

    def _make_files_private(self) -> None:
        """The store file made 0600 before SQLite opens it (its -wal and -shm take its mode), and
        any older looser files tightened."""
        try:
            create_private_file(self.path)
        except OSError as exc:
            raise StoreError(f"cannot record to {self.path}: {exc.strerror or exc}") from exc
        for suffix in ("-wal", "-shm"):
            make_private(Path(str(self.path) + suffix))

    def _prepare_writer(self) -> sqlite3.Connection:
        conn = self._connect(str(self.path))
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            fresh = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
            if fresh:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # lets prune() give pages back
            else:
                self._quick_check(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("store %s: WAL unavailable (journal_mode=%s)", self.path, mode)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA journal_size_limit = 8388608")
            migrate(conn, self.path)
            try:
                conn.execute(_END_ORPHANED_SESSIONS_SQL)
                conn.execute(_END_ORPHANED_ALERTS_SQL)
            except sqlite3.OperationalError as exc:  # a full disk: recording goes on, they stay open
                log.warning("store %s: could not end what a stopped writer left open: %s", self.path, exc)
        except BaseException:
            conn.close()
            raise
        return conn

    def _quick_check(self, conn: sqlite3.Connection) -> None:
        """A bounded integrity check: catches a mangled file at start, never stalls on a big one."""
        deadline = time.monotonic() + _QUICK_CHECK_BUDGET_S
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            row = conn.execute("PRAGMA quick_check(1)").fetchone()
        except sqlite3.OperationalError as exc:
            if "interrupt" not in str(exc).lower():
                raise
            return
        finally:
            conn.set_progress_handler(None, 0)
        if row is not None and row[0] != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {row[0]}")

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        backup = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                os.replace(source, Path(str(backup) + suffix))
        return backup

    def _open_reader(self) -> sqlite3.Connection:
        if not self.path.exists():
            conn = self._connect(":memory:")  # nothing recorded yet: an empty store
            migrate(conn, self.path)
            return conn
        try:
            conn = self._connect_reader()
        except sqlite3.DatabaseError as exc:
            raise self._read_failed(exc) from exc
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA query_only = 1")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if version != 0:
                self._quick_check(conn)  # a mangled page said at open, not half-way through an export
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._read_failed(exc) from exc
        if version == 0:  # created but never initialised: read as empty
            conn.close()
            conn = self._connect(":memory:")
            migrate(conn, self.path)
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        """Read-write where SQLite may keep its -shm beside the file (it reads a WAL store so);
        read-only in a folder that cannot be written; immutable where even that fails (a read-only
        home with no -shm: nothing can be writing to it)."""
        uri = self.path.resolve().as_uri()
        last: sqlite3.DatabaseError | None = None
        for query in ("?mode=rw", "?mode=ro", "?mode=ro&immutable=1"):
            conn = self._connect(uri + query, uri=True)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                conn.close()
                if _is_corrupt(exc):
                    raise
                last = exc
                continue
            return conn
        assert last is not None
        raise last

    def _read_failed(self, exc: sqlite3.DatabaseError) -> Exception:
        """A reader's error: the message naming the file; a corrupt file moved aside as the writer
        does (when no writer holds it: the writer moves it at its next start)."""
        if not _is_corrupt(exc):
            return StoreError(f"cannot read the store {self.path}: {exc}")
        what = f"cannot read the store {self.path}: it is corrupt ({exc})"
        try:
            lock_fd = acquire_lock(lock_path_for(self.path), self.path)
        except StoreLockedError as locked:
            return StoreError(f"{what}; {locked}, which moves it aside when it next starts")
        except OSError as error:
            return StoreError(f"{what}; it cannot be moved aside here ({error.strerror or error})")
        try:
            backup = self._move_aside()
        except OSError as error:
            return StoreError(f"{what}; it cannot be moved aside ({error.strerror or error})")
        finally:
            release_lock(lock_fd)
        self.backup_path = backup
        log.warning("store %s is corrupt (%s); moved it to %s", self.path, exc, backup)
        return StoreError(f"{what}; moved it to {backup}: the next recording starts a new store")
