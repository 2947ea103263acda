"""SQLite session log: samples, finished requests, sessions, hardware snapshots and alerts.

Metrics only: no table has a column for prompt or completion text, and server URLs are
stored with any password or query-string value masked. One process records (the tray,
`watch` or `agent`): a writer holds an exclusive lock on `<db>.lock`; readers
(`writer=False`: export, sessions, report) never take it and read while the monitor
writes (WAL). Each `record()` is one committed transaction, so a `kill -9` loses at most
the tick in flight.

Schema changes go through `MIGRATIONS`: entry *i* upgrades `PRAGMA user_version` *i* to
*i + 1*. Add a migration by appending a function; never edit a released one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from trayapp.core.model import Alert, HardwareSnapshot, RequestRecord, SessionRecord, Snapshot

log = logging.getLogger(__name__)

TABLES = ("samples", "requests", "sessions", "hardware", "alerts")
TIME_COLUMNS = {
    "samples": "t_wall_s",
    "requests": "finished_wall_s",
    "sessions": "started_wall_s",
    "hardware": "t_wall_s",
    "alerts": "started_wall_s",
}
BOOL_COLUMNS = frozenset({"decode_exact", "ttft_exact", "exact"})

HARDWARE_INTERVAL_S = 60.0  # a hardware row at most this often unless something changes
PRUNE_INTERVAL_S = 300.0  # record() prunes at most this often
_JITTER_S = 0.5  # a tick up to 10 % (at most this) early still counts as a full interval
_WIN_LOCK_OFFSET = 4096  # Windows locks are mandatory: lock a byte past the pid text
_QUICK_CHECK_BUDGET_S = 1.0
BASELINE_CACHE_S = 60.0  # the monitor asks every tick; the answer may be this old
_BASELINE_CONTEXT_STEP = math.log(1.05)  # contexts within ~5 % share a cached answer


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message names the file."""


class StoreLockedError(StoreError):
    """Another process already records to this store."""


@dataclass(frozen=True)
class Baseline:
    """The best comparable earlier session of a model, for the `regression` detector."""

    session_id: str
    decode_tok_s: float  # median per-stream decode rate at comparable context
    started_wall_s: float
    server_version: str | None
    context_tokens: int | None  # median context depth of the rates used
    values: int  # how many rates the median is over
    model: str
    quantization: str | None
    hardware: str | None

    @property
    def when_wall_s(self) -> float:
        """When the baseline was measured (its session's start)."""
        return self.started_wall_s


# --------------------------------------------------------------------------- schema


