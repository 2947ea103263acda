"""Session logs round trip (issue 6) with the real llama-server and real processes.

(a) What `llm-tray watch --json` printed while a separate client made three requests comes
    back from `llm-tray export` with the same numbers, in CSV and in JSON Lines alike.
(b) A `kill -9` of the recording `watch` mid-generation leaves a database that opens and
    passes `integrity_check`, holding samples up to the last tick `watch` printed.
(c) `llm-tray report` on that store writes a page about the interrupted session.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Watch
from tests.support.llama import LlamaServer, decode_rate, generate_in_background, tokens_lasting
from trayapp.config import paths
from trayapp.sinks.store import Store

pytestmark = pytest.mark.llamacpp

MODEL = "gemma-3-270m-q4_k_m.gguf"
REQUESTS = 3
REQUEST_S = 4.0  # each request decodes ~4 s at the server's own speed (200 tokens: 2 s on a fast host)
T_TOLERANCE_S = 0.0006  # watch prints `t` rounded to the millisecond


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def watch_processes() -> Iterator[list[Watch]]:
    started: list[Watch] = []
    yield started
    for watch in started:
        watch.stop()


def _model(line: dict[str, Any]) -> dict[str, Any] | None:
    for server in line["servers"]:
        for model in server["models"]:
            if model["name"] == MODEL:
                return model
    return None


def _decoding(lines: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The ticks watch printed with a decode rate: (the line, its model)."""
    return [(line, m) for line in lines if (m := _model(line)) is not None and m["decode_tok_s"] is not None]


def _cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"llm-tray {' '.join(args)}: {result.returncode}\n{result.stderr}"
    return result.stdout


def _export(table: str, fmt: str) -> str:
    return _cli("export", "--table", table, "--format", fmt)


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _jsonl_rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _assert_csv_equals_jsonl(
    table: str, csv_rows: list[dict[str, str]], jsonl_rows: list[dict[str, Any]]
) -> None:
    """Every field of every row is the same number, string, boolean or null in both formats."""
    assert len(csv_rows) == len(jsonl_rows), table
    assert csv_rows and list(csv_rows[0]) == list(jsonl_rows[0]), f"{table}: columns differ"
    for text_row, json_row in zip(csv_rows, jsonl_rows, strict=True):
        for column, value in json_row.items():
            cell = text_row[column]
            if value is None:
                assert cell == "", (table, column, cell)
            elif isinstance(value, bool):
                assert cell == ("true" if value else "false"), (table, column, cell)
            elif isinstance(value, (int, float)):
                assert float(cell) == value, (table, column, cell, value)  # exact: repr round-trips
            else:
                assert cell == value, (table, column, cell, value)


def _line_at(lines: list[dict[str, Any]], t_wall_s: float) -> dict[str, Any] | None:
    found = [line for line in lines if abs(line["t"] - t_wall_s) <= T_TOLERANCE_S]
    assert len(found) <= 1
    return found[0] if found else None


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# --------------------------------------------------------------------------- (a) round trip


