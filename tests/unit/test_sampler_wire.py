"""The wire form of what the CLI hands the running sampler (#24 item 2): a proxy's request
records and a bench's result go over JSON as their dataclasses' own fields and come back equal,
so what the sampler stores is what the command measured; anything else is refused by name."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from trayapp.core.bench import (
    BenchResult,
    BenchRun,
    BenchSettings,
    BenchTarget,
    Healthy,
    Spread,
    SweepPoint,
    baseline_refusal,
)
from trayapp.core.model import FinishedRequest, KvLayout, ModelFacts
from trayapp.sinks.store.rows import bench_rows
from trayapp.sinks.wire import WireError, from_wire, parse_records, to_wire

UPSTREAM = "http://127.0.0.1:8080"
HEALTHY = {"band_low_tok_s": None, "band_high_tok_s": None, "floor_tok_s": None, "reason": ""}


def proxy_record(**fields: Any) -> FinishedRequest:
    """A proxy's record of one streamed llama-server request (numbers as the server gives them)."""
    base: dict[str, Any] = {
        "model": "gemma-3-270m-q4_k_m.gguf",
        "finished_wall_s": 1_764_590_400.25,
        "prompt_tokens": 1_536,
        "cached_tokens": 512,
        "decode_tokens": 24,
        "prompt_tok_s": 412.7,
        "decode_tok_s": 31.4159,
        "ttft_s": 3.73,
        "context_tokens": 1_560,
        "source": "proxy",
        "endpoint": "/completion",
        "http_status": 200,
    }
    return FinishedRequest(**{**base, **fields})


def _run(kind: str, rate: float, warmup: bool = False) -> BenchRun:
    return BenchRun(
        kind=kind,  # type: ignore[arg-type]
        warmup=warmup,
        depth_tokens=0,
        prompt_tokens=24,
        cached_tokens=0,
        decode_tokens=16,
        streamed_tokens=16,
        server_decode_tok_s=rate,
        stream_decode_tok_s=rate * 0.98,
        ttft_s=0.081,
        prompt_tok_s=296.3,
        prompt_rate_upper_bound=False,
        wall_s=0.6,
        gpu_fraction=0.0,
    )


def bench_result(rates: tuple[float, ...] = (30.1, 30.4), **fields: Any) -> BenchResult:
    """A finished `llm-tray bench` with every kind of field the wire must carry."""
    facts = ModelFacts(
        weights_bytes=241_000_000,
        bytes_per_token=160_000_000,
        exact=True,
        source="gguf",
        architecture="gemma3",
        quantization="Q4_K_M",
        parameter_count=268_000_000,
        kv=KvLayout(full_elems_per_token=2_048, swa_elems_per_token=10_240, sliding_window=512, n_layers=18),
    )
    target = BenchTarget(
        server_url=UPSTREAM,
        server_kind="llamacpp",
        server_version="b11434",
        model="gemma-3-270m-q4_k_m.gguf",
        quantization="Q4_K_M",
        facts=facts,
        context_length=8_192,
        gpu_fraction=0.0,
        gpu_fraction_source="no-gpu",
        vram_bytes=None,
        hardware="CPU + 50 GB/s RAM",
        hardware_detail={"gpus": [], "ram_bandwidth_gbps": 50.0, "ram_bandwidth_source": "configured"},
        spec_type=None,
    )
    runs = (*(_run("decode", r) for r in rates), _run("prompt", 30.0))
    spread = Spread(max(rates) - min(rates), 0.007)
    base: dict[str, Any] = {
        "target": target,
        "settings": BenchSettings(tokens=16, runs=2, warmup=0, depths=(0,), prompt_depth_tokens=2_048),
        "runs": runs,
        "sweep": (SweepPoint(0, 40, 30.25, spread, None, 312.5, 2),),
        "decode_tok_s": 30.25,
        "decode_exact": True,
        "decode_spread": spread,
        "ttft_s": 6.91,
        "prompt_tok_s": 296.3,
        "prompt_rate_upper_bound": False,
        "ceiling_tok_s": 312.5,
        "efficiency": 0.0968,
        "healthy": Healthy(None, None, None, "not_judged", "no GPU: not judged"),
        "started_wall_s": 1_764_590_000.5,
        "finished_wall_s": 1_764_590_031.75,
        "warnings": ("the machine was busy",),
    }
    return BenchResult(**{**base, **fields})


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