def _migration_1(conn: sqlite3.Connection) -> None:
    """The initial schema."""
    statements = [
        """CREATE TABLE samples (
            t_wall_s REAL NOT NULL,
            session_id TEXT,
            server TEXT NOT NULL,
            server_kind TEXT NOT NULL,
            model TEXT NOT NULL,
            phase TEXT NOT NULL,
            decode_tok_s REAL,
            decode_total_tok_s REAL,
            active_streams INTEGER NOT NULL DEFAULT 0,
            decode_exact INTEGER,
            prompt_tok_s REAL,
            ttft_s REAL,
            context_tokens INTEGER,
            context_length INTEGER,
            ceiling_tok_s REAL,
            full_gpu_ceiling_tok_s REAL,
            gpu_fraction REAL,
            vram_bytes INTEGER,
            draft_acceptance REAL
        )""",
        "CREATE INDEX samples_time ON samples (t_wall_s)",
        "CREATE INDEX samples_session ON samples (session_id, t_wall_s)",
        """CREATE TABLE requests (
            request_id INTEGER PRIMARY KEY,
            finished_wall_s REAL NOT NULL,
            session_id TEXT,
            server TEXT NOT NULL,
            server_kind TEXT NOT NULL,
            model TEXT NOT NULL,
            exact INTEGER NOT NULL,
            prompt_tokens INTEGER,
            decode_tokens INTEGER,
            context_tokens INTEGER,
            prompt_tok_s REAL,
            decode_tok_s REAL,
            ttft_s REAL,
            load_s REAL,
            ceiling_tok_s REAL,
            gpu_fraction REAL,
            draft_tokens INTEGER,
            draft_accepted INTEGER,
            source TEXT NOT NULL
        )""",
        "CREATE INDEX requests_time ON requests (finished_wall_s)",
        "CREATE INDEX requests_session ON requests (session_id, finished_wall_s)",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            server_kind TEXT NOT NULL,
            model TEXT NOT NULL,
            started_wall_s REAL NOT NULL,
            ended_wall_s REAL,
            server_version TEXT,
            quantization TEXT,
            hardware TEXT,
            requests INTEGER NOT NULL DEFAULT 0,
            decode_tokens INTEGER NOT NULL DEFAULT 0,
            mean_decode_tok_s REAL,
            peak_decode_tok_s REAL,
            mean_prompt_tok_s REAL,
            mean_ttft_s REAL,
            max_context_tokens INTEGER,
            ceiling_tok_s REAL,
            gpu_fraction REAL,
            alerts TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX sessions_started ON sessions (started_wall_s)",
        "CREATE INDEX sessions_model ON sessions (model, started_wall_s)",
        """CREATE TABLE hardware (
            t_wall_s REAL NOT NULL,
            gpu_names TEXT NOT NULL,
            gpu_count INTEGER NOT NULL,
            vram_used_bytes INTEGER,
            vram_total_bytes INTEGER,
            gpu_bandwidth_gbps REAL,
            gpu_bandwidth_source TEXT,
            ram_total_bytes INTEGER,
            ram_available_bytes INTEGER,
            ram_bandwidth_gbps REAL,
            ram_bandwidth_source TEXT,
            gpu_reason TEXT,
            gpus_json TEXT NOT NULL
        )""",
        "CREATE INDEX hardware_time ON hardware (t_wall_s)",
        """CREATE TABLE alerts (
            alert_id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            severity TEXT NOT NULL,
            server TEXT NOT NULL,
            model TEXT,
            message TEXT NOT NULL,
            fix TEXT NOT NULL,
            cause TEXT,
            started_wall_s REAL NOT NULL,
            ended_wall_s REAL,
            peak REAL,
            evidence_json TEXT NOT NULL
        )""",
        "CREATE INDEX alerts_started ON alerts (started_wall_s)",
    ]
    for statement in statements:
        conn.execute(statement)


def _migration_2(conn: sqlite3.Connection) -> None:
    """`samples.ttft_exact`: 1 server-reported TTFT, 0 estimated (prompt tokens ÷ prompt tok/s)."""
    conn.execute("ALTER TABLE samples ADD COLUMN ttft_exact INTEGER")


Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = [_migration_1, _migration_2]


def schema_version() -> int:
    """The schema version this code writes (`PRAGMA user_version`)."""
    return len(MIGRATIONS)


def _migrate(conn: sqlite3.Connection, path: Path | str) -> None:
    """Bring the database up to `schema_version()`, one transaction per migration."""
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    target = schema_version()
    if current > target:
        raise StoreError(
            f"{path} was written by a newer llm-tray (schema {current} > {target}); upgrade llm-tray"
        )
    for version in range(current, target):
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if current:
            log.info("store %s: migrated schema %d -> %d", path, version, version + 1)


# --------------------------------------------------------------------------- helpers


def redact_url(url: str) -> str:
    """The URL with a password and query-string values masked (never store credentials)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = netloc.rsplit("@", 1)[1]
            netloc = f"{parts.username or ''}:***@{host}"
        query = parts.query
        if query:
            query = urlencode([(key, "***") for key, _ in parse_qsl(query, keep_blank_values=True)], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return url


def _is_disk_full(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "is full" in text or "no space" in text


def _is_corrupt(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("not a database", "malformed", "corrupt", "integrity check"))


def _num(value: float | None) -> float | None:
    """A finite float or None (SQLite has no NaN; exports must not carry one)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _bool(value: bool | None) -> int | None:
    return None if value is None else int(bool(value))


