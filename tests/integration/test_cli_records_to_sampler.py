"""The CLI beside a running tray (#24 item 2): what `llm-tray proxy` and `llm-tray bench` measure
reaches the one store through the sampler that holds it, instead of being refused.

The tray's sampler runs in this process as trayapp/app/tray_app.py wires it: a real `Monitor` with
`record=True` (it holds the store's writer lock) and its RecordInbox, ticking on a thread and
publishing to an announced `SnapshotServer` whose intake is that monitor. Beside it run the real
commands as a user types them, against the real llama-server. Expected values come from the
server's own `timings`; every wait is on a condition, bounded.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import WatchToFile, run_cli, wait_for
from tests.support.llama import LlamaServer
from tests.support.store_records import rows
from tests.support.tray_sampler import TraySampler
from trayapp.config import paths
from trayapp.core.bench import BASELINE_MAX_CV, coefficient_of_variation
from trayapp.core.jsonview import snapshot_json
from trayapp.sinks.store import Store

pytestmark = pytest.mark.llamacpp

WAIT_S = 60.0  # a busy 2-core host: a CLI start, a request, a tick
RAM_GBPS = "50"  # given: no RAM benchmark in these tests


@pytest.fixture
def tray(llama_server: LlamaServer) -> Any:
    sampler = TraySampler(llama_server.url, record=True).start()
    try:
        yield sampler
    finally:
        sampler.stop()


def _store_rows(table: str, **kw: object) -> list[dict[str, Any]]:
    with Store(paths.store_file(), writer=False) as store:
        return rows(store, table, **kw)


def _stream(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed /completion through `url` → the server's own timings of it."""
    last: dict[str, Any] = {}
    with (
        httpx.Client(trust_env=False, timeout=120) as client,
        client.stream("POST", url + "/completion", json={**body, "stream": True}) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
    return dict(last["timings"])


def test_a_cli_proxy_beside_the_tray_records_through_it(
    tray: TraySampler, llama_server: LlamaServer, tmp_path: Path
) -> None:
    proxy = WatchToFile(
        tmp_path, "--listen", "127.0.0.1:0", "--upstream", f"llamacpp={llama_server.url}",
        "--ram-bandwidth-gbps", RAM_GBPS, command="proxy",
    )  # fmt: skip
    try:
        listening = proxy.wait_line(lambda line: line["event"] == "listening", WAIT_S, "the listening line")
        said = f"the tray (pid {os.getpid()}) records to the store: this proxy's records go to it"
        assert said in proxy.err_path.read_text(), proxy.err_path.read_text()
        started_wall_s, first_snapshot = time.time(), len(tray.since(0))
        body = {"prompt": "Write one line about harbours.", "n_predict": 24, "ignore_eos": True}
        timings = _stream(listening["listen"], body)
        printed = proxy.wait_line(lambda line: line["event"] == "request", WAIT_S, "the proxy's record")
    finally:
        assert proxy.stop() == 0, proxy.err_path.read_text()

    # The proxy's own numbers are the server's.
    assert printed["decode_tok_s"] == pytest.approx(timings["predicted_per_second"])
    assert printed["ttft_s"] >= timings["prompt_ms"] / 1000

    # The tray stores that request once, as the proxy measured it (no polled estimate beside it).
    def stored() -> list[dict[str, Any]] | None:
        found = _store_rows("requests", since_wall_s=started_wall_s)
        return found if any(r["source"] == "proxy" for r in found) else None

    requests = wait_for(stored, WAIT_S, "the request in the tray's store")
    assert [r["source"] for r in requests] == ["proxy"], requests
    row = requests[0]
    assert row["decode_tok_s"] == pytest.approx(timings["predicted_per_second"])
    assert row["decode_tokens"] == timings["predicted_n"] == 24
    assert row["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
    assert row["ttft_s"] == pytest.approx(printed["ttft_s"]) and row["ttft_s"] >= timings["prompt_ms"] / 1000
    assert row["exact"] in (1, True) and row["endpoint"] == "/completion"

    # The tray's snapshot (its status --json document) shows that request's exact numbers, not
    # the polled estimate: the proxy's TTFT and the server's decode rate, both marked exact.
    def shown(model: dict[str, Any]) -> bool:
        return (
            model["ttft_exact"] is True
            and model["ttft_s"] == pytest.approx(printed["ttft_s"], abs=1e-3)
            and model["decode_exact"] is True
            and model["last_decode_tok_s"] == pytest.approx(timings["predicted_per_second"], abs=0.01)
        )

    def exact() -> dict[str, Any] | None:
        for snapshot in tray.since(first_snapshot):
            for server in snapshot_json(snapshot)["servers"]:
                for model in server["models"]:
                    if shown(model):
                        return dict(model)
        return None

    wait_for(exact, WAIT_S, "the tray's snapshot with the proxy's exact TTFT and decode rate")


def test_a_cli_proxy_started_beside_a_starting_tray_leaves_it_the_store_and_loses_no_record(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    """A tray answers ~3 s before its monitor opens the store. A proxy started then used to find the
    store free, take it, and leave the tray not recording; its records never reached the tray. Now it
    sends them to the tray, asking again while the tray says it is starting (503, Retry-After)."""
    tray = TraySampler(llama_server.url, record=True, store_later=True).start()
    proxy = WatchToFile(
        tmp_path, "--listen", "127.0.0.1:0", "--upstream", f"llamacpp={llama_server.url}",
        "--ram-bandwidth-gbps", RAM_GBPS, command="proxy",
    )  # fmt: skip
    try:
        listening = proxy.wait_line(lambda line: line["event"] == "listening", WAIT_S, "the listening line")
        said = f"the tray (pid {os.getpid()}) records to the store: this proxy's records go to it"
        assert said in proxy.err_path.read_text(), proxy.err_path.read_text()
        started_wall_s = time.time()
        body = {"prompt": "Write one line about lighthouses.", "n_predict": 16, "ignore_eos": True}
        timings = _stream(listening["listen"], body)
        proxy.wait_line(lambda line: line["event"] == "request", WAIT_S, "the proxy's record")
        tray.open_store()  # the tray's monitor gets the store's writer lock: the proxy never took it

        def stored() -> list[dict[str, Any]] | None:
            found = _store_rows("requests", since_wall_s=started_wall_s)
            return found if any(r["source"] == "proxy" for r in found) else None

        requests = wait_for(stored, WAIT_S, "the request in the tray's store")
    finally:
        assert proxy.stop() == 0, proxy.err_path.read_text()
        tray.stop()
    assert [r["source"] for r in requests] == ["proxy"], requests
    assert requests[0]["decode_tok_s"] == pytest.approx(timings["predicted_per_second"])
    assert requests[0]["decode_tokens"] == timings["predicted_n"] == 16


def test_a_bench_beside_the_tray_lands_in_its_store(tray: TraySampler, llama_server: LlamaServer) -> None:
    bench = run_cli(
        "bench", "--endpoint", f"llamacpp={llama_server.url}", "--tokens", "16", "--runs", "2",
        "--warmup", "0", "--depths", "0", "--ram-bandwidth-gbps", RAM_GBPS, "--json",
        timeout_s=600,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    doc = json.loads(bench.stdout)
    rates = [r["server_decode_tok_s"] for r in doc["runs"] if r["kind"] == "decode" and not r["warmup"]]
    assert len(rates) == 2 and all(rate is not None for rate in rates)
    cv = coefficient_of_variation(rates)
    assert cv is not None
    listed = run_cli("sessions", "--bench", "--json")
    assert listed.returncode == 0, listed.stderr
    if cv > BASELINE_MAX_CV:  # the machine was busy: refused, with that reason, and nothing stored
        assert doc["baseline_stored"] is False
        assert doc["baseline_note"].startswith("unstable: the decode runs spread"), doc["baseline_note"]
        assert _store_rows("bench") == [] and json.loads(listed.stdout) == []
        return
    assert doc["baseline_stored"] is True, doc["baseline_note"]
    assert doc["baseline_note"] == f"kept by the tray (pid {os.getpid()}), which records to the store"
    assert bench.stderr.count("kept by the tray") == 1, bench.stderr  # said once
    (row,) = _store_rows("bench")
    assert row["model"] == doc["model"] and row["depth_tokens"] == 0
    assert row["decode_tok_s"] == pytest.approx(doc["decode_tok_s"], abs=1e-3)
    assert row["decode_cv"] == pytest.approx(doc["decode_spread"]["cv"], abs=1e-4)
    (listed_row,) = json.loads(listed.stdout)
    assert listed_row["decode_tok_s"] == pytest.approx(doc["decode_tok_s"], abs=1e-3)


def test_watch_beside_the_tray_says_who_records(tray: TraySampler, llama_server: LlamaServer) -> None:
    watch = run_cli("watch", "--endpoint", f"llamacpp={llama_server.url}", "--duration", "1",
                    "--ram-bandwidth-gbps", RAM_GBPS)  # fmt: skip
    assert watch.returncode == 0, watch.stderr
    said = f"llm-tray: the tray (pid {os.getpid()}) records to the store: this watch does not"
    assert watch.stderr.count(said) == 1, watch.stderr
    assert "already recording" not in watch.stderr, watch.stderr  # no second, confusing refusal
    quiet = run_cli("watch", "--endpoint", f"llamacpp={llama_server.url}", "--duration", "1", "--no-record",
                    "--ram-bandwidth-gbps", RAM_GBPS)  # fmt: skip
    assert quiet.returncode == 0 and "records to the store" not in quiet.stderr, quiet.stderr
