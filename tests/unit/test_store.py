"""The SQLite session log, on real SQLite files under tmp_path."""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.support.store_records import HARDWARE, T0, model, rows, session, snapshot
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import Alert, RequestRecord
from trayapp.core.redact import redact_url
from trayapp.sinks.store import Store, StoreError, StoreLockedError, schema_version
from trayapp.sinks.store import opening as store_opening
from trayapp.sinks.store import rows as store_rows
from trayapp.sinks.store import schema as store_mod


def request(t: float, session_id: str = "s1", **kw: object) -> RequestRecord:
    values: dict[str, object] = {
        "server": "http://127.0.0.1:11434",
        "server_kind": "ollama",
        "model": "qwen3:8b",
        "finished_wall_s": t,
        "session_id": session_id,
        "exact": True,
        "prompt_tokens": 512,
        "decode_tokens": 300,
        "context_tokens": 812,
        "prompt_tok_s": 900.5,
        "decode_tok_s": 77.75,
        "ttft_s": 0.569,
        "load_s": 1.5,
        "ceiling_tok_s": 121.0,
        "gpu_fraction": 1.0,
        "draft_tokens": 40,
        "draft_accepted": 25,
        "source": "server",
    }
    values.update(kw)
    return RequestRecord(**values)  # type: ignore[arg-type]


def alert(aid: str = "a1", **kw: object) -> Alert:
    values: dict[str, object] = {
        "id": aid,
        "kind": "offload",
        "severity": "warning",
        "server": "http://127.0.0.1:11434",
        "model": "qwen3:8b",
        "message": "27% of the model is in system RAM",
        "fix": "use Q3_K_M or a 4096-token context",
        "since_wall_s": T0 + 5,
        "evidence": {"cpu_share": 0.27, "full_gpu_tok_s": 130.0, "split_tok_s": 21.5},
        "cause": "context raised to 32768",
        "peak": 0.27,
    }
    values.update(kw)
    return Alert(**values)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite3"


# --------------------------------------------------------------------------- schema


def test_new_store_is_wal_with_current_schema_and_tables(db: Path) -> None:
    with Store(db):
        raw = sqlite3.connect(db)
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == schema_version() >= 1
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"samples", "requests", "sessions", "hardware", "alerts"} <= tables
        raw.close()


def test_no_column_can_hold_prompt_or_completion_text(db: Path) -> None:
    allowed_text = {
        "session_id", "server", "server_kind", "model", "phase", "source", "server_version", "quantization",
        "hardware", "alerts", "gpu_names", "gpu_bandwidth_source", "ram_bandwidth_source", "gpu_reason",
        "gpus_json", "alert_id", "kind", "severity", "message", "fix", "cause", "evidence_json",
        "endpoint",  # an API path without its query (the proxy records "/v1/chat/completions", never a body)
        "spec_type",  # a kind of speculative decoding ("draft-mtp"), from the server
        "stop_reason",  # why an answer ended: one of core.model.StopReason ("stop", "length", …)
        "fix_commands_json",  # an alert's fix as commands to copy (flags, env), written by llm-tray
        "energy_source", "energy_reason",  # where a request's energy was read, or why not (llm-tray's words)
        "client_name",  # a client process's name ("aider") or its User-Agent product token, never a body
    }  # fmt: skip
    with Store(db) as store:
        for table in store_mod.TABLES:
            for name, kind in store.column_types(table).items():
                if any(word in name for word in ("prompt", "completion", "content", "text")):
                    assert kind in ("INTEGER", "REAL"), f"{table}.{name}"  # counts and rates only
                if kind == "TEXT":
                    assert name in allowed_text, f"{table}.{name}"


def test_an_older_schema_is_migrated_and_keeps_its_data(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(db) as store:
        store.record(snapshot(T0, (model(),)), [session()])

    def migration_2(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE samples ADD COLUMN kv_type TEXT")
        conn.execute("UPDATE samples SET kv_type = 'f16'")

    released = schema_version()
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, migration_2])
    assert schema_version() == released + 1
    with Store(db) as store:
        assert "kv_type" in store.columns("samples")
        (sample,) = rows(store, "samples")
        assert sample["kv_type"] == "f16" and sample["decode_tok_s"] == 81.25
        assert [s.id for s in store.sessions()] == ["s1"]
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == released + 1
    raw.close()


