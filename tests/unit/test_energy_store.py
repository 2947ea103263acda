"""A request's energy in the store (migration 7), its exports and the HTML report (#21). Values by hand."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

from tests.support.store_records import T0, rows, session, snapshot
from trayapp.core.model import RequestRecord
from trayapp.sinks.export import export
from trayapp.sinks.report import render_report
from trayapp.sinks.store import Store, schema_version
from trayapp.sinks.store import schema as store_mod

URL = "http://127.0.0.1:11434"
ENERGY = ("energy_prefill_j", "energy_decode_j", "energy_j_per_token", "energy_idle_w", "energy_source",
          "energy_estimated", "energy_reason")  # fmt: skip


def request(t: float, **kw: object) -> RequestRecord:
    return RequestRecord(URL, "ollama", "qwen3:8b", t, "s1", True, decode_tokens=300, decode_tok_s=75.0, **kw)  # type: ignore[arg-type]


MEASURED = request(T0 + 5, energy_prefill_j=180.0, energy_decode_j=1620.0, energy_j_per_token=5.4,
                   energy_idle_w=48.0, energy_source="nvml+rapl")  # fmt: skip
UNMEASURED = request(T0 + 9, energy_reason="no RAPL package counters in /sys/class/powercap")


def test_a_schema_6_store_gains_the_energy_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite3"
    raw = sqlite3.connect(db)
    for migration in store_mod.MIGRATIONS[:6]:
        migration(raw)
    raw.execute("PRAGMA user_version = 6")
    raw.execute(
        "INSERT INTO requests (server, server_kind, model, finished_wall_s, session_id, exact, source) "
        "VALUES (?, 'ollama', 'qwen3:8b', ?, 's0', 1, 'server')",
        (URL, T0),
    )
    raw.commit()
    raw.close()
    with Store(db) as store:
        assert set(ENERGY) <= set(store.columns("requests"))
        (old,) = rows(store, "requests")
        assert all(old[c] is None for c in ENERGY if c != "energy_estimated")  # not known before 7
        assert store.record(snapshot(T0 + 10, requests=(MEASURED,))) is None
    assert schema_version() >= 7


def test_energy_round_trips_through_the_store_and_the_csv_export(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        store.record(
            snapshot(T0 + 10, requests=(MEASURED, UNMEASURED)), [session("s1", ended_wall_s=T0 + 20)]
        )
        out = io.StringIO()
        export(store, table="requests", fmt="csv", out=out)
    measured, unmeasured = csv.DictReader(io.StringIO(out.getvalue()))
    assert (measured["energy_prefill_j"], measured["energy_decode_j"], measured["energy_j_per_token"]) == (
        "180.0",
        "1620.0",
        "5.4",
    )
    assert (measured["energy_idle_w"], measured["energy_source"], measured["energy_estimated"]) == (
        "48.0",
        "nvml+rapl",
        "false",
    )
    assert unmeasured["energy_decode_j"] == "" and "RAPL" in unmeasured["energy_reason"]  # empty, not 0


def test_the_report_gives_the_sessions_and_the_days_watt_hours(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite3"
    with Store(db) as store:
        store.record(
            snapshot(T0 + 10, requests=(MEASURED, UNMEASURED)), [session("s1", ended_wall_s=T0 + 20)]
        )
    with Store(db, writer=False) as store:
        html = render_report(store, session_id="s1")
    # (180 + 1620) J = 0.5 Wh; 1620 J / 300 tokens = 5.4 J/token; one of the two requests measured.
    assert "<h2>Energy</h2>" in html
    assert "0.5 Wh · 5.4 J/token (1 of 2 requests measured)" in html