def test_watch_recording_comes_back_from_export_with_the_same_numbers(
    llama_server: LlamaServer, watch_processes: list[Watch]
) -> None:
    rate_tok_s = decode_rate(llama_server.url)  # also the warm-up: a first request is slower
    watch = Watch("--interval", "1", "--duration", "90", "--endpoint", llama_server.url, "--no-discover")
    watch_processes.append(watch)
    first = watch.next_line()
    assert first is not None and _model(first) is not None, first

    timings: list[dict[str, Any]] = []
    sizes: list[int] = []  # each request's n_predict
    # A separate client, one request after the other, each sized from the server's own speed just
    # before it (a busy neighbour moves it 10×): at least REQUESTS, more (at most 3) until watch has
    # printed enough decoding ticks, when the host sped up under a request sized for a slower one
    while len(timings) < REQUESTS or (
        len(_decoding(watch.lines)) < REQUESTS + 2 and len(timings) < REQUESTS + 3
    ):
        sizes.append(tokens_lasting(rate_tok_s, REQUEST_S))
        future = generate_in_background(
            llama_server.url, f"Describe harbour number {len(timings)}.", sizes[-1], ignore_eos=True
        )
        while not future.done():
            assert watch.next_line() is not None, "watch ended before the requests did"
        timings.append(future.result()["timings"])
        rate_tok_s = float(timings[-1]["predicted_per_second"])
    finished_at = time.time()
    while True:  # until watch has seen the last request finish (idle, bounded by LINE_TIMEOUT_S per line)
        line = watch.next_line()
        assert line is not None and line["t"] < finished_at + 20, "watch never saw the server go idle"
        if line["t"] > finished_at and (_model(line) or {}).get("phase") == "idle":
            break
    assert watch.ctrl_c() == 0, watch.stderr()  # Ctrl-C: watch closes its store and exits 0
    stopped_wall_s = time.time()

    lines = watch.lines
    models = [(line, _model(line)) for line in lines]
    decoding = _decoding(lines)
    assert len(decoding) >= REQUESTS + 2, f"too few decoding ticks: {len(decoding)}"
    watched_sessions = {m["session_id"] for _, m in models if m and m["session_id"]}
    assert len(watched_sessions) == 1, watched_sessions  # back-to-back requests: one session

    # --- samples: every recorded row is a tick watch printed, with the same numbers
    samples_csv = _csv_rows(_export("samples", "csv"))
    samples = _jsonl_rows(_export("samples", "jsonl"))
    _assert_csv_equals_jsonl("samples", samples_csv, samples)
    assert all(row["model"] == MODEL and row["server"] == llama_server.url for row in samples)
    for row in samples:
        line = _line_at(lines, row["t_wall_s"])
        assert line is not None, f"sample at {row['t_wall_s']} matches no tick watch printed"
        model = _model(line)
        assert model is not None
        assert row["phase"] == model["phase"]
        assert row["session_id"] == model["session_id"]
        assert _rounded(row["decode_tok_s"]) == model["decode_tok_s"]
        assert _rounded(row["decode_total_tok_s"]) == model["decode_total_tok_s"]
        assert _rounded(row["ceiling_tok_s"]) == model["ceiling_tok_s"]
        assert row["context_tokens"] == model["context_tokens"]
        assert row["context_length"] == model["context_length"]
    recorded = {round(row["t_wall_s"], 3) for row in samples if row["decode_tok_s"] is not None}
    printed = [round(line["t"], 3) for line, _ in decoding]
    missing = [t for t in printed if t not in recorded]
    # The store keeps at most one sample a second; a tick that came early may share one with its neighbour.
    assert len(missing) <= 1, f"decoding ticks not recorded: {missing} of {printed}"

    # --- requests: one row each; its rate (over the polls that saw it decode) within what watch printed
    requests_csv = _csv_rows(_export("requests", "csv"))
    requests = _jsonl_rows(_export("requests", "jsonl"))
    _assert_csv_equals_jsonl("requests", requests_csv, requests)
    assert len(requests) == len(timings), requests
    previous_finish = 0.0
    for row, server_timings, size in zip(requests, timings, sizes, strict=True):
        assert row["session_id"] in watched_sessions
        assert _line_at(lines, row["finished_wall_s"]) is not None, (
            f"request at {row['finished_wall_s']}: no tick"
        )
        printed_rates = [
            m["decode_tok_s"] for line, m in decoding if previous_finish < line["t"] < row["finished_wall_s"]
        ]
        assert printed_rates, f"watch printed no rate for the request finished at {row['finished_wall_s']}"
        assert 0.95 * min(printed_rates) <= row["decode_tok_s"] <= 1.05 * max(printed_rates), (
            row,
            printed_rates,
        )
        assert row["decode_tok_s"] == pytest.approx(server_timings["predicted_per_second"], rel=0.2)
        assert 0 < row["decode_tokens"] <= size
        previous_finish = row["finished_wall_s"]

    # --- sessions: the one session watch showed, with its request count
    sessions_csv = _csv_rows(_export("sessions", "csv"))
    sessions = _jsonl_rows(_export("sessions", "jsonl"))
    _assert_csv_equals_jsonl("sessions", sessions_csv, sessions)
    assert {row["session_id"] for row in sessions} == watched_sessions
    assert {row["session_id"] for row in samples if row["session_id"]} == watched_sessions
    (session,) = sessions
    assert session["requests"] == len(timings)
    assert session["decode_tokens"] == sum(row["decode_tokens"] for row in requests)
    assert _rounded(session["peak_decode_tok_s"]) == max(m["decode_tok_s"] for _, m in decoding)
    # watch ended its session as it stopped, at the session's last activity (its last busy tick):
    # no session reads "live" once nothing records it
    last_busy_t = max(line["t"] for line, m in models if m and m["phase"] != "idle")
    assert session["ended_wall_s"] is not None
    assert last_busy_t - 0.01 <= session["ended_wall_s"] <= stopped_wall_s, (session, last_busy_t)
    listed = json.loads(_cli("sessions", "--json"))
    assert [s["session_id"] for s in listed] == [session["session_id"]]
    assert listed[0]["duration_s"] == pytest.approx(session["ended_wall_s"] - session["started_wall_s"])