def _comparable_context(context: int | None, target: int | None, tolerance: float) -> bool:
    if target is None:
        return True
    if context is None:
        return False
    if context < 1024 and target < 1024:
        return True
    return abs(context - target) <= tolerance * target


def _acquire_lock(lock_path: Path, db_path: Path) -> int:
    """Take the one-writer lock (non-blocking) and write our pid into the lock file."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if sys.platform == "win32":
            import msvcrt

            os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        os.close(fd)
        pid = text if text.isdigit() else "unknown"
        raise StoreLockedError(
            f"another llm-tray process (pid {pid}) is already recording to {db_path}"
        ) from None
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid():<20}\n".encode("ascii"))
    return fd


def _release_lock(fd: int) -> None:
    if sys.platform == "win32":
        import msvcrt

        with contextlib.suppress(OSError):
            os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    os.close(fd)


def _hardware_signature(hw: HardwareSnapshot) -> tuple[object, ...]:
    gpus = tuple((g.name, g.vram_total_bytes, g.bandwidth_gbps, g.bandwidth_source) for g in hw.gpus)
    host = hw.host
    return gpus, host.ram_total_bytes, host.ram_bandwidth_gbps, host.ram_bandwidth_source, hw.gpu_reason


def _sum_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# --------------------------------------------------------------------------- the store


class Store:
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
        self._baseline_cache: dict[tuple[object, ...], tuple[float, Baseline | None]] = {}
        self._conn = self._open_writer() if writer else self._open_reader()

    # ----------------------------------------------------------------- opening

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.row_factory = sqlite3.Row
        return conn

    def _open_writer(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _acquire_lock(self.path.with_name(self.path.name + ".lock"), self.path)
        try:
            try:
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
                    return self._prepare_writer()
                except sqlite3.DatabaseError as exc2:
                    raise StoreError(f"cannot open the store {self.path}: {exc2}") from exc2
        except BaseException:
            _release_lock(self._lock_fd)
            self._lock_fd = None
            raise

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
            _migrate(conn, self.path)
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
            _migrate(conn, self.path)
            return conn
        conn = self._connect(self.path.resolve().as_uri() + "?mode=rw", uri=True)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("PRAGMA query_only = 1")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"cannot read the store {self.path}: {exc}") from exc
        if version == 0:  # created but never initialised: read as empty
            conn.close()
            conn = self._connect(":memory:")
            _migrate(conn, self.path)
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if self.writer:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("PRAGMA optimize")
                self._conn.close()
                self._conn = None  # type: ignore[assignment]
            if self._lock_fd is not None:
                _release_lock(self._lock_fd)
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
        sessions, requests and alerts. Returns None when everything was written.
        """
        if not self.writer:
            raise StoreError(f"the store {self.path} was opened read-only")
        now = snapshot.t_wall_s
        samples, sample_marks = self._sample_rows(snapshot)
        hardware = self._hardware_row(snapshot)
        alerts, alert_marks = self._alert_rows(snapshot)
        requests = [self._request_row(r) for r in snapshot.requests]
        session_rows = [self._session_row(s) for s in sessions]

        error: str | None = None
        wrote_all = wrote_rest = False
        try:
            self._write(samples, requests, session_rows, hardware, alerts)
            wrote_all = True
        except sqlite3.Error as exc:
            error = f"could not record to {self.path}: {exc}"
            if _is_disk_full(exc):
                freed = self._make_room()
                try:
                    self._write(samples, requests, session_rows, hardware, alerts)
                    wrote_all = True
                    error = f"the store {self.path} is full: dropped the {freed} oldest samples to make room"
                except sqlite3.Error:
                    try:
                        self._write([], requests, session_rows, None, alerts)
                        wrote_rest = True
                        error = f"the store {self.path} is full: kept sessions and requests, lost samples"
                    except sqlite3.Error as exc3:
                        error = f"could not record to {self.path}: {exc3}"
        if wrote_all:
            self._last_sample.update(sample_marks)
            if hardware is not None:
                self._last_hardware = (now, _hardware_signature(snapshot.hardware))
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

    def _set_error(self, error: str | None) -> None:
        if error != self.last_error:  # log transitions, not ticks
            if error:
                log.warning("%s", error)
            elif self.last_error:
                log.info("store %s: recording again", self.path)
        self.last_error = error

    def _write(
        self,
        samples: Sequence[tuple[object, ...]],
        requests: Sequence[tuple[object, ...]],
        sessions: Sequence[tuple[object, ...]],
        hardware: tuple[object, ...] | None,
        alerts: Sequence[tuple[object, ...]],
    ) -> None:
        if not (samples or requests or sessions or hardware or alerts):
            return
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                if samples:
                    conn.executemany(_INSERT_SAMPLE, samples)
                if requests:
                    conn.executemany(_INSERT_REQUEST, requests)
                if sessions:
                    conn.executemany(_UPSERT_SESSION, sessions)
                if hardware is not None:
                    conn.execute(_INSERT_HARDWARE, hardware)
                if alerts:
                    conn.executemany(_UPSERT_ALERT, alerts)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def _make_room(self) -> int:
        """Disk full: delete the oldest tenth of the samples so their pages can be reused."""
        try:
            with self._lock:
                count = self._conn.execute("SELECT count(*) FROM samples").fetchone()[0]
                if not count:
                    return 0
                n = max(1, math.ceil(count / 10))
                self._conn.execute(_DELETE_OLDEST["samples"], (n,))
                return n
        except sqlite3.Error:
            return 0

    def _sample_rows(
        self, snapshot: Snapshot
    ) -> tuple[list[tuple[object, ...]], dict[tuple[str, str], tuple[float, str]]]:
        now = snapshot.t_wall_s
        rows: list[tuple[object, ...]] = []
        marks: dict[tuple[str, str], tuple[float, str]] = {}
        for server in snapshot.servers:
            url = redact_url(server.url)
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
                rows.append(
                    (
                        now, m.session_id, url, server.kind, m.name, m.phase,
                        _num(m.decode_tok_s), _num(m.decode_total_tok_s), m.active_streams,
                        _bool(m.decode_exact), _num(m.prompt_tok_s), _num(m.ttft_s),
                        m.context_tokens, m.context_length, _num(m.ceiling_tok_s),
                        _num(m.full_gpu_ceiling_tok_s), _num(m.gpu_fraction), m.vram_bytes,
                        _num(m.draft_acceptance), _bool(m.ttft_exact),
                    )
                )  # fmt: skip
        return rows, marks

    def _hardware_row(self, snapshot: Snapshot) -> tuple[object, ...] | None:
        hw = snapshot.hardware
        signature = _hardware_signature(hw)
        last = self._last_hardware
        now = snapshot.t_wall_s
        if last is not None and last[1] == signature and last[0] <= now < last[0] + HARDWARE_INTERVAL_S:
            return None
        first = hw.gpus[0] if hw.gpus else None
        gpus = [
            {
                "index": g.index,
                "name": g.name,
                "vendor": g.vendor,
                "vram_total_bytes": g.vram_total_bytes,
                "vram_used_bytes": g.vram_used_bytes,
                "bandwidth_gbps": _num(g.bandwidth_gbps),
                "bandwidth_source": g.bandwidth_source,
                "unified_memory": g.unified_memory,
                "throttle_reasons": list(g.throttle_reasons),
            }
            for g in hw.gpus
        ]
        host = hw.host
        return (
            now, ",".join(g.name for g in hw.gpus), len(hw.gpus),
            _sum_known(g.vram_used_bytes for g in hw.gpus), _sum_known(g.vram_total_bytes for g in hw.gpus),
            _num(first.bandwidth_gbps) if first else None, first.bandwidth_source if first else None,
            host.ram_total_bytes, host.ram_available_bytes, _num(host.ram_bandwidth_gbps),
            host.ram_bandwidth_source, hw.gpu_reason, json.dumps(gpus, separators=(",", ":")),
        )  # fmt: skip

    def _alert_rows(
        self, snapshot: Snapshot
    ) -> tuple[list[tuple[object, ...]], dict[str, tuple[object, ...]]]:
        rows: list[tuple[object, ...]] = []
        marks: dict[str, tuple[object, ...]] = {}
        for alert in (*snapshot.alerts, *snapshot.ended_alerts):
            state = (alert.severity, alert.message, alert.fix, alert.cause, alert.peak, alert.ended_wall_s)
            if self._alert_state.get(alert.id) == state or marks.get(alert.id) == state:
                continue
            marks[alert.id] = state
            rows.append(self._alert_row(alert))
        return rows, marks

    @staticmethod
    def _alert_row(a: Alert) -> tuple[object, ...]:
        evidence = json.dumps(dict(a.evidence), default=str, sort_keys=True, separators=(",", ":"))
        return (
            a.id, a.kind, a.severity, redact_url(a.server), a.model, a.message, a.fix, a.cause,
            a.since_wall_s, a.ended_wall_s, _num(a.peak), evidence,
        )  # fmt: skip

    @staticmethod
    def _request_row(r: RequestRecord) -> tuple[object, ...]:
        return (
            r.finished_wall_s, r.session_id, redact_url(r.server), r.server_kind, r.model, int(r.exact),
            r.prompt_tokens, r.decode_tokens, r.context_tokens, _num(r.prompt_tok_s), _num(r.decode_tok_s),
            _num(r.ttft_s), _num(r.load_s), _num(r.ceiling_tok_s), _num(r.gpu_fraction), r.draft_tokens,
            r.draft_accepted, r.source,
        )  # fmt: skip

    @staticmethod
    def _session_row(s: SessionRecord) -> tuple[object, ...]:
        return (
            s.id, redact_url(s.server), s.server_kind, s.model, s.started_wall_s, s.ended_wall_s,
            s.server_version, s.quantization, s.hardware, s.requests, s.decode_tokens,
            _num(s.mean_decode_tok_s), _num(s.peak_decode_tok_s), _num(s.mean_prompt_tok_s),
            _num(s.mean_ttft_s), s.max_context_tokens, _num(s.ceiling_tok_s), _num(s.gpu_fraction),
            ",".join(s.alerts),
        )  # fmt: skip

    # ----------------------------------------------------------------- bounds

    def size_bytes(self) -> int:
        """Bytes in use by the database (pages minus free pages; the WAL not counted)."""
        with self._lock:
            pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
            free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
            page = self._conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * page)

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
                self._conn.execute(_DELETE_OLDEST[table], (n,))
                deleted += n
        return deleted

    # ----------------------------------------------------------------- reading

    def columns(self, table: str) -> list[str]:
        """Column names of `table`, in order."""
        return list(self.column_types(table))

    def column_types(self, table: str) -> dict[str, str]:
        """Column name → declared SQLite type ("REAL", "INTEGER", "TEXT") of `table`."""
        self._check_table(table)
        with self._lock:
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
            cursor.execute(sql, params)
            names = [d[0] for d in cursor.description]
            while True:
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
        with self._lock:
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
        with self._lock:
            rows = self._conn.execute(sql, params).fetchall()
        return [_session_from_row(dict(row)) for row in reversed(rows)]

    def hardware_at(self, t_wall_s: float) -> dict[str, object] | None:
        """The hardware row in force at `t_wall_s` (the latest before it, else the first after)."""
        with self._lock:
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
        with self._lock:
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

    def baseline(
        self,
        *,
        model: str,
        quantization: str | None,
        hardware: str | None,
        context_tokens: int | None,
        before_wall_s: float,
        exclude_session: str | None = None,
        context_tolerance: float = 0.5,
        max_age_s: float = 30 * 86400.0,
        min_values: int = 3,
    ) -> Baseline | None:
        """The best comparable recent session: highest median decode tok/s at comparable context.

        Comparable: same model, quantization and hardware (None matches None), started
        before `before_wall_s` and active within `max_age_s` of it, and rates measured at a
        context depth within ±`context_tolerance` (relative) of `context_tokens`, or both
        under 1024 tokens. Rates come from decoding samples and finished requests; a
        session needs `min_values` of them. Answers are cached for `BASELINE_CACHE_S` of
        `before_wall_s` (contexts within ~5 % share an answer): the monitor asks every tick.
        """
        bucket = (
            None
            if context_tokens is None
            else round(math.log(max(context_tokens, 1)) / _BASELINE_CONTEXT_STEP)
        )
        key = (
            model,
            quantization,
            hardware,
            bucket,
            exclude_session,
            context_tolerance,
            max_age_s,
            min_values,
        )
        cached = self._baseline_cache.get(key)
        if cached is not None and 0.0 <= before_wall_s - cached[0] < BASELINE_CACHE_S:
            return cached[1]
        if len(self._baseline_cache) > 256:
            self._baseline_cache.clear()
        best = self._find_baseline(
            model, quantization, hardware, context_tokens, before_wall_s, exclude_session,
            context_tolerance, max_age_s, min_values,
        )  # fmt: skip
        self._baseline_cache[key] = (before_wall_s, best)
        return best

    def _find_baseline(
        self,
        model: str,
        quantization: str | None,
        hardware: str | None,
        context_tokens: int | None,
        before_wall_s: float,
        exclude_session: str | None,
        context_tolerance: float,
        max_age_s: float,
        min_values: int,
    ) -> Baseline | None:
        with self._lock:
            candidates = self._conn.execute(
                "SELECT session_id, started_wall_s, server_version FROM sessions "
                "WHERE model = ? AND quantization IS ? AND hardware IS ? AND started_wall_s < ? "
                "AND COALESCE(ended_wall_s, started_wall_s) >= ? AND session_id IS NOT ? "
                "ORDER BY started_wall_s DESC LIMIT 200",
                (model, quantization, hardware, before_wall_s, before_wall_s - max_age_s, exclude_session),
            ).fetchall()
            best: Baseline | None = None
            for session_id, started, version in candidates:
                rows = self._conn.execute(
                    "SELECT decode_tok_s, context_tokens FROM samples WHERE session_id = ? "
                    "AND decode_tok_s > 0 AND t_wall_s < ? "
                    "UNION ALL SELECT decode_tok_s, context_tokens FROM requests WHERE session_id = ? "
                    "AND decode_tok_s > 0 AND finished_wall_s < ?",
                    (session_id, before_wall_s, session_id, before_wall_s),
                ).fetchall()
                used = [(r, c) for r, c in rows if _comparable_context(c, context_tokens, context_tolerance)]
                if len(used) < max(min_values, 1):
                    continue
                rate = float(statistics.median(r for r, _ in used))
                if best is not None and rate <= best.decode_tok_s:
                    continue
                contexts = [c for _, c in used if c is not None]
                best = Baseline(
                    session_id=session_id,
                    decode_tok_s=rate,
                    started_wall_s=started,
                    server_version=version,
                    context_tokens=int(statistics.median(contexts)) if contexts else None,
                    values=len(used),
                    model=model,
                    quantization=quantization,
                    hardware=hardware,
                )
        return best