def test_a_failing_migration_rolls_back_and_keeps_the_old_version(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store(db).close()
    released = schema_version()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise sqlite3.OperationalError("boom")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, broken])
    with pytest.raises(StoreError, match="boom"):
        Store(db)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == released
    assert raw.execute("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0] == 0
    raw.close()


def test_a_schema_1_store_gains_ttft_exact_and_keeps_its_rows(db: Path) -> None:
    raw = sqlite3.connect(db)  # the store as the first release wrote it: migration 1 only
    store_mod._migration_1(raw)
    raw.execute("PRAGMA user_version = 1")
    raw.execute(
        "INSERT INTO samples (t_wall_s, session_id, server, server_kind, model, phase, decode_tok_s, ttft_s) "
        "VALUES (?, 's1', 'http://127.0.0.1:11434', 'ollama', 'qwen3:8b', 'decoding', 81.25, 0.318)",
        (T0,),
    )
    raw.commit()
    raw.close()

    with Store(db, writer=False) as reader:  # a reader reads an old store as it is, never migrates it
        assert "ttft_exact" not in reader.columns("samples")
        assert [r["decode_tok_s"] for r in rows(reader, "samples")] == [81.25]

    with Store(db) as store:
        assert store.columns("samples")[-1] == "ttft_exact"
        assert store.column_types("samples")["ttft_exact"] == "INTEGER"
        (old,) = rows(store, "samples")
        assert old["t_wall_s"] == T0 and old["decode_tok_s"] == 81.25 and old["ttft_s"] == 0.318
        assert old["ttft_exact"] is None  # not known for rows recorded before migration 2
        snap = snapshot(
            T0 + 1,
            (model("a", ttft_exact=True), model("b", ttft_exact=False), model("c", ttft_exact=None)),
        )
        assert store.record(snap) is None
        new = {r["model"]: r["ttft_exact"] for r in rows(store, "samples", since_wall_s=T0 + 1)}
        assert new == {"a": 1, "b": 0, "c": None}
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == schema_version() == len(store_mod.MIGRATIONS)
    assert raw.execute("SELECT count(*) FROM samples").fetchone()[0] == 4
    raw.close()


def test_an_empty_version_0_file_is_initialised(db: Path) -> None:
    sqlite3.connect(db).close()  # a zero-length file: valid SQLite, no schema
    with Store(db) as store:
        assert store.record(snapshot(T0, (model(),))) is None
        assert len(rows(store, "samples")) == 1


def test_a_store_from_a_newer_version_is_refused_by_name(db: Path) -> None:
    Store(db).close()
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(StoreError, match=r"newer llm-tray \(schema 99") as info:
        Store(db)
    assert str(db) in str(info.value)


# --------------------------------------------------------------------------- record / read back


def test_record_and_read_back_the_same_numbers(db: Path) -> None:
    with Store(db) as store:
        req = request(T0 + 0.5)
        al = alert()
        snap = snapshot(T0 + 1, (model(),), requests=(req,), alerts=(al,))
        assert store.record(snap, [session()]) is None
        assert store.last_error is None

        (sample,) = rows(store, "samples")
        m = model()
        for field in (
            "decode_tok_s", "decode_total_tok_s", "active_streams", "prompt_tok_s", "ttft_s",
            "context_tokens", "context_length", "ceiling_tok_s", "full_gpu_ceiling_tok_s", "gpu_fraction",
            "vram_bytes", "draft_acceptance", "phase", "session_id",
        ):  # fmt: skip
            assert sample[field] == getattr(m, field), field
        assert sample["t_wall_s"] == T0 + 1
        assert (
            sample["decode_exact"] == 0
            and sample["ttft_exact"] == 1
            and sample["server_kind"] == "ollama"
            and sample["model"] == "qwen3:8b"
        )

        (stored_req,) = rows(store, "requests")
        for field in (
            "finished_wall_s", "session_id", "server", "server_kind", "model", "prompt_tokens",
            "decode_tokens", "context_tokens", "prompt_tok_s", "decode_tok_s", "ttft_s", "load_s",
            "ceiling_tok_s", "gpu_fraction", "draft_tokens", "draft_accepted", "source",
        ):  # fmt: skip
            assert stored_req[field] == getattr(req, field), field
        assert stored_req["exact"] == 1

        assert store.sessions() == [session()]

        (hw,) = rows(store, "hardware")
        assert hw["gpu_names"] == "NVIDIA GeForce RTX 4090" and hw["gpu_count"] == 1
        assert hw["vram_total_bytes"] == 25_757_220_864 and hw["vram_used_bytes"] == 20_000_000_000
        assert hw["gpu_bandwidth_gbps"] == 1008.0 and hw["gpu_bandwidth_source"] == "nvml"
        assert hw["ram_bandwidth_gbps"] == 54.2 and hw["ram_bandwidth_source"] == "measured"

        (stored_alert,) = store.alerts_between(T0, None)
        assert stored_alert["alert_id"] == "a1" and stored_alert["kind"] == "offload"
        assert stored_alert["evidence"] == {"cpu_share": 0.27, "full_gpu_tok_s": 130.0, "split_tok_s": 21.5}
        assert stored_alert["ended_wall_s"] is None and stored_alert["cause"] == "context raised to 32768"


def test_every_column_is_written_by_name(db: Path) -> None:
    """Each row builder names every column of its table (bar the rowid alias): none NULL by omission."""
    server = snapshot(T0).servers[0]
    built = {
        "samples": store_rows.sample_row(T0, server, model()),
        "requests": store_rows.request_row(request(T0)),
        "sessions": store_rows.session_row(session()),
        "hardware": store_rows.hardware_row(T0, HARDWARE),
        "alerts": store_rows.alert_row(alert()),
    }
    with Store(db) as store:
        for table, row in built.items():
            assert set(row) == set(store.columns(table)) - {"request_id"}, table


def test_a_reader_sees_what_the_writer_committed_while_it_runs(db: Path) -> None:
    with Store(db) as writer:
        writer.record(snapshot(T0, (model(),)), [session()])
        reader = Store(db, writer=False)
        try:
            assert [s.id for s in reader.sessions()] == ["s1"]
            writer.record(snapshot(T0 + 1, (model(),)), [session("s2", started_wall_s=T0 + 1)])
            assert [s.id for s in reader.sessions()] == ["s1", "s2"]
            assert len(rows(reader, "samples")) == 2
            with pytest.raises(StoreError, match="read-only"):
                reader.record(snapshot(T0 + 2))
        finally:
            reader.close()


def test_a_reader_of_a_missing_store_reads_empty_and_creates_nothing(db: Path) -> None:
    with Store(db, writer=False) as reader:
        assert reader.sessions() == []
        assert rows(reader, "samples") == []
        assert "decode_tok_s" in reader.columns("samples")
    assert not db.exists()


def test_samples_are_bounded_to_one_per_interval_per_model(db: Path) -> None:
    with Store(db, sample_interval_s=1.0) as store:
        for i in range(40):  # 10 s of ticks every 0.25 s, two models
            t = T0 + i * 0.25
            store.record(snapshot(t, (model("a"), model("b"))))
        samples = rows(store, "samples")
        for name in ("a", "b"):
            times = [r["t_wall_s"] for r in samples if r["model"] == name]
            assert len(times) == 10
            assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))


