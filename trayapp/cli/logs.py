"""`llm-tray sessions`, `llm-tray export` and `llm-tray report`: what the store recorded.

All three only read (`Store(writer=False)`), so they work while the tray, `watch` or
`agent` records. Bad input (an unknown session, a bad date) prints one line on stderr
and returns 2; a store that cannot be read returns 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from trayapp.config import paths
from trayapp.core.builds import BuildGroup, sessions_by_build
from trayapp.core.model import SessionRecord
from trayapp.core.server_kinds import engine_label
from trayapp.core.terminal import terminal_safe
from trayapp.core.units import as_float
from trayapp.sinks.export import EXPORT_TABLES, FORMATS, ExportError, export, iso_utc

if TYPE_CHECKING:  # the store loads when a command runs (the CLI's parser imports this module)
    from trayapp.sinks.store import Store

DEFAULT_SESSIONS_SHOWN = 20


class UsageError(ValueError):
    """Bad command-line input: one line on stderr, exit code 2."""


# --------------------------------------------------------------------------- arguments


def add_sessions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="ISO-DATE", help="sessions live at or after this date/time")
    parser.add_argument(
        "--last", type=int, metavar="N", help=f"the last N sessions (default {DEFAULT_SESSIONS_SHOWN})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--bench", action="store_true", help="the stored `llm-tray bench` results instead (one row per depth)"
    )
    parser.add_argument(
        "--by",
        choices=("build",),
        help="build: the sessions grouped by engine build and model (the speed under each build)",
    )
    parser.add_argument(
        "--clients",
        action="store_true",
        help="who used the servers instead: proxied requests per client (requests, tokens, time, queue wait)",
    )


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table", choices=EXPORT_TABLES, default=None, help="default: requests, or samples when none exist"
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="csv", help="default: csv (parquet needs pyarrow)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--since", metavar="ISO-DATE", help="rows at or after this date/time (local time unless Z)"
    )
    which.add_argument("--session", metavar="ID", help="one session (an id or a unique prefix)")
    which.add_argument("--last", type=int, metavar="N", help="the last N sessions")
    parser.add_argument("-o", "--output", metavar="FILE", default="-", help="output file (default: stdout)")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session", metavar="ID", help="the session (default: the latest)")
    parser.add_argument(
        "-o", "--output", metavar="FILE.html", required=True, help="where to write the report"
    )


# --------------------------------------------------------------------------- helpers


def parse_since(text: str) -> float:
    """An ISO 8601 date or date-time as epoch seconds; without a zone it is local time."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"bad date {text!r}: expected ISO 8601, e.g. 2025-01-31, 2025-01-31T14:00 or 2025-01-31T14:00Z"
        ) from None
    return moment.timestamp()  # a naive datetime is taken as local time


def _store_path(args: argparse.Namespace) -> Path:
    given = getattr(args, "store", None)
    return Path(given) if given else paths.store_file()


def _open(args: argparse.Namespace) -> Store:
    from trayapp.sinks.store import Store

    return Store(_store_path(args), writer=False)


def resolve_session(store: Store, text: str) -> str:
    """A session id from an exact id or a unique prefix of one."""
    if store.sessions(session_id=text):
        return text
    matches = [s.id for s in store.sessions() if s.id.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"session prefix {text!r} is ambiguous ({len(matches)} sessions match)")
    raise UsageError(f"unknown session {text!r} (see `llm-tray sessions`)")


def _positive_last(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"--last needs a positive number of sessions, not {value}")
    return value


def _fail(command: str, message: str, code: int) -> int:
    print(f"llm-tray {command}: error: {message}", file=sys.stderr)
    return code


def _ceiling_pct(s: SessionRecord) -> float | None:
    if s.mean_decode_tok_s is None or not s.ceiling_tok_s:
        return None
    return 100.0 * s.mean_decode_tok_s / s.ceiling_tok_s


def session_json(s: SessionRecord) -> dict[str, object]:
    return {
        "session_id": s.id,
        "server": s.server,
        "server_kind": s.server_kind,
        "server_version": s.server_version,
        "model": s.model,
        "quantization": s.quantization,
        "hardware": s.hardware,
        "started_utc": iso_utc(s.started_wall_s),
        "ended_utc": iso_utc(s.ended_wall_s),
        "started_wall_s": s.started_wall_s,
        "ended_wall_s": s.ended_wall_s,
        "duration_s": None if s.ended_wall_s is None else s.ended_wall_s - s.started_wall_s,
        "requests": s.requests,
        "decode_tokens": s.decode_tokens,
        "mean_decode_tok_s": s.mean_decode_tok_s,
        "peak_decode_tok_s": s.peak_decode_tok_s,
        "mean_prompt_tok_s": s.mean_prompt_tok_s,
        "mean_ttft_s": s.mean_ttft_s,
        "max_context_tokens": s.max_context_tokens,
        "ceiling_tok_s": s.ceiling_tok_s,
        "ceiling_pct": _ceiling_pct(s),
        "gpu_fraction": s.gpu_fraction,
        "alerts": list(s.alerts),
    }


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _duration(s: SessionRecord) -> str:
    if s.ended_wall_s is None:
        return "live"
    seconds = round(s.ended_wall_s - s.started_wall_s)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _server(url: str) -> str:
    return url.split("://", 1)[-1]


