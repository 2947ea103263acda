"""Export the session log as CSV, JSON Lines or Parquet, streaming row by row.

Rows come straight from the store (`Store.iter_rows`, fetched in batches), so a store
of millions of samples exports in bounded memory. Column names carry their units
(`decode_tok_s`, `ttft_s`, `t_wall_s`, `vram_bytes`, `gpu_fraction`, `ceiling_pct`);
`time_utc` (and `ended_utc` for sessions) is the same instant in ISO 8601 UTC. The store
holds metrics only, so no export can carry prompt text, API keys or auth headers.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from trayapp.config.files import atomic_output

if TYPE_CHECKING:  # the store loads when an export runs (the CLI's parser imports this module)
    from trayapp.sinks.store import Store


EXPORT_TABLES = ("requests", "sessions", "samples", "bench")
FORMATS = ("csv", "jsonl", "parquet")
PARQUET_HINT = "Parquet needs pyarrow: pip install 'llm-tray[parquet]'"


class ExportError(ValueError):
    """Bad export input (unknown session, table or format, missing pyarrow)."""


@dataclass(frozen=True)
class ExportResult:
    rows: int
    table: str
    path: Path | None  # None when written to a stream (stdout)


def iso_utc(t_wall_s: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds, e.g. 2025-01-31T10:00:00.250Z."""
    if t_wall_s is None:
        return None
    text = datetime.fromtimestamp(t_wall_s, tz=timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _pct(rate: float | None, ceiling: float | None) -> float | None:
    if rate is None or not ceiling or ceiling <= 0:
        return None
    return 100.0 * rate / ceiling


def export_columns(store: Store, table: str) -> list[str]:
    """The exported columns of `table`, in order."""
    base = store.columns(table)
    if table == "sessions":
        return ["time_utc", "ended_utc", *base, "duration_s", "ceiling_pct"]
    return ["time_utc", *base, "ceiling_pct"]


def _time_columns(table: str) -> dict[str, str]:
    """Exported ISO column → the epoch-seconds column it renders."""
    from trayapp.sinks.store import TIME_COLUMNS

    columns = {"time_utc": TIME_COLUMNS[table]}
    if table == "sessions":
        columns["ended_utc"] = "ended_wall_s"
    return columns


def _rows(
    store: Store, table: str, since_wall_s: float | None, session_ids: list[str] | None, batch: int
) -> Iterator[dict[str, Any]]:
    """Rows with computed columns; ISO columns still hold epoch seconds (the writers render them).

    The store writes finite numbers only (no NaN or infinity), so values pass through as
    they are, but for the 0/1 columns (`BOOL_COLUMNS`: `decode_exact`, `ttft_exact`, `exact`)
    that become booleans (None stays None: not known).
    """
    from trayapp.sinks.store import BOOL_COLUMNS, TIME_COLUMNS

    time_column = TIME_COLUMNS[table]
    rate_column = "mean_decode_tok_s" if table == "sessions" else "decode_tok_s"
    bools = [c for c in store.columns(table) if c in BOOL_COLUMNS]
    source: Iterator[dict[str, Any]] = store.iter_rows(
        table, since_wall_s=since_wall_s, session_ids=session_ids, batch=batch
    )
    for row in source:
        row["time_utc"] = row[time_column]
        for column in bools:
            if row[column] is not None:
                row[column] = bool(row[column])
        if table == "sessions":
            ended, started = row["ended_wall_s"], row["started_wall_s"]
            row["ended_utc"] = ended
            row["duration_s"] = None if ended is None else ended - started
        row["ceiling_pct"] = _pct(row[rate_column], row["ceiling_tok_s"])
        yield row


def export(
    store: Store,
    *,
    table: str | None = None,
    fmt: str = "csv",
    since_wall_s: float | None = None,
    session_id: str | None = None,
    last_n: int | None = None,
    out: str | os.PathLike[str] | IO[str] | IO[bytes] | None = None,
    batch: int = 5000,
) -> ExportResult:
    """Write `table` in `fmt` to `out` (a path, a text or binary stream; None: stdout).

    `table` None: requests, or samples when no request records match the filter.
    Filters: `since_wall_s` (rows at or after it; sessions live at or after it), one
    `session_id`, or the `last_n` sessions. A path is written through a temporary file and
    renamed, so a failed export leaves no half file behind.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if table is not None and table not in EXPORT_TABLES:
        raise ExportError(f"unknown table {table!r}; expected one of {', '.join(EXPORT_TABLES)}")
    if table == "bench" and (session_id is not None or last_n is not None):
        raise ExportError("bench results belong to no session: export them without --session/--last")
    pyarrow_modules = _import_pyarrow() if fmt == "parquet" else None

    session_ids: list[str] | None = None
    if session_id is not None:
        if not store.sessions(session_id=session_id):
            raise ExportError(f"unknown session {session_id!r} (see `llm-tray sessions`)")
        session_ids = [session_id]
    elif last_n is not None:
        if last_n < 1:
            raise ExportError(f"--last needs a positive number of sessions, not {last_n}")
        session_ids = [s.id for s in store.sessions(last_n=last_n)]
    if table is None:
        has_requests = store.has_rows("requests", since_wall_s=since_wall_s, session_ids=session_ids)
        table = "requests" if has_requests else "samples"

    columns = export_columns(store, table)
    rows = _rows(store, table, since_wall_s, session_ids, batch)
    if out is None:
        out = sys.stdout
    if isinstance(out, (str, os.PathLike)):
        path = Path(out)
        if fmt == "parquet":
            with atomic_output(path, "wb") as binary:
                count = _write_parquet(pyarrow_modules, store, table, columns, rows, binary, batch)
        else:
            with atomic_output(path, "w", newline="") as text:
                count = _write_text(fmt, table, columns, rows, text)
        return ExportResult(count, table, path)

    if fmt == "parquet":
        sink: Any = out
        if isinstance(out, io.TextIOBase):
            sink = getattr(out, "buffer", None)
            if sink is None:
                raise ExportError("Parquet is binary: give a file name or a binary stream")
        count = _write_parquet(pyarrow_modules, store, table, columns, rows, sink, batch)
        return ExportResult(count, table, None)
    if isinstance(out, io.TextIOBase):
        count = _write_text(fmt, table, columns, rows, cast(IO[str], out))
    else:
        wrapper = io.TextIOWrapper(cast(Any, out), encoding="utf-8", newline="", write_through=True)
        try:
            count = _write_text(fmt, table, columns, rows, wrapper)
            wrapper.flush()
        finally:
            wrapper.detach()  # leave the caller's stream open
    return ExportResult(count, table, None)


def _write_text(
    fmt: str, table: str, columns: list[str], rows: Iterator[dict[str, Any]], out: IO[str]
) -> int:
    from trayapp.sinks.store import BOOL_COLUMNS

    times = _time_columns(table)
    count = 0
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")  # writes None as an empty field
        writer.writerow(columns)
        bools = [c for c in columns if c in BOOL_COLUMNS]
        for row in rows:
            for column in times:
                row[column] = iso_utc(row[column])
            for column in bools:
                if row[column] is not None:
                    row[column] = "true" if row[column] else "false"
            writer.writerow([row[c] for c in columns])
            count += 1
    else:
        dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
        for row in rows:
            for column in times:
                row[column] = iso_utc(row[column])
            out.write(dumps({c: row[c] for c in columns}))
            out.write("\n")
            count += 1
    out.flush()
    return count


def _import_pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ExportError(PARQUET_HINT) from None
    return pyarrow, pyarrow.parquet


def _parquet_schema(pa: Any, store: Store, table: str, columns: list[str]) -> Any:
    from trayapp.sinks.store import BOOL_COLUMNS

    declared = store.column_types(table)
    fields = []
    for name in columns:
        if name in ("time_utc", "ended_utc"):
            kind = pa.timestamp("us", tz="UTC")
        elif name in BOOL_COLUMNS:
            kind = pa.bool_()
        elif name in ("duration_s", "ceiling_pct") or declared.get(name) == "REAL":
            kind = pa.float64()
        elif declared.get(name) == "INTEGER":
            kind = pa.int64()
        else:
            kind = pa.string()
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def _write_parquet(
    modules: Any,
    store: Store,
    table: str,
    columns: list[str],
    rows: Iterator[dict[str, Any]],
    sink: Any,
    batch: int,
) -> int:
    pa, pq = modules
    schema = _parquet_schema(pa, store, table, columns)
    times = _time_columns(table)
    count = 0
    with pq.ParquetWriter(sink, schema) as writer:
        chunk: list[dict[str, Any]] = []

        def flush() -> None:
            for row in chunk:
                for column in times:
                    t = row[column]
                    row[column] = None if t is None else round(t * 1_000_000)
            writer.write_batch(pa.RecordBatch.from_pylist(chunk, schema=schema))
            chunk.clear()

        for row in rows:
            chunk.append(row)
            count += 1
            if len(chunk) >= batch:
                flush()
        if chunk:
            flush()
    return count
