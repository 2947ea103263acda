"""The sampler's POST endpoints (#24 item 2): `POST /v1/records` (a CLI proxy's request records)
and `POST /v1/bench` (a CLI bench's result), served by a real SnapshotServer on loopback.

A body that is not exactly what the endpoint takes — bad JSON, too big, a missing or unknown
field, a wrong type, a record that is not a proxy's — gets a 4xx naming what is wrong and reaches
nothing: the intake (what the tray's monitor is) records every call, and there is none. The
client side (`RecordForwarder`) is run against the same endpoint, and against none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.fake_servers import wait_until
from tests.support.wire_records import bench_result, proxy_record
from trayapp.core.bench import BenchResult
from trayapp.core.model import FinishedRequest
from trayapp.sinks.sampler_file import (
    MAX_POST_BYTES,
    RecordForwarder,
    SamplerInfo,
    SamplerRefused,
    post,
    post_bench,
    to_wire,
)
from trayapp.sinks.snapshot_server import SnapshotServer

TOKEN = "s3cret-token"
UPSTREAM = "http://127.0.0.1:8080"
WAIT_S = 10.0


@dataclass
class Intake:
    """What the endpoint hands posted records to (trayapp/services/monitor.py's methods, recorded)."""

    posts: list[tuple[list[str], float, list[tuple[str, FinishedRequest]]]] = field(default_factory=list)
    benches: list[BenchResult] = field(default_factory=list)
    records: bool | None = True  # record_bench's answer: None as a monitor with no store

    def accept_proxy_records(
        self, upstreams: list[str], lease_s: float, records: list[tuple[str, FinishedRequest]]
    ) -> tuple[list[str], bool]:
        self.posts.append((list(upstreams), lease_s, list(records)))
        return [u for u in upstreams if u != UPSTREAM], True

    def record_bench(self, result: BenchResult) -> tuple[bool, str | None] | None:
        self.benches.append(result)
        return None if self.records is None else (True, None)


@pytest.fixture
def intake() -> Intake:
    return Intake()


@pytest.fixture
def server(intake: Intake) -> Iterator[SnapshotServer]:
    snapshots = SnapshotServer(token=TOKEN, intake=lambda: intake).start()
    try:
        yield snapshots
    finally:
        snapshots.stop(2.0)


def _post(
    server: SnapshotServer, path: str, body: Any, *, token: str | None = TOKEN, raw: bytes | None = None,
    content_type: str = "application/json",
) -> httpx.Response:  # fmt: skip
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=data, headers=headers, timeout=WAIT_S)


def _records_body(*records: FinishedRequest, **extra: Any) -> dict[str, Any]:
    items = [{"upstream": UPSTREAM, "request": to_wire(r)} for r in records]
    return {"upstreams": [UPSTREAM], "lease_s": 30, "records": items, **extra}


def test_posted_records_reach_the_intake_exactly(server: SnapshotServer, intake: Intake) -> None:
    record = proxy_record()
    body = _records_body(record)
    body["upstreams"].append("http://127.0.0.1:9999")
    answer = _post(server, "/v1/records", body)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": 1, "unwatched": ["http://127.0.0.1:9999"], "recording": True}
    assert intake.posts == [([UPSTREAM, "http://127.0.0.1:9999"], 30.0, [(UPSTREAM, record)])]


def test_a_posted_bench_reaches_the_intake_exactly(server: SnapshotServer, intake: Intake) -> None:
    result = bench_result()
    answer = _post(server, "/v1/bench", {"bench": to_wire(result)})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"stored": True, "note": None}
    assert intake.benches == [result]


def test_a_bench_for_a_sampler_that_records_nothing_is_409(server: SnapshotServer, intake: Intake) -> None:
    intake.records = None
    answer = _post(server, "/v1/bench", {"bench": to_wire(bench_result())})
    assert answer.status_code == 409 and "does not record" in answer.json()["error"]


def _good() -> dict[str, Any]:
    return _records_body(proxy_record())


def _without(key: str) -> dict[str, Any]:
    body = _good()
    del body["records"][0]["request"][key]
    return body


def _with(key: str, value: Any) -> dict[str, Any]:
    body = _good()
    body["records"][0]["request"][key] = value
    return body