def _text_table(rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """Rows (the header first) as aligned columns, the `numeric` ones to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_sessions(sessions: Sequence[SessionRecord]) -> str:
    """A plain-text table of sessions (start in local time)."""
    header = (
        "ID",
        "MODEL",
        "SERVER",
        "START",
        "DURATION",
        "REQ",
        "MEAN TOK/S",
        "PEAK TOK/S",
        "CEIL %",
        "ALERTS",
    )
    rows = [header]
    for s in sessions:
        pct = _ceiling_pct(s)
        rows.append(
            (
                s.id, s.model, _server(s.server),
                datetime.fromtimestamp(s.started_wall_s).strftime("%Y-%m-%d %H:%M"), _duration(s),
                str(s.requests), _rate(s.mean_decode_tok_s), _rate(s.peak_decode_tok_s),
                "—" if pct is None else f"{pct:.0f}", ",".join(s.alerts) or "—",
            )
        )  # fmt: skip
    return _text_table(rows, numeric={5, 6, 7, 8})


def _last_benches(rows: list[dict[str, object]], last: int | None) -> list[dict[str, object]]:
    """The rows of the last `last` benches (a bench is one row per depth, sharing its start)."""
    starts = sorted({as_float(row.get("started_wall_s")) or 0.0 for row in rows})
    keep = set(starts[-last:]) if last else set(starts)
    return [row for row in rows if (as_float(row.get("started_wall_s")) or 0.0) in keep]


def _cell(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}"


def _build(row: dict[str, object]) -> str:
    """'llama.cpp b11434-3f2a9c1d8' (a bench stored before schema 9 has no engine: the build alone)."""
    version, kind = row.get("server_version"), row.get("server_kind")
    if not version:
        return "—"
    return f"{engine_label(kind)} {version}" if isinstance(kind, str) else str(version)


def format_bench(rows: Sequence[dict[str, object]]) -> str:
    """A plain-text table of stored bench results, one row per depth (start in local time)."""
    header = ("START", "MODEL", "QUANT", "HARDWARE", "DEPTH", "TOK/S", "CV %", "CEIL %", "TTFT S", "SERVER")
    table: list[tuple[str, ...]] = [header]
    for row in rows:
        started_wall_s = as_float(row.get("started_wall_s")) or 0.0
        started = datetime.fromtimestamp(started_wall_s).strftime("%Y-%m-%d %H:%M")
        keys = ("model", "quantization", "hardware", "depth_tokens")
        names = ["—" if row.get(key) is None else str(row.get(key)) for key in keys]
        numbers = [
            _cell(as_float(row.get("decode_tok_s"))),
            _cell(as_float(row.get("decode_cv")), 100.0),
            _cell(as_float(row.get("efficiency")), 100.0, 0),
            _cell(as_float(row.get("ttft_s")), digits=2),
        ]
        table.append((started, *names, *numbers, _build(row)))
    return _text_table(table, numeric={4, 5, 6, 7, 8})


def _run_bench_list(args: argparse.Namespace, since: float | None, last: int | None) -> int:
    from trayapp.sinks.store import StoreError

    try:
        with _open(args) as store:
            rows = _last_benches(list(store.iter_rows("bench", since_wall_s=since)), last)
    except StoreError as exc:
        return _fail("sessions", str(exc), 1)
    if getattr(args, "json", False):
        as_json = [{"time_utc": iso_utc(as_float(r.get("started_wall_s"))), **r} for r in rows]
        print(json.dumps(as_json, indent=2))
    elif not rows:
        print(f"no bench results stored yet: run `llm-tray bench` (store: {_store_path(args)})")
    else:
        print(terminal_safe(format_bench(rows)))
    return 0


def format_builds(groups: Sequence[BuildGroup]) -> str:
    """A plain-text table of sessions grouped by engine build (first and last in local time)."""
    header = ("ENGINE", "BUILD", "MODEL", "HARDWARE", "SESSIONS", "REQ", "MEAN TOK/S", "FIRST", "LAST")
    rows: list[tuple[str, ...]] = [header]
    for g in groups:
        when = [datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") for t in (g.first_wall_s, g.last_wall_s)]
        rows.append(
            (g.engine, g.build or "—", g.model, g.hardware or "—", str(g.sessions), str(g.requests),
             _rate(g.mean_decode_tok_s), *when)
        )  # fmt: skip
    return _text_table(rows, numeric={4, 5, 6})


def _run_build_list(args: argparse.Namespace, since: float | None, last: int | None) -> int:
    """The sessions asked for (--since, --last; default all) grouped by engine build."""
    from trayapp.sinks.store import StoreError

    try:
        with _open(args) as store:
            groups = sessions_by_build(store.sessions(since_wall_s=since, last_n=last))
    except StoreError as exc:
        return _fail("sessions", str(exc), 1)
    if getattr(args, "json", False):
        print(json.dumps([vars(g) for g in groups], indent=2))
    elif not groups:
        print(f"no sessions recorded yet (store: {_store_path(args)})")
    else:
        print(terminal_safe(format_builds(groups)))
    return 0


def _run_client_list(args: argparse.Namespace, since: float | None, last: int | None) -> int:
    """Requests per client over the sessions asked for (--since, --last; default all)."""
    from trayapp.core.client_usage import client_usage, client_usage_rows
    from trayapp.sinks.store import StoreError

    try:
        with _open(args) as store:
            ids = [s.id for s in store.sessions(since_wall_s=since, last_n=last)] if last else None
            usage = client_usage(store.iter_rows("requests", since_wall_s=since, session_ids=ids))
    except StoreError as exc:
        return _fail("sessions", str(exc), 1)
    if getattr(args, "json", False):
        print(json.dumps([{**vars(u), "queue_wait_mean_s": u.queue_wait_mean_s} for u in usage], indent=2))
    elif not usage:
        print(f"no requests recorded yet (store: {_store_path(args)})")
    else:
        print(terminal_safe(_text_table(client_usage_rows(usage), numeric={1, 2, 3, 4, 5, 6})))
    return 0


# --------------------------------------------------------------------------- commands


def run_sessions(args: argparse.Namespace) -> int:
    """List recorded sessions, oldest first (the last 20 unless --since or --last says otherwise)."""
    from trayapp.sinks.store import StoreError

    try:
        since = parse_since(args.since) if getattr(args, "since", None) else None
        last = _positive_last(getattr(args, "last", None))
    except UsageError as exc:
        return _fail("sessions", str(exc), 2)
    if getattr(args, "bench", False):
        return _run_bench_list(args, since, last)
    if getattr(args, "clients", False):
        return _run_client_list(args, since, last)
    if getattr(args, "by", None) == "build":
        return _run_build_list(args, since, last)
    if last is None and since is None:
        last = DEFAULT_SESSIONS_SHOWN
    try:
        with _open(args) as store:
            sessions = store.sessions(since_wall_s=since, last_n=last)
            benched = store.has_rows("bench")
    except StoreError as exc:
        return _fail("sessions", str(exc), 1)
    if getattr(args, "json", False):
        print(json.dumps([session_json(s) for s in sessions], indent=2))
    elif not sessions:
        print(f"no sessions recorded yet (store: {_store_path(args)})")
    else:
        print(terminal_safe(format_sessions(sessions)))
    if benched and not getattr(args, "json", False):
        print("bench results are stored too: llm-tray sessions --bench")
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Export requests, sessions or samples as CSV, JSON Lines or Parquet to a file or stdout."""
    from trayapp.sinks.store import StoreError

    try:
        since = parse_since(args.since) if getattr(args, "since", None) else None
        last = _positive_last(getattr(args, "last", None))
    except UsageError as exc:
        return _fail("export", str(exc), 2)
    output = getattr(args, "output", "-") or "-"
    try:
        with _open(args) as store:
            session_id = resolve_session(store, args.session) if getattr(args, "session", None) else None
            target = None if output == "-" else Path(output)
            result = export(
                store,
                table=getattr(args, "table", None),
                fmt=getattr(args, "format", "csv"),
                since_wall_s=since,
                session_id=session_id,
                last_n=last,
                out=target,
            )
    except (UsageError, ExportError) as exc:
        return _fail("export", str(exc), 2)
    except StoreError as exc:
        return _fail("export", str(exc), 1)
    except BrokenPipeError:  # `llm-tray export | head`: the reader left, that is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        return _fail("export", f"cannot write {output}: {exc.strerror or exc}", 1)
    if result.path is not None:
        print(f"wrote {result.rows} {result.table} rows to {result.path}", file=sys.stderr)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """Write the one-page HTML report of a session (default: the latest)."""
    from trayapp.sinks.report import ReportError, write_report
    from trayapp.sinks.store import StoreError

    try:
        with _open(args) as store:
            session_id = resolve_session(store, args.session) if getattr(args, "session", None) else None
            path = write_report(store, args.output, session_id=session_id)
    except UsageError as exc:
        return _fail("report", str(exc), 2)
    except ReportError as exc:
        return _fail("report", str(exc), 2 if getattr(args, "session", None) else 1)
    except StoreError as exc:
        return _fail("report", str(exc), 1)
    except OSError as exc:
        return _fail("report", f"cannot write {args.output}: {exc.strerror or exc}", 1)
    print(f"wrote {path}", file=sys.stderr)
    return 0