def test_idle_models_are_sampled_slowly_but_a_phase_change_is_kept(db: Path) -> None:
    with Store(db, sample_interval_s=1.0, idle_sample_interval_s=60.0) as store:
        for i in range(10):
            store.record(snapshot(T0 + i, (model(phase="decoding"),)))
        for i in range(10, 130):
            store.record(snapshot(T0 + i, (model(phase="idle", decode_tok_s=None),)))
        phases = [(r["t_wall_s"] - T0, r["phase"]) for r in rows(store, "samples")]
        assert phases[:10] == [(float(i), "decoding") for i in range(10)]
        # The switch to idle is kept at once, then one idle sample a minute.
        assert phases[10:] == [(10.0, "idle"), (70.0, "idle")]


def test_hardware_is_recorded_once_a_minute_or_on_change(db: Path) -> None:
    with Store(db) as store:
        for i in range(120):
            store.record(snapshot(T0 + i))
        assert [r["t_wall_s"] - T0 for r in rows(store, "hardware")] == [0.0, 60.0]
        other = HardwareSnapshot(gpus=(), host=HARDWARE.host, gpu_reason="NVML library not found")
        store.record(snapshot(T0 + 121, hardware=other))
        last = rows(store, "hardware")[-1]
        assert last["gpu_count"] == 0 and last["gpu_reason"] == "NVML library not found"


