"""Who is using the server (#22): proxied requests summed per client, in `llm-tray sessions --clients`
and the report. Expected figures are worked by hand from the rows below."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.store_records import T0, snapshot
from trayapp.cli import logs
from trayapp.config import paths
from trayapp.core.client_usage import UNNAMED, client_usage, usage_row
from trayapp.core.model import RequestRecord
from trayapp.sinks.report import render_report
from trayapp.sinks.store import Store


def _request(t: float, client: str | None, wait_s: float | None, **kw: object) -> RequestRecord:
    values: dict[str, object] = dict(
        server="http://127.0.0.1:8080", server_kind="llamacpp", model="m", finished_wall_s=T0 + t,
        session_id=None, exact=True, prompt_tokens=100, decode_tokens=50, decode_tok_s=25.0, ttft_s=0.5,
        queue_wait_s=wait_s, client_name=client, client_pid=None if client is None else 4000 + len(client),
    )  # fmt: skip
    values.update(kw)
    return RequestRecord(**values)  # type: ignore[arg-type]


REQUESTS = (
    _request(1, "aider", 0.0),
    _request(2, "aider", 4.0, decode_tokens=100),  # waited for the other client's request
    _request(3, "code", 1.0, prompt_tokens=300),
    _request(4, None, None),  # not through the proxy: no client, no wait
)


def test_requests_are_summed_per_client_by_hand() -> None:
    aider, code, unnamed = client_usage([vars(r) for r in REQUESTS])
    # aider: 2 requests, 200 prompt, 150 decode; busy (0.5 + 50/25) + (0.5 + 100/25) = 2.5 + 4.5 = 7.0 s;
    # waits 0 and 4 s: mean 2.0, max 4.0
    assert (aider.client, aider.requests, aider.prompt_tokens, aider.decode_tokens) == ("aider", 2, 200, 150)
    assert aider.busy_s == pytest.approx(7.0)
    assert (aider.queue_wait_mean_s, aider.queue_wait_max_s) == (pytest.approx(2.0), 4.0)
    assert (code.client, code.requests, code.prompt_tokens) == ("code", 1, 300)
    assert code.busy_s == pytest.approx(2.5)
    assert (unnamed.client, unnamed.requests, unnamed.queue_wait_mean_s) == (UNNAMED, 1, None)


def test_a_records_usage_row_sums_as_its_whole_record() -> None:
    """The dashboard feeds client_usage a record's few fields (usage_row), not the whole record: the
    same table, so no field client_usage reads is left out."""
    assert client_usage([usage_row(r) for r in REQUESTS]) == client_usage([vars(r) for r in REQUESTS])


def test_sessions_clients_lists_them_from_the_store(capsys: pytest.CaptureFixture[str]) -> None:
    with Store(paths.store_file()) as store:
        store.record(snapshot(T0 + 5, kind="llamacpp", url="http://127.0.0.1:8080", requests=REQUESTS))
    parser = argparse.ArgumentParser()
    logs.add_sessions_arguments(parser)
    assert logs.run_sessions(parser.parse_args(["--clients"])) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["CLIENT", "REQ", "PROMPT", "TOK", "DECODE", "TOK", "BUSY", "S", "WAIT", "MEAN",
                              "S", "WAIT", "MAX", "S"]  # fmt: skip
    assert lines[0].split() == ["aider", "2", "200", "150", "7.0", "2.00", "4.00"]
    assert lines[1].split() == ["code", "1", "300", "50", "2.5", "1.00", "1.00"]
    assert lines[2].split() == ["(not", "proxied)", "1", "100", "50", "2.5", "—", "—"]
    assert logs.run_sessions(parser.parse_args(["--clients", "--json"])) == 0
    aider = json.loads(capsys.readouterr().out)[0]
    assert (aider["client"], aider["queue_wait_max_s"], aider["queue_wait_mean_s"]) == ("aider", 4.0, 2.0)


def test_the_report_lists_the_sessions_clients(tmp_path: Path) -> None:
    from tests.support.store_records import session

    path = tmp_path / "store.sqlite3"
    proxied = tuple(replace(r, session_id="s1") for r in REQUESTS)
    with Store(path) as store:
        store.record(snapshot(T0 + 5, kind="llamacpp", url="http://127.0.0.1:8080", requests=proxied),
                     [session("s1", server="http://127.0.0.1:8080", server_kind="llamacpp", model="m",
                              ended_wall_s=T0 + 10)])  # fmt: skip
        page = render_report(store, session_id="s1")
    assert "<h2>Clients</h2>" in page
    aider = ("aider", "2", "200", "150", "7.0", "2.00", "4.00")  # worked by hand above
    assert "<tr>" + "".join(f"<td>{cell}</td>" for cell in aider) + "</tr>" in page
    assert "<td>(not proxied)</td><td>1</td>" in page
