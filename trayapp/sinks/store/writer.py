"""The writing store: opening (with recovery: opening.py), one transaction per tick, retention.

Metrics only: no table has a column for prompt or completion text, and server URLs are
stored with any password or query-string value masked (`rows.redact_url`). One process
records (the tray, `watch` or `agent`): a writer holds an exclusive lock on `<db>.lock`;
readers (`writer=False`: export, sessions, report) never take it and read while the
monitor writes (WAL). Each `record()` is one committed transaction, so a `kill -9` loses
at most the tick in flight.

The store and its -wal, -shm and lock files are this user's only (0600; the folder 0700). A corrupt
file is moved aside to `<name>.corrupt-<time>` by whoever finds it — the writer at start, or a reader
(export, report, sessions) when no writer holds the lock — and the message says where. A reader in a
read-only folder opens the file read-only (immutable when SQLite cannot keep its -shm there).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from trayapp.core.bench import BenchResult
from trayapp.core.model import Alert, SessionRecord, Snapshot
from trayapp.sinks.store.baselines import BaselineQueries, new_baseline_caches
from trayapp.sinks.store.lock import release_lock
from trayapp.sinks.store.opening import StoreOpening
from trayapp.sinks.store.reader import StoreQueries
from trayapp.sinks.store.rows import (
    Row,
    alert_row,
    bench_rows,
    hardware_row,
    hardware_signature,
    request_row,
    sample_row,
    session_row,
)
from trayapp.sinks.store.schema import TABLES, TIME_COLUMNS, StoreError, delete_oldest_sql, write_sql

log = logging.getLogger(__name__)

HARDWARE_INTERVAL_S = 60.0  # a hardware row at most this often unless something changes
PRUNE_INTERVAL_S = 300.0  # record() prunes at most this often
_JITTER_S = 0.5  # a tick up to 10 % (at most this) early still counts as a full interval

Rows = Mapping[str, Sequence[Row]]  # table → rows to write


def _is_disk_full(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "is full" in text or "no space" in text


# --------------------------------------------------------------------------- the store


class Store(StoreOpening, StoreQueries, BaselineQueries):
    """The SQLite session log at `path`.

    `writer=True` (the monitor) takes the one-writer lock, creates or migrates the
    schema, and records; a corrupt file is moved aside to `<name>.corrupt-<time>` (see
    `backup_path`) and a fresh store started. `writer=False` only reads and never
    blocks the writer; a missing file reads as an empty store.

    Samples: at most one per `sample_interval_s` per (server, model); a model idle since
    its last sample only every `idle_sample_interval_s` (a change of phase is kept at
    once). Hardware: at most once a minute unless the GPUs or bandwidths change.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        writer: bool = True,
        sample_interval_s: float = 1.0,
        idle_sample_interval_s: float = 60.0,
        retention_days: float = 30.0,
        max_size_bytes: int | None = 512 * 2**20,
    ) -> None:
        self.path = Path(path)
        self.writer = writer
        self.sample_interval_s = sample_interval_s
        self.idle_sample_interval_s = idle_sample_interval_s
        self.retention_days = retention_days
        self.max_size_bytes = max_size_bytes
        self.last_error: str | None = None
        self.backup_path: Path | None = None  # where a corrupt file was moved, if it was
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._last_sample: dict[tuple[str, str], tuple[float, str]] = {}
        self._last_hardware: tuple[float, tuple[object, ...]] | None = None
        self._alert_state: dict[str, tuple[object, ...]] = {}
        self._last_prune_wall_s = -math.inf
        self._baseline_cache, self._bench_cache = new_baseline_caches()
        self._conn = self._open_writer() if writer else self._open_reader()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if self.writer:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("PRAGMA optimize")
                self._conn.close()
                self._conn = None  # type: ignore[assignment]
            if self._lock_fd is not None:
                release_lock(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- writing

    def record(self, snapshot: Snapshot, sessions: Iterable[SessionRecord] = ()) -> str | None:
        """Store one tick: samples (rate-bounded), finished requests, sessions, hardware, alerts.

        One committed transaction. Never raises on a write error (a full disk, a locked or
        broken file): it returns the error, keeps it in `last_error`, and keeps what it can
        — on a full disk it drops the oldest samples to make room, or else at least the
        sessions, requests and alerts. Returns None when everything was written. A tick with
        nothing to write proves nothing about the disk: the last error stands (an idle monitor
        on a full disk would otherwise say "recording again" between two failed ticks).
        """
        if not self.writer:
            raise StoreError(f"the store {self.path} was opened read-only")
        now = snapshot.t_wall_s
        samples, sample_marks = self._sample_rows(snapshot)
        hardware = self._hardware_rows(snapshot)
        alerts, alert_marks = self._alert_rows(snapshot)
        essential = {
            "requests": [request_row(r) for r in snapshot.requests],
            "sessions": [session_row(s) for s in sessions],
            "alerts": alerts,
        }
        everything = {"samples": samples, "hardware": hardware, **essential}
        if self.last_error is not None and not any(everything.values()):
            return self.last_error

        error: str | None = None
        wrote_all = wrote_rest = False
        try:
            self._write(everything)
            wrote_all = True
        except sqlite3.Error as exc:
            error = f"could not record to {self.path}: {exc}"
            if _is_disk_full(exc):
                freed = self._make_room()
                try:
                    self._write(everything)
                    wrote_all = True
                    error = f"the store {self.path} is full: dropped the {freed} oldest samples to make room"
                except sqlite3.Error:
                    try:
                        self._write(essential)
                        wrote_rest = True
                        error = f"the store {self.path} is full: kept sessions and requests, lost samples"
                    except sqlite3.Error as exc3:
                        error = f"could not record to {self.path}: {exc3}"
        if wrote_all:
            self._last_sample.update(sample_marks)
            if hardware:
                self._last_hardware = (now, hardware_signature(snapshot.hardware))
        if wrote_all or wrote_rest:
            self._alert_state.update(alert_marks)
            for alert in snapshot.ended_alerts:
                self._alert_state.pop(alert.id, None)

        if error is None and now - self._last_prune_wall_s >= PRUNE_INTERVAL_S:
            try:
                self.prune(now)
            except sqlite3.Error as exc:
                error = f"could not prune {self.path}: {exc}"
        self._set_error(error)
        return error

    def record_stop(self, sessions: Iterable[SessionRecord], alerts: Iterable[Alert] = ()) -> str | None:
        """Store what a recorder ends as it stops: its sessions and its alerts, ended; the error, if
        one, as `record` returns it."""
        rows = {"sessions": [session_row(s) for s in sessions], "alerts": [alert_row(a) for a in alerts]}
        if not self.writer or not any(rows.values()):
            return None
        try:
            self._write(rows)
        except sqlite3.Error as exc:
            error = f"could not record to {self.path}: {exc}"
            self._set_error(error)
            return error
        return None

    def _set_error(self, error: str | None) -> None:
        if error != self.last_error:  # log transitions, not ticks
            if error:
                log.warning("%s", error)
            elif self.last_error:
                log.info("store %s: recording again", self.path)
        self.last_error = error

    def _write(self, rows: Rows) -> None:
        """Write `rows` (table → rows, each a column → value dict) in one transaction."""
        if not any(rows.values()):
            return
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for table in TABLES:
                    table_rows = rows.get(table)
                    if table_rows:
                        conn.executemany(write_sql(table, tuple(table_rows[0])), table_rows)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def _make_room(self) -> int:
        """Disk full: delete the oldest tenth of the samples so their pages can be reused."""
        try:
            with self._lock:
                count = int(self._conn.execute("SELECT count(*) FROM samples").fetchone()[0])
                if not count:
                    return 0
                n = max(1, math.ceil(count / 10))
                self._conn.execute(delete_oldest_sql("samples"), (n,))
                return n
        except sqlite3.Error:
            return 0

    def _sample_rows(self, snapshot: Snapshot) -> tuple[list[Row], dict[tuple[str, str], tuple[float, str]]]:
        now = snapshot.t_wall_s
        rows: list[Row] = []
        marks: dict[tuple[str, str], tuple[float, str]] = {}
        for server in snapshot.servers:
            for m in server.models:
                key = (server.url, m.name)
                if key in marks:
                    continue
                last = self._last_sample.get(key)
                interval = self.sample_interval_s
                if m.phase == "idle" and (last is None or last[1] == "idle"):
                    interval = self.idle_sample_interval_s  # idle and unchanged: sample slowly
                if last is not None and last[0] <= now < last[0] + interval - min(0.1 * interval, _JITTER_S):
                    continue
                marks[key] = (now, m.phase)
                rows.append(sample_row(now, server, m))
        return rows, marks

    def _hardware_rows(self, snapshot: Snapshot) -> list[Row]:
        hw = snapshot.hardware
        last = self._last_hardware
        now = snapshot.t_wall_s
        if (
            last is not None
            and last[1] == hardware_signature(hw)
            and last[0] <= now < last[0] + HARDWARE_INTERVAL_S
        ):
            return []
        return [hardware_row(now, hw)]

    def _alert_rows(self, snapshot: Snapshot) -> tuple[list[Row], dict[str, tuple[object, ...]]]:
        rows: list[Row] = []
        marks: dict[str, tuple[object, ...]] = {}
        for alert in (*snapshot.alerts, *snapshot.ended_alerts):
            state = (alert.severity, alert.message, alert.fix, alert.cause, alert.peak, alert.ended_wall_s)
            if self._alert_state.get(alert.id) == state or marks.get(alert.id) == state:
                continue
            marks[alert.id] = state
            rows.append(alert_row(alert))
        return rows, marks

    # ----------------------------------------------------------------- retention

    def record_bench(self, result: BenchResult) -> int:
        """Store a finished bench (one row per measured depth) as the baseline and calibration of
        its key; returns the rows written. Raises StoreError on a write error (the bench says so)."""
        if not self.writer:
            raise StoreError(f"the store {self.path} was opened read-only")
        rows = bench_rows(result)
        try:
            self._write({"bench": rows})
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the bench to {self.path}: {exc}") from exc
        self._baseline_cache.clear()
        self._bench_cache.clear()
        return len(rows)

    def prune(self, now_wall_s: float) -> int:
        """Apply the retention and the size cap; returns how many rows were deleted.

        Older than `retention_days`: samples, requests, hardware rows, ended sessions and
        alerts go. Over `max_size_bytes`: the oldest samples go first, then the oldest
        requests, until the store is back under 90 % of the cap. Freed pages are given
        back to the file system (incremental vacuum).
        """
        if not self.writer:
            raise StoreError(f"the store {self.path} was opened read-only")
        self._last_prune_wall_s = now_wall_s
        cutoff = now_wall_s - self.retention_days * 86400.0
        deleted = 0
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for table in ("samples", "requests", "hardware"):
                    cur = conn.execute(f"DELETE FROM {table} WHERE {TIME_COLUMNS[table]} < ?", (cutoff,))
                    deleted += cur.rowcount
                for table in ("sessions", "alerts"):
                    cur = conn.execute(
                        f"DELETE FROM {table} WHERE ended_wall_s IS NOT NULL AND ended_wall_s < ?", (cutoff,)
                    )
                    deleted += cur.rowcount
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            if self.max_size_bytes is not None:
                deleted += self._enforce_size_cap(self.max_size_bytes)
            conn.executescript("PRAGMA incremental_vacuum;")  # execute() would step once: one page
        return deleted

    def _enforce_size_cap(self, cap_bytes: int) -> int:
        deleted = 0
        for table in ("samples", "requests"):
            for _ in range(50):  # bounded: each pass removes a share sized to the excess
                used = self.size_bytes()
                if used <= cap_bytes:
                    return deleted
                count = self._conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if not count:
                    break
                share = min(1.0, (used - 0.9 * cap_bytes) / used)
                n = max(1, math.ceil(count * share))
                self._conn.execute(delete_oldest_sql(table), (n,))
                deleted += n
        return deleted