def _session_from_row(row: dict[str, object]) -> SessionRecord:
    alerts = str(row.get("alerts") or "")
    return SessionRecord(
        id=str(row["session_id"]),
        server=str(row["server"]),
        server_kind=str(row["server_kind"]),
        model=str(row["model"]),
        started_wall_s=float(row["started_wall_s"]),  # type: ignore[arg-type]
        ended_wall_s=row.get("ended_wall_s"),  # type: ignore[arg-type]
        server_version=row.get("server_version"),  # type: ignore[arg-type]
        quantization=row.get("quantization"),  # type: ignore[arg-type]
        hardware=row.get("hardware"),  # type: ignore[arg-type]
        requests=int(row.get("requests") or 0),  # type: ignore[call-overload]
        decode_tokens=int(row.get("decode_tokens") or 0),  # type: ignore[call-overload]
        mean_decode_tok_s=row.get("mean_decode_tok_s"),  # type: ignore[arg-type]
        peak_decode_tok_s=row.get("peak_decode_tok_s"),  # type: ignore[arg-type]
        mean_prompt_tok_s=row.get("mean_prompt_tok_s"),  # type: ignore[arg-type]
        mean_ttft_s=row.get("mean_ttft_s"),  # type: ignore[arg-type]
        max_context_tokens=row.get("max_context_tokens"),  # type: ignore[arg-type]
        ceiling_tok_s=row.get("ceiling_tok_s"),  # type: ignore[arg-type]
        gpu_fraction=row.get("gpu_fraction"),  # type: ignore[arg-type]
        alerts=tuple(a for a in alerts.split(",") if a),
    )


