"""The wire form of what the CLI hands the running sampler (#24 item 2): a proxy's request
records and a bench's result go over JSON as their dataclasses' own fields and come back equal,
so what the sampler stores is what the command measured; anything else is refused by name."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.support.wire_records import UPSTREAM, bench_result, proxy_record
from trayapp.core.bench import BenchResult, baseline_refusal
from trayapp.core.model import FinishedRequest
from trayapp.sinks.store.rows import bench_rows
from trayapp.sinks.wire import WireError, from_wire, parse_records, to_wire

HEALTHY = {"band_low_tok_s": None, "band_high_tok_s": None, "floor_tok_s": None, "reason": ""}


def _over_json(value: Any) -> Any:
    return json.loads(json.dumps(to_wire(value), allow_nan=False))


def test_a_proxy_record_comes_back_equal() -> None:
    record = proxy_record()
    assert from_wire(FinishedRequest, _over_json(record)) == record


def test_a_bench_comes_back_equal_and_stores_the_same_rows() -> None:
    result = bench_result()
    rebuilt = from_wire(BenchResult, _over_json(result))
    assert rebuilt == result
    assert rebuilt.target.facts == result.target.facts and isinstance(rebuilt.runs, tuple)
    assert bench_rows(rebuilt) == bench_rows(result)
    assert baseline_refusal(rebuilt) == baseline_refusal(result)


def test_non_finite_numbers_go_as_null() -> None:
    wire = _over_json(proxy_record(prompt_tok_s=math.inf, decode_tok_s=math.nan))
    assert wire["prompt_tok_s"] is None and wire["decode_tok_s"] is None
    assert from_wire(FinishedRequest, wire).decode_tok_s is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"runs": "many"}, "bench.runs: a list"),
        ({"settings": {"tokens": 16}}, "bench.settings.runs: missing"),
        ({"healthy": {**HEALTHY, "verdict": "great"}}, "bench.healthy.verdict: one of"),
        ({"interrupted": 0}, "bench.interrupted: true or false"),
        ({"decode_tok_s": -3.0}, "bench.decode_tok_s"),
        ({"completion": "text"}, "unknown field 'completion'"),
    ],
)
def test_a_bad_bench_is_refused_by_name(change: dict[str, Any], says: str) -> None:
    wire = {**_over_json(bench_result()), **change}
    with pytest.raises(WireError, match=says.replace("(", r"\(")):
        from_wire(BenchResult, wire, "bench")


def test_records_bodies() -> None:
    record = proxy_record()
    items = [{"upstream": UPSTREAM, "request": to_wire(record)}]
    body = {"upstreams": [UPSTREAM], "lease_s": 30, "records": items}
    slots = to_wire(proxy_record(source="slots"))
    assert parse_records(_json(body)) == ([UPSTREAM], 30.0, [(UPSTREAM, record)])
    assert parse_records({"upstreams": [UPSTREAM], "lease_s": 0, "records": []}) == ([UPSTREAM], 0.0, [])
    for bad, says in [
        ({**body, "upstreams": []}, "upstreams: a list of 1"),
        ({**body, "upstreams": ["ftp://x"]}, r"upstreams\[0\]: an http"),
        ({**body, "lease_s": True}, "lease_s"),
        ({**body, "records": [{"upstream": UPSTREAM}]}, "an object with upstream and request"),
        ({**body, "records": [{"upstream": UPSTREAM, "request": slots}]}, "source: must be proxy"),
    ]:
        with pytest.raises(WireError, match=says):
            parse_records(bad)


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))
