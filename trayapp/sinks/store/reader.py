"""Queries of the store: rows streamed for export, sessions, hardware and alerts in force.

`StoreQueries` is the reading half of `Store`; it needs only an open connection
(`_conn`) and the lock that serialises its use (`_lock`). None of it writes. In a reader
(`writer=False`: export, report, sessions) a database error met while reading (a corrupt page) is
`_read_failed`'s StoreError, with the message and the move-aside, never a `sqlite3.DatabaseError`.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator

from trayapp.core.model import SessionRecord
from trayapp.core.redact import redact_url
from trayapp.sinks.store.rows import session_from_row
from trayapp.sinks.store.schema import TABLES, TIME_COLUMNS


class StoreQueries:
    """Read-only queries over `_conn` (set up by `Store`)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    writer: bool

    def _read_failed(self, exc: sqlite3.DatabaseError) -> Exception:
        """What a reader raises for `exc` (Store: the message, and a corrupt file moved aside)."""
        return exc

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if self.writer:
                raise  # the monitor's own boundary handles a writer's errors
            raise self._read_failed(exc) from exc

    def columns(self, table: str) -> list[str]:
        """Column names of `table`, in order."""
        return list(self.column_types(table))

    def column_types(self, table: str) -> dict[str, str]:
        """Column name → declared SQLite type ("REAL", "INTEGER", "TEXT") of `table`."""
        self._check_table(table)
        with self._reading(), self._lock:
            rows = self._conn.execute(f"PRAGMA table_info({table})").fetchall()
        return {row["name"]: str(row["type"]).upper() for row in rows}

    @staticmethod
    def _check_table(table: str) -> None:
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; expected one of {', '.join(TABLES)}")

    def _where(
        self, table: str, since_wall_s: float | None, session_ids: Iterable[str] | None
    ) -> tuple[str, list[object]] | None:
        clauses: list[str] = []
        params: list[object] = []
        if since_wall_s is not None:
            if table in ("sessions", "alerts"):  # anything still running at or after `since`
                clauses.append(f"(ended_wall_s IS NULL OR ended_wall_s >= ? OR {TIME_COLUMNS[table]} >= ?)")
                params += [since_wall_s, since_wall_s]
            else:
                clauses.append(f"{TIME_COLUMNS[table]} >= ?")
                params.append(since_wall_s)
        if session_ids is not None:
            if table not in ("samples", "requests", "sessions"):
                raise ValueError(f"table {table!r} has no session column")
            ids = list(dict.fromkeys(session_ids))
            if not ids:
                return None
            clauses.append(f"session_id IN ({','.join('?' * len(ids))})")
            params += ids
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def iter_rows(
        self,
        table: str,
        *,
        since_wall_s: float | None = None,
        session_ids: Iterable[str] | None = None,
        batch: int = 5000,
    ) -> Iterator[dict[str, object]]:
        """Rows of `table` as dicts, oldest first, streamed `batch` rows at a time."""
        self._check_table(table)
        where = self._where(table, since_wall_s, session_ids)
        if where is None:
            return
        clause, params = where
        sql = f"SELECT * FROM {table}{clause} ORDER BY {TIME_COLUMNS[table]}, rowid"
        cursor = self._conn.cursor()
        cursor.row_factory = None  # plain tuples: the fastest way through a million rows
        try:
            with self._reading():
                cursor.execute(sql, params)
                names = [d[0] for d in cursor.description]
            while True:
                with self._reading():
                    rows = cursor.fetchmany(batch)
                if not rows:
                    return
                for row in rows:
                    yield dict(zip(names, row, strict=True))
        finally:
            cursor.close()

    def has_rows(
        self, table: str, *, since_wall_s: float | None = None, session_ids: Iterable[str] | None = None
    ) -> bool:
        self._check_table(table)
        where = self._where(table, since_wall_s, session_ids)
        if where is None:
            return False
        clause, params = where
        with self._reading(), self._lock:
            return self._conn.execute(f"SELECT 1 FROM {table}{clause} LIMIT 1", params).fetchone() is not None

    def sessions(
        self,
        *,
        since_wall_s: float | None = None,
        last_n: int | None = None,
        session_id: str | None = None,
    ) -> list[SessionRecord]:
        """Sessions oldest first: those live at or after `since_wall_s`, the last `last_n`, or one id."""
        where = self._where("sessions", since_wall_s, [session_id] if session_id is not None else None)
        assert where is not None
        clause, params = where
        sql = f"SELECT * FROM sessions{clause} ORDER BY started_wall_s DESC, rowid DESC"
        if last_n is not None:
            sql += " LIMIT ?"
            params.append(max(int(last_n), 0))
        with self._reading(), self._lock:
            rows = self._conn.execute(sql, params).fetchall()
        return [session_from_row(dict(row)) for row in reversed(rows)]

    def hardware_at(self, t_wall_s: float) -> dict[str, object] | None:
        """The hardware row in force at `t_wall_s` (the latest before it, else the first after)."""
        with self._reading(), self._lock:
            row = self._conn.execute(
                "SELECT * FROM hardware WHERE t_wall_s <= ? ORDER BY t_wall_s DESC LIMIT 1", (t_wall_s,)
            ).fetchone()
            if row is None:
                row = self._conn.execute("SELECT * FROM hardware ORDER BY t_wall_s LIMIT 1").fetchone()
        return dict(row) if row is not None else None

    def alerts_between(
        self,
        start_wall_s: float,
        end_wall_s: float | None,
        *,
        server: str | None = None,
        model: str | None = None,
    ) -> list[dict[str, object]]:
        """Alerts whose episode overlaps [start, end] (end None: up to now), oldest first."""
        clauses = ["(ended_wall_s IS NULL OR ended_wall_s >= ?)"]
        params: list[object] = [start_wall_s]
        if end_wall_s is not None:
            clauses.append("started_wall_s <= ?")
            params.append(end_wall_s)
        if server is not None:
            clauses.append("server = ?")
            params.append(redact_url(server))
        if model is not None:
            clauses.append("(model = ? OR model IS NULL)")
            params.append(model)
        sql = f"SELECT * FROM alerts WHERE {' AND '.join(clauses)} ORDER BY started_wall_s, rowid"
        with self._reading(), self._lock:
            rows = self._conn.execute(sql, params).fetchall()
        result = []
        for row in rows:
            item = dict(row)
            try:
                item["evidence"] = json.loads(str(item.pop("evidence_json")))
            except ValueError:
                item["evidence"] = {}
            result.append(item)
        return result

    def size_bytes(self) -> int:
        """Bytes in use by the database (pages minus free pages; the WAL not counted)."""
        with self._reading(), self._lock:
            pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
            free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
            page = self._conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * page)