_SAMPLE_COLUMNS = (
    "t_wall_s, session_id, server, server_kind, model, phase, decode_tok_s, decode_total_tok_s, "
    "active_streams, decode_exact, prompt_tok_s, ttft_s, context_tokens, context_length, ceiling_tok_s, "
    "full_gpu_ceiling_tok_s, gpu_fraction, vram_bytes, draft_acceptance, ttft_exact"
)
_INSERT_SAMPLE = f"INSERT INTO samples ({_SAMPLE_COLUMNS}) VALUES ({', '.join('?' * 20)})"
_INSERT_REQUEST = (
    "INSERT INTO requests (finished_wall_s, session_id, server, server_kind, model, exact, prompt_tokens, "
    "decode_tokens, context_tokens, prompt_tok_s, decode_tok_s, ttft_s, load_s, ceiling_tok_s, gpu_fraction, "
    f"draft_tokens, draft_accepted, source) VALUES ({', '.join('?' * 18)})"
)
_SESSION_COLUMNS = (
    "session_id", "server", "server_kind", "model", "started_wall_s", "ended_wall_s", "server_version",
    "quantization", "hardware", "requests", "decode_tokens", "mean_decode_tok_s", "peak_decode_tok_s",
    "mean_prompt_tok_s", "mean_ttft_s", "max_context_tokens", "ceiling_tok_s", "gpu_fraction", "alerts",
)  # fmt: skip
_UPSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) VALUES ({', '.join('?' * len(_SESSION_COLUMNS))}) "
    "ON CONFLICT (session_id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _SESSION_COLUMNS[1:])
)
_INSERT_HARDWARE = (
    "INSERT INTO hardware (t_wall_s, gpu_names, gpu_count, vram_used_bytes, vram_total_bytes, "
    "gpu_bandwidth_gbps, gpu_bandwidth_source, ram_total_bytes, ram_available_bytes, ram_bandwidth_gbps, "
    f"ram_bandwidth_source, gpu_reason, gpus_json) VALUES ({', '.join('?' * 13)})"
)
_ALERT_COLUMNS = (
    "alert_id", "kind", "severity", "server", "model", "message", "fix", "cause", "started_wall_s",
    "ended_wall_s", "peak", "evidence_json",
)  # fmt: skip
_UPSERT_ALERT = (
    f"INSERT INTO alerts ({', '.join(_ALERT_COLUMNS)}) VALUES ({', '.join('?' * len(_ALERT_COLUMNS))}) "
    "ON CONFLICT (alert_id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _ALERT_COLUMNS[1:])
)
_DELETE_OLDEST = {
    table: f"DELETE FROM {table} WHERE rowid IN "
    f"(SELECT rowid FROM {table} ORDER BY {TIME_COLUMNS[table]} LIMIT ?)"
    for table in ("samples", "requests")
}