def test_sessions_are_upserted_by_id(db: Path) -> None:
    with Store(db) as store:
        store.record(snapshot(T0), [session("s1"), session("s2", started_wall_s=T0 + 100)])
        store.record(snapshot(T0 + 200), [session("s1", ended_wall_s=T0 + 150, requests=7, alerts=())])
        sessions = store.sessions()
        assert [s.id for s in sessions] == ["s1", "s2"]
        assert sessions[0].ended_wall_s == T0 + 150 and sessions[0].requests == 7 and sessions[0].alerts == ()
        assert sessions[1].alerts == ("kv_slowdown", "context_full")
        assert [s.id for s in store.sessions(last_n=1)] == ["s2"]
        assert [s.id for s in store.sessions(session_id="s1")] == ["s1"]
        assert store.sessions(session_id="nope") == []
        assert [s.id for s in store.sessions(since_wall_s=T0 + 160)] == ["s2"]  # s1 ended before


def test_alerts_are_written_on_change_and_closed_when_ended(db: Path) -> None:
    with Store(db) as store:
        store.record(snapshot(T0, alerts=(alert(peak=0.2),)))
        store.record(snapshot(T0 + 1, alerts=(alert(peak=0.2),)))
        store.record(snapshot(T0 + 2, alerts=(alert(peak=0.4),)))
        store.record(snapshot(T0 + 3, ended=(alert(peak=0.4, ended_wall_s=T0 + 3),)))
        (stored,) = store.alerts_between(T0, T0 + 10, server="http://127.0.0.1:11434", model="qwen3:8b")
        assert stored["peak"] == 0.4 and stored["ended_wall_s"] == T0 + 3
        assert store.alerts_between(T0 + 4, None) == []


def test_urls_are_stored_without_passwords_or_query_values(db: Path) -> None:
    # One redaction rule for every view (#9): credentials, query and fragment go.
    assert redact_url("http://bob:s3cret@box:8080/v1?api_key=abc&x=1") == "http://box:8080/v1"
    assert redact_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    with Store(db) as store:
        store.record(snapshot(T0, (model(),), url="http://bob:s3cret@box:8080?token=abc"))
        (sample,) = rows(store, "samples")
        assert "s3cret" not in str(sample["server"]) and "abc" not in str(sample["server"])
        files = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
        assert files and all(b"s3cret" not in p.read_bytes() for p in files)


# --------------------------------------------------------------------------- baseline


def _decoding_session(
    store: Store, sid: str, start: float, rate: float, context: int, **session_kw: object
) -> None:
    ticks = [
        snapshot(start + i, (model(session_id=sid, decode_tok_s=rate + (i % 3) - 1, context_tokens=context),))
        for i in range(5)
    ]
    for tick in ticks[:-1]:
        store.record(tick)
    store.record(ticks[-1], [session(sid, started_wall_s=start, ended_wall_s=start + 5, **session_kw)])


def test_baseline_is_the_typical_comparable_session(db: Path) -> None:
    """Of the comparable sessions (estimates only here), the median one: 70, 75, 80 → 75."""
    now = T0 + 10 * 86400
    with Store(db, retention_days=365) as store:
        _decoding_session(store, "good", now - 3 * 86400, 80.0, 600, server_version="0.29.0")
        _decoding_session(store, "slower", now - 2 * 86400, 70.0, 700, server_version="0.30.0")
        _decoding_session(store, "typical", now - 1.5 * 86400, 75.0, 650, server_version="0.30.1")
        _decoding_session(store, "other-gpu", now - 86400, 95.0, 600, hardware="RTX 3090 (936 GB/s)")
        _decoding_session(store, "other-quant", now - 86400, 99.0, 600, quantization="Q8_0")
        _decoding_session(store, "deep", now - 86400, 90.0, 16000)
        _decoding_session(store, "ancient", now - 60 * 86400, 120.0, 600)
        _decoding_session(store, "current", now - 100, 150.0, 600)
        common = {
            "model": "qwen3:8b",
            "quantization": "Q4_K_M",
            "hardware": "RTX 4090 (1008 GB/s) + 54 GB/s RAM",
            "before_wall_s": now,
            "exclude_session": "current",
        }
        typical = store.baseline(context_tokens=500, **common)  # type: ignore[arg-type]
        assert typical is not None and not typical.exact
        assert typical.session_id == "typical" and typical.decode_tok_s == 75.0
        assert typical.server_version == "0.30.1"
        assert (
            typical.context_tokens == 650 and typical.values == 5 and typical.when_wall_s == now - 1.5 * 86400
        )

        deep = store.baseline(context_tokens=14000, **common)  # type: ignore[arg-type]
        assert deep is not None and deep.session_id == "deep"  # 16000 is within ±50 % of 14000
        assert store.baseline(context_tokens=4000, **common) is None  # type: ignore[arg-type]
        assert store.baseline(**{**common, "model": "llama3"}, context_tokens=500) is None  # type: ignore[arg-type]


