"""The store's schema, its migrations, the named-placeholder SQL for writing rows, and its errors.

Schema changes go through `MIGRATIONS`: entry *i* upgrades `PRAGMA user_version` *i* to
*i + 1*. Add a migration by appending a function; never edit a released one.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from trayapp.core.machine import CPU_ONLY_LABEL

log = logging.getLogger(__name__)

TABLES = ("samples", "requests", "sessions", "hardware", "alerts", "bench")
TIME_COLUMNS = {
    "samples": "t_wall_s",
    "requests": "finished_wall_s",
    "sessions": "started_wall_s",
    "hardware": "t_wall_s",
    "alerts": "started_wall_s",
    "bench": "finished_wall_s",
}
BOOL_COLUMNS = frozenset(
    {
        "decode_exact",
        "ttft_exact",
        "exact",
        "aborted",
        "prompt_rate_upper_bound",
        "judged",
        "prompt_sent_exact",
        "energy_estimated",
    }
)
KEY_COLUMNS = {"sessions": "session_id", "alerts": "alert_id"}  # rows replaced in place, by this key


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message names the file."""


class StoreLockedError(StoreError):
    """Another process already records to this store."""


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


def _migration_3(conn: sqlite3.Connection) -> None:
    """What the recording proxy knows of a request: cached prompt tokens, API path, HTTP status,
    whether it was cut short, and whether its prompt tok/s is only an upper bound (Ollama)."""
    for column in (
        "cached_tokens INTEGER",
        "endpoint TEXT",
        "http_status INTEGER",
        "aborted INTEGER NOT NULL DEFAULT 0",
        "prompt_rate_upper_bound INTEGER NOT NULL DEFAULT 0",
    ):
        conn.execute(f"ALTER TABLE requests ADD COLUMN {column}")


def _migration_4(conn: sqlite3.Connection) -> None:
    """`sessions.spec_type`: the speculative decoding a session ran with (NULL: plain decode), so a
    baseline compares like with like and a drafted session can be set against a plain one."""
    conn.execute("ALTER TABLE sessions ADD COLUMN spec_type TEXT")


def _migration_5(conn: sqlite3.Connection) -> None:
    """`bench`: what `llm-tray bench` measured, one row per sweep depth (depth 0: the decode runs), the
    baseline of its (model, quantization, hardware, speculative decoding) and its calibration. Numbers
    only, no text but the key and the server version. `judged`: 1 when the efficiency was judged as
    the monitor judges it (a GPU machine, the model fully in GPU memory)."""
    conn.execute(
        """CREATE TABLE bench (
            started_wall_s REAL NOT NULL,
            finished_wall_s REAL NOT NULL,
            model TEXT NOT NULL,
            quantization TEXT,
            hardware TEXT NOT NULL,
            server_version TEXT,
            spec_type TEXT,
            depth_tokens INTEGER NOT NULL,
            context_tokens INTEGER,
            decode_tok_s REAL NOT NULL,
            decode_spread_tok_s REAL,
            decode_cv REAL,
            decode_exact INTEGER NOT NULL DEFAULT 0,
            runs INTEGER NOT NULL,
            ceiling_tok_s REAL,
            efficiency REAL,
            judged INTEGER NOT NULL DEFAULT 0,
            gpu_fraction REAL,
            ttft_s REAL,
            prompt_tok_s REAL
        )"""
    )
    conn.execute("CREATE INDEX bench_key ON bench (model, hardware, finished_wall_s)")


def _migration_6(conn: sqlite3.Connection) -> None:
    """Did a request fit its context (#20): the prompt's tokens as sent (and whether counted by the
    server's tokenizer), the context size a server named when it refused or cut a request, why the
    answer ended, and the length limit the client asked for; and each alert's fix as commands to
    copy (a JSON list). Counts only, no text."""
    for column in (
        "prompt_tokens_sent INTEGER",
        "prompt_sent_exact INTEGER NOT NULL DEFAULT 0",
        "context_limit_tokens INTEGER",
        "stop_reason TEXT",
        "max_tokens_requested INTEGER",
    ):
        conn.execute(f"ALTER TABLE requests ADD COLUMN {column}")
    conn.execute("ALTER TABLE alerts ADD COLUMN fix_commands_json TEXT")


def _migration_7(conn: sqlite3.Connection) -> None:
    """Energy per request (#21): joules above the idle draw for prefill and decode, J per decoded
    token, the idle draw subtracted, where the energy was read and, when it was not, why."""
    for column in (
        "energy_prefill_j REAL",
        "energy_decode_j REAL",
        "energy_j_per_token REAL",
        "energy_idle_w REAL",
        "energy_source TEXT",
        "energy_estimated INTEGER NOT NULL DEFAULT 0",
        "energy_reason TEXT",
    ):
        conn.execute(f"ALTER TABLE requests ADD COLUMN {column}")


def _migration_8(conn: sqlite3.Connection) -> None:
    """Who sent each proxied request and how long it waited for the server (#22): the wait before
    the server began reading its prompt, the client's process name (or User-Agent product) and pid."""
    for column in ("queue_wait_s REAL", "client_name TEXT", "client_pid INTEGER"):
        conn.execute(f"ALTER TABLE requests ADD COLUMN {column}")


def _migration_9(conn: sqlite3.Connection) -> None:
    """`bench.server_kind`: the engine a bench ran on (llamacpp, ollama, …), so its stored build
    (`server_version`) names a build of something ("llama.cpp b11434"), as a session's does (#22)."""
    conn.execute("ALTER TABLE bench ADD COLUMN server_kind TEXT")


def _migration_10(conn: sqlite3.Connection) -> None:
    """A CPU-only machine's hardware label no longer carries its measured RAM bandwidth
    ("CPU (system RAM) @ 20 GB/s" -> "CPU (system RAM)"): a re-measurement changed the label and
    orphaned every session and bench recorded under the earlier figure."""
    for table in ("sessions", "bench"):
        conn.execute(
            f"UPDATE {table} SET hardware = ? WHERE hardware LIKE ?",
            (CPU_ONLY_LABEL, f"{CPU_ONLY_LABEL} @ % GB/s"),
        )


Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = [
    _migration_1,
    _migration_2,
    _migration_3,
    _migration_4,
    _migration_5,
    _migration_6,
    _migration_7,
    _migration_8,
    _migration_9,
    _migration_10,
]


def schema_version() -> int:
    """The schema version this code writes (`PRAGMA user_version`)."""
    return len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: Path | str) -> None:
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


@functools.cache
def write_sql(table: str, columns: tuple[str, ...]) -> str:
    """INSERT of `columns` into `table` with named placeholders (`:column`), so each value is
    bound by its column's name; tables in `KEY_COLUMNS` upsert on their key."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}")
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    sql = f"INSERT INTO {table} ({names}) VALUES ({values})"
    key = KEY_COLUMNS.get(table)
    if key is not None:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != key)
        sql += f" ON CONFLICT ({key}) DO UPDATE SET {updates}"
    return sql


def delete_oldest_sql(table: str) -> str:
    """DELETE of the `?` oldest rows of `table` (by its time column)."""
    return (
        f"DELETE FROM {table} WHERE rowid IN "
        f"(SELECT rowid FROM {table} ORDER BY {TIME_COLUMNS[table]} LIMIT ?)"
    )
