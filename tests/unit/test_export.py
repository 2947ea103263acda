"""Exports from a real SQLite store: CSV / JSONL / Parquet round trips, defaults, filters, privacy."""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.support.snapshots import hardware_snapshot, rtx4090
from tests.support.store_records import T0, snapshot
from trayapp.cli import logs
from trayapp.config import paths
from trayapp.core.model import (
    ModelStatus,
    RequestRecord,
    SessionRecord,
    Snapshot,
)
from trayapp.sinks.export import PARQUET_HINT, ExportError, export, export_columns, iso_utc
from trayapp.sinks.store import Store

URL = "http://127.0.0.1:8080"
HARDWARE = hardware_snapshot(
    rtx4090(
        name="RTX 4090",
        vram_total_bytes=24_000_000_000,
        vram_used_bytes=10_000_000_000,
        bandwidth_source="table",
    ),
    ram_available_bytes=32_000_000_000,
    ram_bandwidth_source="measured",
)

# Text a metrics row may carry: names, ids, kinds, enums. Anything else would be a leak.
ALLOWED_TEXT = {
    "time_utc", "ended_utc", "session_id", "server", "server_kind", "model", "phase", "source",
    "server_version", "quantization", "hardware", "alerts",
}  # fmt: skip


TTFT_EXACT = (True, False, None)  # server-reported, estimated, not known


def status(i: int, session_id: str, rate: float | None = None) -> ModelStatus:
    return ModelStatus(
        name="gemma3:270m",
        phase="decoding",
        decode_tok_s=rate if rate is not None else 70.0 + i * 0.125,
        decode_total_tok_s=70.0 + i * 0.125,
        active_streams=1,
        decode_exact=i % 2 == 0,
        prompt_tok_s=300.5,
        ttft_s=0.1 + i / 1000,
        ttft_exact=TTFT_EXACT[i % 3],
        context_tokens=100 + 10 * i,
        context_length=8192,
        ceiling_tok_s=200.0 - i * 0.5,
        full_gpu_ceiling_tok_s=210.0,
        gpu_fraction=1.0,
        vram_bytes=300_000_000 + i,
        draft_acceptance=None,
        session_id=session_id,
    )


def tick(t: float, models: tuple[ModelStatus, ...], requests: tuple[RequestRecord, ...] = ()) -> Snapshot:
    """One llama-server b6000 at URL on HARDWARE."""
    return snapshot(
        t, models, url=URL, kind="llamacpp", version="b6000", requests=requests, hardware=HARDWARE
    )


def request(t: float, session_id: str, i: int) -> RequestRecord:
    return RequestRecord(
        server=URL,
        server_kind="llamacpp",
        model="gemma3:270m",
        finished_wall_s=t,
        session_id=session_id,
        exact=True,
        prompt_tokens=6 + i,
        decode_tokens=128,
        context_tokens=134 + i,
        prompt_tok_s=412.25 + i,
        decode_tok_s=81.0625 - i,
        ttft_s=0.0146,
        load_s=None,
        ceiling_tok_s=217.5,
        gpu_fraction=0.0,
        draft_tokens=None,
        draft_accepted=None,
        source="server",
    )