def test_of_two_sessions_the_slower_is_the_baseline(db: Path) -> None:
    """One lucky fast session is no yardstick: of 80 and 70 tok/s, 70."""
    now = T0 + 10 * 86400
    with Store(db, retention_days=365) as store:
        _decoding_session(store, "fast", now - 3 * 86400, 80.0, 600)
        _decoding_session(store, "slow", now - 2 * 86400, 70.0, 600)
        found = store.baseline(
            model="qwen3:8b",
            quantization="Q4_K_M",
            hardware="RTX 4090 (1008 GB/s) + 54 GB/s RAM",
            context_tokens=600,
            before_wall_s=now,
        )
    assert found is not None and found.session_id == "slow" and found.decode_tok_s == 70.0


def test_baseline_uses_request_records_too(db: Path) -> None:
    with Store(db) as store:
        reqs = tuple(
            request(T0 + i, session_id="r", decode_tok_s=60.0 + i, context_tokens=300) for i in range(3)
        )
        store.record(snapshot(T0 + 3, requests=reqs), [session("r", ended_wall_s=T0 + 3)])
        best = store.baseline(
            model="qwen3:8b",
            quantization="Q4_K_M",
            hardware="RTX 4090 (1008 GB/s) + 54 GB/s RAM",
            context_tokens=200,
            before_wall_s=T0 + 100,
            exclude_session=None,
        )
        assert best is not None and best.session_id == "r" and best.decode_tok_s == 61.0 and best.exact


def test_exact_figures_come_before_estimates(db: Path) -> None:
    """A session's one exact request (server timings) is its figure, not its polled samples around it;
    a session with exact figures wins over a newer one with estimates only; two estimates are too few."""
    now = T0 + 10 * 86400
    query = {
        "model": "qwen3:8b",
        "quantization": "Q4_K_M",
        "hardware": "RTX 4090 (1008 GB/s) + 54 GB/s RAM",
        "context_tokens": 600,
    }
    with Store(db, retention_days=365) as store:
        for i in range(2):  # two polled estimates: too few for a baseline
            store.record(
                snapshot(
                    now - 3 * 86400 + i, (model(session_id="two", decode_tok_s=200.0, context_tokens=600),)
                ),
                [session("two", started_wall_s=now - 3 * 86400, ended_wall_s=now - 3 * 86400 + i)],
            )
        assert store.baseline(**query, before_wall_s=now - 2.5 * 86400) is None  # type: ignore[arg-type]
        # an exact session: polled samples at 40 (a poll's noise) around one exact request at 60
        start = now - 2 * 86400
        for i in range(4):
            store.record(
                snapshot(start + i, (model(session_id="exact", decode_tok_s=40.0, context_tokens=600),))
            )
        store.record(
            snapshot(
                start + 4,
                requests=(request(start + 4, session_id="exact", decode_tok_s=60.0, context_tokens=600),),
            ),
            [session("exact", started_wall_s=start, ended_wall_s=start + 4)],
        )
        _decoding_session(store, "newer-estimates", now - 86400, 100.0, 600)
        found = store.baseline(**query, before_wall_s=now)  # type: ignore[arg-type]
    assert found is not None and found.exact
    assert found.session_id == "exact" and found.decode_tok_s == 60.0 and found.values == 1