BAD_RECORDS: list[tuple[str, Any, int, str]] = [
    ("not an object", [1, 2], 400, "an object with upstreams"),
    ("no upstreams", {"lease_s": 30, "records": []}, 400, "upstreams"),
    ("no lease", {"upstreams": [UPSTREAM], "records": []}, 400, "lease_s"),
    ("lease too long", {**_good(), "lease_s": 10_000}, 400, "lease_s"),
    ("unknown top field", {**_good(), "prompt": "hello"}, 400, "unknown field 'prompt'"),
    ("model missing", _without("model"), 400, "records[0].request.model: missing"),
    ("finished_wall_s missing", _without("finished_wall_s"), 400, "finished_wall_s: missing"),
    ("text in a record", _with("completion", "the model's words"), 400, "unknown field 'completion'"),
    ("a string for a number", _with("ttft_s", "3.7"), 400, "records[0].request.ttft_s"),
    ("a negative rate", _with("decode_tok_s", -1.0), 400, "decode_tok_s"),
    ("a fraction of a token", _with("prompt_tokens", 1.5), 400, "prompt_tokens"),
    ("a bool for a count", _with("decode_tokens", True), 400, "decode_tokens"),
    ("not a proxy's record", _with("source", "slots"), 400, "source"),
    ("an empty model", _with("model", ""), 400, "model: missing"),
    ("a model name too long", _with("model", "m" * 5000), 400, "at most"),
    (
        "an upstream not named",
        {**_good(), "records": [{"upstream": "http://10.0.0.1:1", "request": to_wire(proxy_record())}]},
        400,
        "one of upstreams",
    ),
]