# --------------------------------------------------------------------------- (b) kill -9, (c) report


def test_kill_9_mid_session_loses_at_most_the_last_second(
    llama_server: LlamaServer, watch_processes: list[Watch], tmp_path: Path
) -> None:
    future = generate_in_background(
        llama_server.url, "Write a long story about a lighthouse.", 800, ignore_eos=True
    )
    watch = Watch("--interval", "1", "--endpoint", llama_server.url, "--no-discover")
    watch_processes.append(watch)
    decoding = 0
    while decoding < 4:
        line = watch.next_line()
        assert line is not None, f"watch exited: {watch.stderr()}"
        assert not future.done(), "the generation ended before watch saw it decode"
        model = _model(line)
        decoding += bool(model and model["decode_tok_s"])
    os.kill(watch.process.pid, signal.SIGKILL)  # mid-session, while the server generates
    assert watch.process.wait(timeout=30) == -signal.SIGKILL
    watch.drain()  # lines already in the pipe were printed before the kill
    assert not future.done(), "the generation ended before the kill"
    last_printed = watch.lines[-1]
    last_model = _model(last_printed)
    assert last_model is not None
    session_id = last_model["session_id"]
    assert session_id

    store = paths.store_file()
    with sqlite3.connect(store) as conn:  # opens, replays the WAL, and is consistent
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        newest = conn.execute(
            "SELECT max(t_wall_s) FROM samples WHERE session_id = ?", (session_id,)
        ).fetchone()[0]
    assert newest is not None
    # Each tick is committed before watch prints it; the store keeps a sample at least every second.
    assert newest >= last_printed["t"] - 1.0, f"samples end at {newest}, watch printed {last_printed['t']}"
    with Store(store, writer=False) as reader:  # a reader changes nothing
        assert reader.sessions(session_id=session_id)[0].ended_wall_s is None  # cut off, never ended
    with Store(store, writer=True) as reopened:  # the writer lock died with the process
        # the next writer ends what the dead one left open, at the last moment recorded of it
        assert reopened.sessions(session_id=session_id)[0].ended_wall_s == newest

    sessions = json.loads(_cli("sessions", "--json"))
    assert [s["session_id"] for s in sessions] == [session_id]
    report = tmp_path / "session.html"
    _cli("report", "-o", str(report))
    page = report.read_text(encoding="utf-8")
    assert session_id in page
    assert MODEL in page
    assert "<svg" in page  # the plots of the samples recorded before the kill
    future.result(timeout=120)  # let the server finish before the next test uses it