def test_a_polled_whole_request_comes_before_the_polled_ticks(db: Path) -> None:
    """No exact figure: the session's one polled request (its rate over the whole decode, 52) is its
    figure, not the median of the ticks around it (a busy host's dips: 30, 35, 40, 45, 50 → 40); a
    session with ticks only still needs three of them."""
    query = {
        "model": "qwen3:8b",
        "quantization": "Q4_K_M",
        "hardware": "RTX 4090 (1008 GB/s) + 54 GB/s RAM",
        "context_tokens": 600,
    }
    with Store(db, retention_days=365) as store:
        for i, rate in enumerate((30.0, 35.0, 40.0, 45.0, 50.0)):
            store.record(
                snapshot(T0 + i, (model(session_id="polled", decode_tok_s=rate, context_tokens=600),))
            )
        whole = request(T0 + 5, session_id="polled", decode_tok_s=52.0, context_tokens=600, exact=False)
        store.record(
            snapshot(T0 + 5, requests=(whole,)), [session("polled", started_wall_s=T0, ended_wall_s=T0 + 5)]
        )
        found = store.baseline(**query, before_wall_s=T0 + 100)  # type: ignore[arg-type]
    assert found is not None and not found.exact
    assert found.session_id == "polled" and found.decode_tok_s == 52.0 and found.values == 1


def test_the_next_writer_ends_the_sessions_a_dead_one_left_open(db: Path) -> None:
    """A writer killed mid-session leaves it open; the next writer ends it at the last moment recorded
    of it (its newest sample or request, whichever is later), and its open alerts at the last moment
    it recorded anything; a reader changes nothing."""
    with Store(db) as store:
        store.record(
            snapshot(T0 + 1, (model(session_id="s1"),), alerts=(alert("a1", since_wall_s=T0 + 1),)),
            [session("s1")],
        )
        store.record(snapshot(T0 + 2, (model(session_id="s1"),)))
        store.record(snapshot(T0 + 4, requests=(request(T0 + 4.5, session_id="s1"),)))
        store.record(snapshot(T0 + 5, (model(session_id="s2"),)), [session("s2", started_wall_s=T0 + 5)])
        store.record_stop([session("s3", started_wall_s=T0 + 6)])  # nothing recorded of it
    with Store(db, writer=False) as reader:
        assert [s.ended_wall_s for s in reader.sessions()] == [None, None, None]
        assert [a["ended_wall_s"] for a in reader.alerts_between(T0, T0 + 10)] == [None]
    with Store(db) as store:
        ended = {s.id: s.ended_wall_s for s in store.sessions()}
        (stored_alert,) = store.alerts_between(T0, T0 + 10)
    assert ended == {"s1": T0 + 4.5, "s2": T0 + 5, "s3": T0 + 6}
    assert stored_alert["ended_wall_s"] == T0 + 5  # the newest sample