def session(sid: str, start: float, end: float | None, **kw: object) -> SessionRecord:
    values: dict[str, object] = {
        "id": sid,
        "server": URL,
        "server_kind": "llamacpp",
        "model": "gemma3:270m",
        "started_wall_s": start,
        "ended_wall_s": end,
        "server_version": "b6000",
        "quantization": "Q4_K_M",
        "hardware": "CPU (54 GB/s RAM)",
        "requests": 3,
        "decode_tokens": 384,
        "mean_decode_tok_s": 80.0,
        "peak_decode_tok_s": 81.0625,
        "mean_prompt_tok_s": 413.0,
        "mean_ttft_s": 0.0146,
        "max_context_tokens": 140,
        "ceiling_tok_s": 200.0,
        "gpu_fraction": 0.0,
        "alerts": ("kv_slowdown",),
    }
    values.update(kw)
    return SessionRecord(**values)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Two sessions: `a` (10 samples, 3 requests) then `b` (5 samples, no request records)."""
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        for i in range(10):
            reqs = (request(T0 + i, "a", i),) if i in (3, 6, 9) else ()
            store.record(tick(T0 + i, (status(i, "a"),), reqs))
        store.record(tick(T0 + 10, ()), [session("a", T0, T0 + 10)])
        for i in range(5):
            store.record(tick(T0 + 100 + i, (status(i, "b", rate=50.0),)))
        store.record(tick(T0 + 105, ()), [session("b", T0 + 100, None, requests=0, alerts=())])
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_round_trip_keeps_the_numbers(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "requests.csv"
    with Store(db, writer=False) as store:
        result = export(store, table="requests", fmt="csv", out=out)
        columns = export_columns(store, "requests")
    assert result.rows == 3 and result.table == "requests" and result.path == out
    rows = read_csv(out)
    assert list(rows[0]) == columns and columns[0] == "time_utc"
    for row, i in zip(rows, (3, 6, 9), strict=True):
        expected = request(T0 + i, "a", i)
        assert float(row["finished_wall_s"]) == expected.finished_wall_s
        assert row["time_utc"] == iso_utc(T0 + i)
        assert float(row["decode_tok_s"]) == expected.decode_tok_s
        assert float(row["prompt_tok_s"]) == expected.prompt_tok_s
        assert float(row["ttft_s"]) == expected.ttft_s
        assert int(row["prompt_tokens"]) == expected.prompt_tokens
        assert int(row["context_tokens"]) == expected.context_tokens
        assert row["load_s"] == "" and row["exact"] == "true" and row["session_id"] == "a"
        assert float(row["ceiling_pct"]) == pytest.approx(100 * expected.decode_tok_s / 217.5)
    assert not list(tmp_path.glob("*.tmp"))  # no temp file left behind


def test_jsonl_round_trip_of_samples_keeps_the_numbers(db: Path) -> None:
    buffer = io.StringIO()
    with Store(db, writer=False) as store:
        result = export(store, table="samples", fmt="jsonl", session_id="a", out=buffer)
    assert result.rows == 10 and result.path is None
    rows = [json.loads(line) for line in buffer.getvalue().splitlines()]
    for i, row in enumerate(rows):
        m = status(i, "a")
        assert row["t_wall_s"] == T0 + i and row["time_utc"] == iso_utc(T0 + i)
        for field in (
            "decode_tok_s", "decode_total_tok_s", "ttft_s", "context_tokens", "ceiling_tok_s",
            "full_gpu_ceiling_tok_s", "gpu_fraction", "vram_bytes", "active_streams", "phase",
        ):  # fmt: skip
            assert row[field] == getattr(m, field), field
        assert row["decode_exact"] is (i % 2 == 0)
        assert row["ttft_exact"] is TTFT_EXACT[i % 3]
        assert row["draft_acceptance"] is None
        assert row["ceiling_pct"] == pytest.approx(100 * m.decode_tok_s / m.ceiling_tok_s)  # type: ignore[operator]


def test_csv_samples_carry_ttft_exact_as_true_false_or_empty(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "samples.csv"
    with Store(db, writer=False) as store:
        export(store, table="samples", fmt="csv", session_id="a", out=out)
        assert "ttft_exact" in export_columns(store, "samples")
    rows = read_csv(out)
    as_text = {True: "true", False: "false", None: ""}
    assert [row["ttft_exact"] for row in rows] == [as_text[TTFT_EXACT[i % 3]] for i in range(10)]
    assert [float(row["ttft_s"]) for row in rows] == [status(i, "a").ttft_s for i in range(10)]


def test_sessions_export_has_the_summary_columns(db: Path) -> None:
    buffer = io.StringIO()
    with Store(db, writer=False) as store:
        export(store, table="sessions", fmt="jsonl", out=buffer)
    a, b = (json.loads(line) for line in buffer.getvalue().splitlines())
    for key in ("model", "quantization", "server_kind", "server_version", "hardware", "max_context_tokens",
                "mean_prompt_tok_s", "mean_decode_tok_s", "mean_ttft_s", "ceiling_tok_s", "ceiling_pct",
                "gpu_fraction", "alerts", "duration_s", "time_utc", "ended_utc"):  # fmt: skip
        assert key in a, key
    assert a["session_id"] == "a" and a["duration_s"] == 10.0 and a["ceiling_pct"] == 40.0
    assert a["alerts"] == "kv_slowdown" and a["ended_utc"] == iso_utc(T0 + 10)
    assert b["ended_utc"] is None and b["duration_s"] is None  # still live


def test_the_default_table_is_requests_or_samples_when_there_are_none(db: Path) -> None:
    with Store(db, writer=False) as store:
        assert export(store, out=io.StringIO()).table == "requests"
        assert export(store, session_id="b", out=io.StringIO()).table == "samples"
        assert export(store, since_wall_s=T0 + 50, out=io.StringIO()).table == "samples"
    with Store(db.with_name("empty.sqlite3"), writer=False) as empty:
        result = export(empty, out=io.StringIO())
        assert result.table == "samples" and result.rows == 0


def test_filters_since_session_and_last_n(db: Path) -> None:
    with Store(db, writer=False) as store:
        assert export(store, table="samples", out=io.StringIO()).rows == 15
        assert export(store, table="samples", since_wall_s=T0 + 5, out=io.StringIO()).rows == 10
        assert export(store, table="samples", session_id="b", out=io.StringIO()).rows == 5
        assert export(store, table="samples", last_n=1, out=io.StringIO()).rows == 5
        assert export(store, table="samples", last_n=2, out=io.StringIO()).rows == 15
        assert export(store, table="sessions", since_wall_s=T0 + 50, out=io.StringIO()).rows == 1
        with pytest.raises(ExportError, match="unknown session 'zzz'"):
            export(store, session_id="zzz", out=io.StringIO())
        with pytest.raises(ExportError, match="unknown table"):
            export(store, table="hardware", out=io.StringIO())
        with pytest.raises(ExportError, match="unknown format"):
            export(store, fmt="xlsx", out=io.StringIO())


def test_a_binary_stream_gets_utf8_text(db: Path) -> None:
    raw = io.BytesIO()
    with Store(db, writer=False) as store:
        export(store, table="requests", fmt="csv", out=raw)
    assert not raw.closed  # the caller's stream stays open
    lines = raw.getvalue().decode("utf-8").splitlines()
    assert lines[0].startswith("time_utc,request_id,finished_wall_s,") and len(lines) == 4


def test_exports_carry_no_text_beyond_names_and_ids(db: Path) -> None:
    with Store(db, writer=False) as store:
        for table in ("requests", "samples", "sessions"):
            buffer = io.StringIO()
            export(store, table=table, fmt="jsonl", out=buffer)
            for line in buffer.getvalue().splitlines():
                row = json.loads(line)
                text_fields = {k for k, v in row.items() if isinstance(v, str)}
                assert text_fields <= ALLOWED_TEXT, (table, text_fields - ALLOWED_TEXT)


def test_parquet_without_pyarrow_says_how_to_get_it(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow → ImportError
    out = tmp_path / "x.parquet"
    with Store(db, writer=False) as store, pytest.raises(ExportError) as info:
        export(store, fmt="parquet", out=out)
    assert str(info.value) == PARQUET_HINT == "Parquet needs pyarrow: pip install 'llm-tray[parquet]'"
    assert not out.exists()


def test_parquet_round_trip(db: Path, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow", reason="pyarrow not installed (optional extra llm-tray[parquet])")
    import pyarrow.parquet as pq

    out = tmp_path / "samples.parquet"
    with Store(db, writer=False) as store:
        result = export(store, table="samples", fmt="parquet", out=out, batch=4)
    assert result.rows == 15
    table = pq.read_table(out)
    assert table.num_rows == 15
    assert str(table.schema.field("time_utc").type) == "timestamp[us, tz=UTC]"
    assert str(table.schema.field("decode_exact").type) == "bool"
    assert str(table.schema.field("ttft_exact").type) == "bool"
    assert str(table.schema.field("context_tokens").type) == "int64"
    rows = table.to_pylist()
    assert rows[0]["decode_tok_s"] == 70.0 and rows[3]["ttft_s"] == status(3, "a").ttft_s
    assert rows[0]["time_utc"].timestamp() == T0 and rows[-1]["session_id"] == "b"
    assert [r["ttft_exact"] for r in rows[:10]] == [TTFT_EXACT[i % 3] for i in range(10)]


# --------------------------------------------------------------------------- the CLI (trayapp.cli.logs)


def _cli(add: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


@pytest.fixture
def home_store(db: Path) -> Path:
    """The fixture store, where `paths.store_file()` looks (LLM_TRAY_HOME is per test)."""
    target = paths.store_file()
    shutil.copyfile(db, target)
    return target


def test_cli_export_writes_a_file_and_reports_it(
    home_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    args = _cli(logs.add_export_arguments, ["--format", "jsonl", "--session", "b", "-o", str(out)])
    assert logs.run_export(args) == 0
    assert len(out.read_text().splitlines()) == 5  # session b has samples only
    assert "wrote 5 samples rows" in capsys.readouterr().err


def test_cli_export_to_stdout_with_since(home_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    since = datetime.fromtimestamp(T0 + 5, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    args = _cli(logs.add_export_arguments, ["--table", "samples", "--since", since])
    assert logs.run_export(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("time_utc,") and len(lines) == 1 + 10


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "last tuesday"], "bad date 'last tuesday'"),
        (["--session", "zzz"], "unknown session 'zzz'"),
        (["--last", "0"], "--last needs a positive number"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    home_store: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert logs.run_export(_cli(logs.add_export_arguments, argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err.count("\n") == 1
        and message in captured.err
        and captured.err.startswith("llm-tray export")
    )


def test_cli_session_prefixes_resolve_when_unique(home_store: Path) -> None:
    with Store(home_store, writer=False) as store:
        assert logs.resolve_session(store, "a") == "a"
        with pytest.raises(logs.UsageError, match="unknown session"):
            logs.resolve_session(store, "c")


def test_cli_sessions_table_and_json(home_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert logs.run_sessions(_cli(logs.add_sessions_arguments, [])) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["ID", "MODEL", "SERVER"]
    assert table[1].split()[0] == "a" and "40" in table[1].split() and "kv_slowdown" in table[1]
    assert table[2].split()[0] == "b" and "live" in table[2]

    assert logs.run_sessions(_cli(logs.add_sessions_arguments, ["--json", "--last", "1"])) == 0
    (only,) = json.loads(capsys.readouterr().out)
    assert (
        only["session_id"] == "b" and only["ended_utc"] is None and only["started_utc"] == iso_utc(T0 + 100)
    )


def test_cli_sessions_on_a_fresh_install(capsys: pytest.CaptureFixture[str]) -> None:
    assert logs.run_sessions(_cli(logs.add_sessions_arguments, [])) == 0
    assert "no sessions recorded yet" in capsys.readouterr().out
    assert not paths.store_file().exists()  # reading never creates the store
