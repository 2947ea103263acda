"""Bench results in the store (#13): the `bench` table, the bench baseline that wins over sessions,
the migration from schema 4, and `bench`'s own writer. Real SQLite files under tmp_path."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests.support.store_records import HARDWARE_LABEL as HW
from tests.support.store_records import T0, model, rows, session, snapshot
from tests.support.store_records import bench_result as result
from tests.support.store_records import sweep_point as point
from trayapp.cli.bench import store_baseline
from trayapp.config import paths
from trayapp.core.bench import BenchResult
from trayapp.sinks.store import Store, schema_version
from trayapp.sinks.store import schema as store_mod

KEY = {"model": "qwen3:8b", "quantization": "Q4_K_M", "hardware": HW}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite3"


def decoding_session(store: Store, sid: str, start: float, rate: float, context: int) -> None:
    """Five decoding samples at `rate` (±1) and `context`, then the ended session."""
    for i in range(5):
        tick = snapshot(
            start + i, (model(session_id=sid, decode_tok_s=rate + (i % 3) - 1, context_tokens=context),)
        )
        store.record(tick, [session(sid, started_wall_s=start, ended_wall_s=start + 5)] if i == 4 else [])


def test_a_bench_is_one_row_per_depth_with_its_numbers(db: Path) -> None:
    with Store(db) as store:
        written = store.record_bench(result(T0, (point(0, 60, 90.0, 120.0), point(8192, 8250, 60.0, 80.0))))
        assert written == 2
        got = rows(store, "bench")
    assert [(r["depth_tokens"], r["context_tokens"], r["decode_tok_s"], r["runs"]) for r in got] == [
        (0, 60, 90.0, 3),
        (8192, 8250, 60.0, 3),
    ]
    assert [r["efficiency"] for r in got] == [0.75, 0.75]  # 90 ÷ 120, 60 ÷ 80
    first = got[0]
    assert first["started_wall_s"] == T0 and first["finished_wall_s"] == T0 + 30
    assert (first["model"], first["quantization"], first["hardware"]) == ("qwen3:8b", "Q4_K_M", HW)
    assert first["server_version"] == "0.30.1" and first["spec_type"] is None
    assert first["server_kind"] == "ollama"  # schema 9 (#22): the engine the build is a build of
    assert first["judged"] == 1 and first["decode_exact"] == 1  # 0/1 in SQLite
    assert first["ttft_s"] == 0.25 and first["prompt_tok_s"] == 2048.0 and first["decode_cv"] == 0.02


def test_the_bench_table_holds_numbers_and_the_key_only(db: Path) -> None:
    with Store(db) as store:
        types = store.column_types("bench")
    text = {name for name, kind in types.items() if kind == "TEXT"}
    assert text == {"model", "quantization", "hardware", "server_kind", "server_version", "spec_type"}


def test_a_bench_baseline_wins_over_a_faster_session(db: Path) -> None:
    now = T0 + 86400
    with Store(db) as store:
        decoding_session(store, "fast", now - 3600, 100.0, 600)
        store.record_bench(result(now - 7200, (point(0, 60, 80.0, 120.0, runs=2),), version="0.29.0"))
        best = store.baseline(**KEY, context_tokens=500, before_wall_s=now)
    assert best is not None and best.source == "bench"
    assert best.decode_tok_s == 80.0 and best.context_tokens == 60 and best.server_version == "0.29.0"
    assert best.session_id is None and best.values == 2 and best.when_wall_s == now - 7200


def test_without_a_bench_the_session_baseline_is_used(db: Path) -> None:
    now = T0 + 86400
    with Store(db) as store:
        decoding_session(store, "fast", now - 3600, 100.0, 600)
        best = store.baseline(**KEY, context_tokens=500, before_wall_s=now)
    assert best is not None and best.source == "session" and best.session_id == "fast"
    assert best.decode_tok_s == 100.0  # median of 99, 100, 101, 99, 100


def test_the_bench_baseline_compares_like_with_like(db: Path) -> None:
    now = T0 + 86400
    with Store(db) as store:
        decoding_session(store, "plain", now - 3600, 100.0, 600)
        store.record_bench(result(now - 100, (point(0, 60, 150.0, 200.0),), spec_type="draft-mtp"))
        store.record_bench(result(now - 90, (point(0, 60, 50.0, 200.0),), hardware="RTX 3090 (936 GB/s)"))
        store.record_bench(result(now + 10, (point(0, 60, 40.0, 200.0),)))  # finished after `before`
        plain = store.baseline(**KEY, context_tokens=500, before_wall_s=now)
        drafted = store.baseline(**KEY, context_tokens=500, before_wall_s=now, spec_type="draft-mtp")
    assert plain is not None and plain.source == "session" and plain.decode_tok_s == 100.0
    assert drafted is not None and drafted.source == "bench" and drafted.decode_tok_s == 150.0
    assert drafted.spec_type == "draft-mtp"


def test_the_newest_bench_answers_at_its_closest_comparable_depth(db: Path) -> None:
    now = T0 + 86400
    with Store(db) as store:
        store.record_bench(result(now - 7200, (point(0, 60, 70.0, 120.0), point(8192, 8250, 45.0, 80.0))))
        store.record_bench(result(now - 3600, (point(0, 60, 90.0, 120.0), point(8192, 8250, 60.0, 80.0))))
        shallow = store.baseline(**KEY, context_tokens=300, before_wall_s=now)
        deep = store.baseline(**KEY, context_tokens=7000, before_wall_s=now)
        unknown = store.baseline(**KEY, context_tokens=None, before_wall_s=now)
        nothing = store.baseline(**KEY, context_tokens=30000, before_wall_s=now)  # beyond ±50 % of 8250
    assert shallow is not None and shallow.decode_tok_s == 90.0 and shallow.context_tokens == 60
    assert deep is not None and deep.decode_tok_s == 60.0 and deep.context_tokens == 8250
    assert unknown is not None and unknown.decode_tok_s == 90.0  # depth 0
    assert nothing is None


def test_a_new_bench_is_seen_at_once_despite_the_cache(db: Path) -> None:
    now = T0 + 86400
    with Store(db) as store:
        decoding_session(store, "s", now - 3600, 100.0, 600)
        before = store.baseline(**KEY, context_tokens=500, before_wall_s=now)
        store.record_bench(result(now - 100, (point(0, 60, 80.0, 120.0),)))
        after = store.baseline(**KEY, context_tokens=500, before_wall_s=now + 1)
    assert before is not None and before.source == "session"
    assert after is not None and after.source == "bench" and after.decode_tok_s == 80.0


def test_a_schema_4_store_gains_the_bench_table_and_keeps_its_rows(db: Path) -> None:
    raw = sqlite3.connect(db)  # the store as schema 4 wrote it
    for migration in store_mod.MIGRATIONS[:4]:
        migration(raw)
    raw.execute("PRAGMA user_version = 4")
    raw.execute(
        "INSERT INTO sessions (session_id, server, server_kind, model, started_wall_s, quantization, "
        "hardware, spec_type) "
        "VALUES ('old', 'http://127.0.0.1:11434', 'ollama', 'qwen3:8b', ?, 'Q4_K_M', ?, NULL)",
        (T0, HW),
    )
    raw.execute(
        "INSERT INTO samples (t_wall_s, session_id, server, server_kind, model, phase, decode_tok_s) "
        "VALUES (?, 'old', 'http://127.0.0.1:11434', 'ollama', 'qwen3:8b', 'decoding', 77.5)",
        (T0 + 1,),
    )
    raw.commit()
    raw.close()
    assert schema_version() >= 5  # the bench table came with 5
    with Store(db) as store:
        assert [s.id for s in store.sessions()] == ["old"]
        assert [r["decode_tok_s"] for r in rows(store, "samples")] == [77.5]
        assert rows(store, "bench") == []
        store.record_bench(result(T0 + 10, (point(0, 60, 90.0, 120.0),)))
        assert len(rows(store, "bench")) == 1
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == schema_version()
    raw.close()


def test_bench_stores_its_baseline_with_its_own_writer() -> None:
    stored, note = store_baseline(result(T0, (point(0, 60, 90.0, 120.0),)))
    assert stored and note is None
    with Store(paths.store_file(), writer=False) as store:
        assert [r["decode_tok_s"] for r in rows(store, "bench")] == [90.0]


def test_bench_says_so_when_the_tray_holds_the_store() -> None:
    with Store(paths.store_file()) as tray:  # another writer: the tray records
        stored, note = store_baseline(result(T0, (point(0, 60, 90.0, 120.0),)))
        assert not stored and note is not None
        assert "not stored as the baseline" in note and "another llm-tray process" in note
        assert rows(tray, "bench") == []


def test_nothing_is_stored_without_a_decode_rate() -> None:
    empty = result(T0, (point(0, 60, 90.0, 120.0),))
    stored, note = store_baseline(BenchResult(**{**empty.__dict__, "decode_tok_s": None}))
    assert not stored and note is not None and "no decode rate" in note
    assert not paths.store_file().exists()


def test_the_calibration_is_the_newest_judged_depth_0_efficiency(db: Path) -> None:
    now = T0 + 86400
    key = {"model": "qwen3:8b", "hardware": HW}
    with Store(db) as store:
        assert store.calibration(**key, before_wall_s=now) is None
        store.record_bench(result(now - 7200, (point(0, 60, 60.0, 120.0), point(8192, 8250, 20.0, 80.0))))
        assert store.calibration(**key, before_wall_s=now) == 0.5  # 60 ÷ 120; not the 8192 depth's 0.25
        store.record_bench(result(now - 3600, (point(0, 60, 90.0, 100.0),), verdict="not_judged"))
        assert (
            store.calibration(**key, before_wall_s=now + 1) == 0.5
        )  # a CPU or offloaded bench is no calibration
        store.record_bench(result(now - 1800, (point(0, 60, 81.0, 100.0),)))
        assert store.calibration(**key, before_wall_s=now + 2) == 0.81  # the newest judged one, seen at once
        assert store.calibration(model="qwen3:8b", hardware="RTX 3090 (936 GB/s)", before_wall_s=now) is None
        assert store.calibration(**key, before_wall_s=now - 7180) is None  # the first finished at now − 7170


def test_sessions_bench_lists_the_last_benches_and_export_writes_them(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import csv
    import io
    import json

    from trayapp.cli.logs import run_sessions
    from trayapp.sinks.export import ExportError, export

    with Store(db) as store:
        store.record_bench(result(T0, (point(0, 60, 90.0, 120.0), point(8192, 8250, 60.0, 80.0))))
        store.record_bench(result(T0 + 600, (point(0, 60, 88.0, 120.0),), version="0.31.0"))
    args = argparse.Namespace(store=str(db), since=None, last=1, json=True, bench=True)
    assert run_sessions(args) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["depth_tokens"], r["decode_tok_s"], r["server_version"]) for r in listed] == [
        (0, 88.0, "0.31.0")
    ]
    assert listed[0]["time_utc"].endswith("Z")
    args = argparse.Namespace(store=str(db), since=None, last=None, json=False, bench=True)
    assert run_sessions(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["START", "MODEL", "QUANT"] and len(lines) == 1 + 3  # 3 depths in all
    assert " 8192 " in lines[2] and "60.0" in lines[2] and " 75 " in lines[2]  # 60 ÷ 80 of the ceiling
    assert re.search(r"RAM\s+0\s+90\.0\s", lines[1]), lines[1]  # depth 0 (not "—"), then its rate
    # The plain session list points at them.
    args = argparse.Namespace(store=str(db), since=None, last=None, json=False, bench=False)
    assert run_sessions(args) == 0
    assert "llm-tray sessions --bench" in capsys.readouterr().out

    out = io.StringIO()
    with Store(db, writer=False) as store:
        done = export(store, table="bench", fmt="csv", out=out)
        with pytest.raises(ExportError, match="no session"):
            export(store, table="bench", last_n=1, out=io.StringIO())
    exported = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert done.rows == 3 and [r["decode_tok_s"] for r in exported] == ["90.0", "60.0", "88.0"]
    assert exported[0]["ceiling_pct"] == "75.0" and exported[0]["judged"] == "true"


def test_the_bench_rate_is_the_newest_benchs_depth_zero_decode_of_its_key(db: Path) -> None:
    with Store(db) as store:
        store.record_bench(result(T0, (point(0, 60, 90.0, 120.0), point(8192, 8250, 60.0, 80.0))))
        store.record_bench(result(T0 + 600, (point(0, 60, 85.0, 120.0),)))
        now = T0 + 3600
        assert store.bench_rate(**KEY, before_wall_s=now) == 85.0
        assert store.bench_rate(**KEY, before_wall_s=T0 + 300) == 90.0  # only the first had finished
        assert store.bench_rate(**{**KEY, "quantization": "Q8_0"}, before_wall_s=now) is None
        store.record_bench(result(T0 + 1200, (point(0, 60, 70.0, 120.0),)))  # a new bench clears the cache
        assert store.bench_rate(**KEY, before_wall_s=now) == 70.0


def test_stored_benches_list_their_engine_and_build(db: Path) -> None:
    """`sessions --bench` names the build with its engine ('Ollama 0.30.1'); a row stored before
    schema 9 (no engine) shows the build alone."""
    from trayapp.cli.logs import format_bench

    with Store(db) as store:
        store.record_bench(result(T0, (point(0, 60, 90.0, 120.0),)))
        got = rows(store, "bench")
    assert format_bench(got).splitlines()[1].endswith("Ollama 0.30.1")
    assert format_bench([{**got[0], "server_kind": None}]).splitlines()[1].endswith(" 0.30.1")


def test_schema_10_drops_a_measured_ram_bandwidth_from_cpu_labels_and_keeps_the_rest(db: Path) -> None:
    """Rows a schema 9 store kept under "CPU (system RAM) @ 20 GB/s" are found under the label the
    monitor asks for now ("CPU (system RAM)"); a GPU's label, whose bandwidth is a spec, is left."""
    raw = sqlite3.connect(db)
    for migration in store_mod.MIGRATIONS[:9]:
        migration(raw)
    raw.execute("PRAGMA user_version = 9")
    old_cpu, gpu = "CPU (system RAM) @ 20 GB/s", "NVIDIA GeForce RTX 4090 @ 1008 GB/s"
    for sid, label in (("cpu", old_cpu), ("gpu", gpu)):
        raw.execute(
            "INSERT INTO sessions (session_id, server, server_kind, model, started_wall_s, hardware) "
            "VALUES (?, 'http://127.0.0.1:8080', 'llamacpp', 'qwen3:8b', ?, ?)",
            (sid, T0, label),
        )
    raw.execute(
        "INSERT INTO bench (started_wall_s, finished_wall_s, model, quantization, hardware, depth_tokens, "
        "decode_tok_s, runs) VALUES (?, ?, 'qwen3:8b', 'Q4_K_M', ?, 0, 27.5, 3)",
        (T0, T0 + 30, old_cpu),
    )
    raw.commit()
    raw.close()
    with Store(db) as store:
        assert {r["session_id"]: r["hardware"] for r in rows(store, "sessions")} == {
            "cpu": "CPU (system RAM)",
            "gpu": gpu,
        }
        rate = store.bench_rate(
            model="qwen3:8b", quantization="Q4_K_M", hardware="CPU (system RAM)", before_wall_s=T0 + 60
        )
        assert rate == 27.5