def test_a_writer_that_cannot_end_them_still_opens_and_records(
    db: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ending what a dead writer left open fails as a full disk fails an UPDATE (an OperationalError):
    the writer says so and opens all the same; the sessions stay open, nothing is lost."""
    with Store(db) as store:
        store.record(snapshot(T0 + 1, (model(session_id="s1"),)), [session("s1")])
    monkeypatch.setattr(store_opening, "_END_ORPHANED_SESSIONS_SQL", "UPDATE no_such_table SET x = 1")
    with Store(db) as store:
        assert store.record(snapshot(T0 + 2, (model(session_id="s1"),))) is None
        assert [s.ended_wall_s for s in store.sessions()] == [None]
    assert "could not end what a stopped writer left open" in caplog.text


def test_baseline_answers_are_cached_for_a_minute(db: Path) -> None:
    query = {
        "model": "qwen3:8b",
        "quantization": "Q4_K_M",
        "hardware": "RTX 4090 (1008 GB/s) + 54 GB/s RAM",
        "context_tokens": 600,
        "exclude_session": None,
    }
    with Store(db) as store:
        _decoding_session(store, "first", T0, 80.0, 600)
        found = store.baseline(before_wall_s=T0 + 100, **query)  # type: ignore[arg-type]
        assert found is not None and found.session_id == "first"
        _decoding_session(store, "slower", T0 + 10, 65.0, 600)  # of two, the slower is the baseline
        cached = store.baseline(before_wall_s=T0 + 130, **query)  # type: ignore[arg-type]
        assert cached is not None and cached.session_id == "first"  # the monitor asks every tick: cached
        fresh = store.baseline(before_wall_s=T0 + 161, **query)  # type: ignore[arg-type]
        assert fresh is not None and fresh.session_id == "slower" and fresh.when_wall_s == T0 + 10


# --------------------------------------------------------------------------- bounds


def test_prune_applies_the_retention(db: Path) -> None:
    day = 86400.0
    with Store(db, retention_days=7) as store:
        old, new = T0, T0 + 10 * day
        store.record(snapshot(old, (model(session_id="old"),), requests=(request(old, "old"),)), [
            session("old", started_wall_s=old, ended_wall_s=old + 60)
        ])  # fmt: skip
        store.record(snapshot(new, (model(session_id="new"),), requests=(request(new, "new"),)), [
            session("new", started_wall_s=new)
        ])  # fmt: skip
        assert len(rows(store, "samples")) == 1  # record() pruned the old tick on its way (first prune)
        store.prune(new)
        assert [r["session_id"] for r in rows(store, "samples")] == ["new"]
        assert [r["session_id"] for r in rows(store, "requests")] == ["new"]
        assert [s.id for s in store.sessions()] == ["new"]
        assert [r["t_wall_s"] for r in rows(store, "hardware")] == [new]


def test_prune_keeps_the_store_under_its_size_cap_dropping_oldest_samples_first(db: Path) -> None:
    cap = 400 * 1024
    with Store(db, max_size_bytes=None) as store:
        models = tuple(model(f"m{i}") for i in range(40))
        for i in range(150):  # 6000 samples, well over the cap
            store.record(snapshot(T0 + i, models))
        store.record(snapshot(T0 + 150, requests=tuple(request(T0 + 150 + i) for i in range(5))))
        before = len(rows(store, "samples"))
        assert before == 6000 and store.size_bytes() > cap
        store.max_size_bytes = cap
        deleted = store.prune(T0 + 200)
        assert deleted > 0 and store.size_bytes() <= cap
        kept = [r["t_wall_s"] for r in rows(store, "samples")]
        assert 0 < len(kept) < before
        assert kept[-1] == T0 + 149 and min(kept) > T0  # the newest stay, the oldest went
        assert len(rows(store, "requests")) == 5  # samples go first
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert db.stat().st_size <= cap * 1.1  # pages given back to the file system


# --------------------------------------------------------------------------- one writer


def test_a_second_writer_is_refused_while_a_reader_works(db: Path) -> None:
    with Store(db) as first:
        first.record(snapshot(T0, (model(),)), [session()])
        with pytest.raises(StoreLockedError) as info:
            Store(db)
        message = str(info.value)
        assert f"pid {os.getpid()}" in message and str(db) in message and "already recording" in message
        with Store(db, writer=False) as reader:
            assert [s.id for s in reader.sessions()] == ["s1"]
    with Store(db) as again:  # the lock goes with the first writer
        assert again.record(snapshot(T0 + 1, (model(),))) is None


# --------------------------------------------------------------------------- failures


def test_a_full_store_keeps_the_monitor_alive_and_says_why(db: Path) -> None:
    with Store(db) as store:
        assert store.record(snapshot(T0), [session()]) is None
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")  # the "disk" is now full
        crowd = tuple(model(f"m{i}", session_id="s1") for i in range(300))
        error = store.record(snapshot(T0 + 1, crowd), [session(requests=9)])
        assert error is not None and "full" in error and str(db) in error
        assert store.last_error == error
        # It kept what it could: the session update is in, this tick's samples are not.
        assert store.sessions()[0].requests == 9
        assert len(rows(store, "samples")) == 0
        # Space comes back: recording resumes and the error clears.
        store._conn.execute(f"PRAGMA max_page_count = {pages * 100}")
        assert store.record(snapshot(T0 + 2, crowd)) is None
        assert store.last_error is None and len(rows(store, "samples")) == 300


def test_a_tick_with_nothing_to_write_does_not_clear_a_full_stores_error(db: Path) -> None:
    """An idle monitor on a full disk: the ticks between two failed writes write nothing (no sample
    due, hardware unchanged within its minute), which proves nothing: the error stands until a
    write succeeds (it used to flap to 'recording again' and back)."""
    with Store(db) as store:
        assert store.record(snapshot(T0), [session()]) is None
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        crowd = tuple(model(f"m{i}", session_id="s1") for i in range(300))
        error = store.record(snapshot(T0 + 1, crowd), [session(requests=9)])
        assert error is not None and "full" in error
        assert store.record(snapshot(T0 + 2)) == error  # nothing due: no sample, no hardware, no session
        assert store.last_error == error
        store._conn.execute(f"PRAGMA max_page_count = {pages * 100}")
        assert store.record(snapshot(T0 + 3, crowd)) is None  # a real write clears it
        assert store.last_error is None


def test_a_full_store_drops_its_oldest_samples_to_keep_recording(db: Path) -> None:
    with Store(db) as store:
        models = tuple(model(f"m{i}") for i in range(60))
        for i in range(50):  # 3000 samples
            assert store.record(snapshot(T0 + i, models)) is None
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        assert store._conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        error = store.record(snapshot(T0 + 100, models))
        assert error is not None and "dropped the 300 oldest samples" in error
        times = [r["t_wall_s"] for r in rows(store, "samples")]
        assert times.count(T0 + 100) == 60 and min(times) == T0 + 5  # newest in, oldest tenth gone


def test_a_corrupt_file_is_moved_aside_and_a_new_store_started(db: Path) -> None:
    db.write_bytes(b"this is not a database, just junk " * 200)
    with pytest.raises(StoreError, match="cannot read the store") as info:
        Store(db, writer=False)  # a reader moves it aside too (#25), and says where
    assert str(db) in str(info.value) and ".corrupt-" in str(info.value) and not db.exists()

    db.write_bytes(b"this is not a database, just junk " * 200)
    with Store(db) as store:
        assert store.backup_path is not None and store.backup_path.exists()
        assert store.backup_path.read_bytes().startswith(b"this is not a database")
        assert str(store.backup_path).startswith(str(db) + ".corrupt-")
        assert store.record(snapshot(T0, (model(),))) is None
        assert len(rows(store, "samples")) == 1


def test_a_store_with_mangled_pages_is_detected_at_open(db: Path) -> None:
    with Store(db) as store:
        for i in range(30):
            store.record(snapshot(T0 + i, tuple(model(f"m{j}") for j in range(30))), [session()])
        store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    for offset in range(page, len(data), page):  # keep the header page, scramble every b-tree page
        data[offset : offset + 64] = os.urandom(64)
    db.write_bytes(bytes(data))
    with Store(db) as store:
        assert store.backup_path is not None and store.backup_path.exists()
        assert store.record(snapshot(T0, (model(),))) is None


def test_export_style_reading_works_while_the_writer_records(db: Path) -> None:
    with Store(db) as writer:
        for i in range(200):
            writer.record(snapshot(T0 + i, (model(),)))
        stop = threading.Event()
        errors: list[str] = []

        def keep_writing() -> None:
            i = 200
            while not stop.is_set() and i < 5000:  # bounded
                error = writer.record(snapshot(T0 + i, (model(),)))
                if error:
                    errors.append(error)
                i += 1

        thread = threading.Thread(target=keep_writing)
        thread.start()
        try:
            with Store(db, writer=False) as reader:
                seen = sum(1 for _ in reader.iter_rows("samples", batch=7))
        finally:
            stop.set()
            thread.join(timeout=30)
        assert seen >= 200 and errors == []


def test_a_schema_2_store_gains_the_proxy_columns_and_keeps_its_requests(db: Path) -> None:
    raw = sqlite3.connect(db)  # the store as stop 16 wrote it: migrations 1 and 2
    store_mod._migration_1(raw)
    store_mod._migration_2(raw)
    raw.execute("PRAGMA user_version = 2")
    raw.execute(
        "INSERT INTO requests (finished_wall_s, server, server_kind, model, exact, decode_tok_s, source) "
        "VALUES (?, 'http://127.0.0.1:8080', 'llamacpp', 'gemma', 1, 41.5, 'server')",
        (T0,),
    )
    raw.commit()
    raw.close()
    with Store(db) as store:
        types = store.column_types("requests")
        assert types["cached_tokens"] == "INTEGER" and types["http_status"] == "INTEGER"
        assert types["endpoint"] == "TEXT" and types["aborted"] == "INTEGER"
        (old,) = rows(store, "requests")
        assert old["decode_tok_s"] == 41.5 and old["cached_tokens"] is None and old["endpoint"] is None
        assert old["aborted"] == 0 and old["prompt_rate_upper_bound"] == 0  # nothing was cut short before