@pytest.mark.parametrize(("why", "body", "status", "says"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_a_bad_records_body_is_refused_and_reaches_nothing(
    server: SnapshotServer, intake: Intake, why: str, body: Any, status: int, says: str
) -> None:
    answer = _post(server, "/v1/records", body)
    assert answer.status_code == status, (why, answer.text)
    assert says in answer.json()["error"], answer.json()
    assert intake.posts == []


def test_bad_json_nan_wrong_type_and_size_are_refused(server: SnapshotServer, intake: Intake) -> None:
    assert _post(server, "/v1/records", None, raw=b"{not json").status_code == 400
    nan = json.dumps(_good()).replace('"ttft_s": 3.73', '"ttft_s": NaN').encode()
    assert b"NaN" in nan
    refused = _post(server, "/v1/records", None, raw=nan)
    assert refused.status_code == 400 and "NaN" in refused.json()["error"]
    assert _post(server, "/v1/records", None, raw=b"\xff\xfe").status_code == 400
    assert _post(server, "/v1/records", _good(), content_type="text/plain").status_code == 415
    big = json.dumps({**_good(), "pad": "x" * MAX_POST_BYTES}).encode()
    too_big = _post(server, "/v1/records", None, raw=big)
    assert too_big.status_code == 413 and str(MAX_POST_BYTES) in too_big.json()["error"]
    bench = _post(server, "/v1/bench", {"bench": {**to_wire(bench_result()), "decode_tok_s": "fast"}})
    assert bench.status_code == 400 and "bench.decode_tok_s" in bench.json()["error"]
    assert _post(server, "/v1/bench", {"result": {}}).status_code == 400
    assert intake.posts == [] and intake.benches == []


def test_a_wrong_or_missing_token_is_401_and_reaches_nothing(server: SnapshotServer, intake: Intake) -> None:
    for token in ("wrong", None):
        for path, body in (("/v1/records", _good()), ("/v1/bench", {"bench": to_wire(bench_result())})):
            answer = _post(server, path, body, token=token)
            assert answer.status_code == 401, answer.text
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert intake.posts == [] and intake.benches == []


def test_other_paths_and_methods_and_no_intake(intake: Intake) -> None:
    server = SnapshotServer(intake=lambda: None).start()  # the tray's monitor is not built yet
    try:
        answer = _post(server, "/v1/records", _good(), token=None)
        assert answer.status_code == 503 and "try again" in answer.json()["error"]
        assert _post(server, "/v1/snapshot", _good(), token=None).status_code == 405
        put = httpx.put(server.url + "/v1/records", json=_good(), timeout=WAIT_S)
        assert put.status_code == 405 and "/v1/records" in put.json()["error"]
    finally:
        server.stop(2.0)


def _info(server: SnapshotServer) -> SamplerInfo:
    return SamplerInfo(url=server.url, pid=4242, started="", role="tray")


def test_the_client_posts_and_reads_the_answer(
    server: SnapshotServer, intake: Intake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_TRAY_TOKEN", TOKEN)
    result = bench_result()
    assert post_bench(_info(server), result) == (True, None)
    assert intake.benches == [result]
    with pytest.raises(SamplerRefused, match="answered 400: invalid body"):
        post(_info(server), "/v1/records", {"records": []})
    monkeypatch.setenv("LLM_TRAY_TOKEN", "wrong")
    with pytest.raises(SamplerRefused, match="answered 401"):
        post_bench(_info(server), result)


def test_the_forwarder_sends_records_and_ends_its_lease(
    server: SnapshotServer, intake: Intake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_TRAY_TOKEN", TOKEN)
    said: list[str] = []
    forwarder = RecordForwarder(_info(server), [UPSTREAM, "http://127.0.0.1:9999"], say=said.append).start()
    records = [proxy_record(ttft_s=0.5 + i) for i in range(3)]
    for record in records:
        forwarder.put(UPSTREAM, record)
    forwarder.close()
    assert [r for _upstreams, _lease, batch in intake.posts for _url, r in batch] == records
    assert intake.posts[0][1] == 30.0 and intake.posts[0][2] == []  # the lease, before any record
    assert intake.posts[-1][1] == 0.0  # the last post ends it
    assert forwarder.sent == 3 and forwarder.failed == 0 and forwarder.dropped == 0
    assert said == [
        "the tray (pid 4242) does not watch http://127.0.0.1:9999: it drops this proxy's records of it; "
        "add that server to its endpoints (Settings… → Servers, or [[endpoints]] in config.toml)"
    ]  # once, though every post's answer named it


def test_the_forwarder_asks_again_while_the_sampler_is_starting(
    intake: Intake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tray answers before its monitor is made: 503 with Retry-After, asked again until it takes
    the records (a proxy started beside a starting tray lost them)."""
    monkeypatch.setenv("LLM_TRAY_TOKEN", TOKEN)
    ready: list[Intake] = []
    asked: list[int] = []

    def current() -> Intake | None:
        asked.append(1)
        return ready[0] if ready else None

    server = SnapshotServer(token=TOKEN, intake=current).start()
    try:
        refused = _post(server, "/v1/records", _good())
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        forwarder = RecordForwarder(_info(server), [UPSTREAM]).start()
        records = [proxy_record(ttft_s=0.25 + i) for i in range(2)]
        for record in records:
            forwarder.put(UPSTREAM, record)
        wait_until(lambda: len(asked) >= 3)  # the refusal above, and at least one of the forwarder's
        ready.append(intake)
        wait_until(lambda: forwarder.sent == 2)
        forwarder.close()
    finally:
        server.stop(2.0)
    assert [r for _upstreams, _lease, batch in intake.posts for _url, r in batch] == records
    assert forwarder.failed == 0 and forwarder.dropped == 0


def test_the_forwarder_without_a_sampler_logs_once_and_never_blocks(caplog: pytest.LogCaptureFixture) -> None:
    gone = SamplerInfo(url="http://127.0.0.1:9", pid=4242, started="", role="tray")  # nothing listens
    forwarder = RecordForwarder(gone, [UPSTREAM], limit=2).start()
    with caplog.at_level(logging.WARNING, logger="trayapp.sinks.sampler_file"):
        for i in range(50):
            forwarder.put(UPSTREAM, proxy_record(ttft_s=float(i)))  # never blocks: a full queue drops
        forwarder.close(timeout_s=WAIT_S)
    failures = [r for r in caplog.records if "not sent to the sampler" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert forwarder.sent == 0 and forwarder.failed + forwarder.dropped == 50


def test_a_deeply_nested_body_is_400_not_a_dropped_connection(
    server: SnapshotServer, intake: Intake, caplog: pytest.LogCaptureFixture
) -> None:
    """#25: within the 256 KiB cap, 100,000 levels of nesting was a RecursionError in the handler (the
    connection dropped, a traceback logged); it is refused before parsing (core/json_limits.py)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with caplog.at_level(logging.WARNING):
        refused = _post(server, "/v1/records", None, raw=deep)
        assert refused.status_code == 400 and "body too deeply nested" in refused.json()["error"]
        hardware = {"bench": {**to_wire(bench_result()), "hardware": json.loads("[" * 70 + "]" * 70)}}
        bench = _post(server, "/v1/bench", hardware)
        assert bench.status_code == 400 and "too deeply nested" in bench.json()["error"]
    assert not [r for r in caplog.records if r.exc_info]
    assert intake.posts == [] and intake.benches == []
    assert _post(server, "/v1/records", _good()).status_code == 202  # and it serves on
