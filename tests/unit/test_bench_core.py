"""`llm-tray bench` numbers (#13), pure: statistics, runs from records, the sweep's prediction, the verdict.

Every expected value is hand arithmetic written next to it.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import pytest

from tests.support.paths import TESTS_DIR
from trayapp.core.bench import (
    BenchRun,
    BenchSettings,
    BenchTarget,
    bench_run,
    coefficient_of_variation,
    healthy_range,
    is_spill,
    median,
    predicted_tok_s,
    spread,
    stream_decode_tok_s,
    summarize,
)
from trayapp.core.bench_json import bench_json
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.machine import Machine
from trayapp.core.model import FinishedRequest, KvLayout, ModelFacts, ModelStatus, ServerStatus, Snapshot
from trayapp.core.thresholds import Thresholds
from trayapp.services.bench_job import BenchError, Progress, _Plan, pick_target

JSON_DOC = TESTS_DIR.parent / "docs" / "json.md"

# 100 GB/s; 1e9 weight bytes per token; 100,000 KV elements per token of context, f16 (2 bytes each):
# 200,000 bytes per token of context. ceiling(c) = 100e9 / (1e9 + 2e5·c).
GPU = Machine("Test GPU", 100.0, 24 * 10**9, 50.0, has_gpu=True)
CPU = Machine("CPU (system RAM)", 50.0, 64 * 10**9, 50.0, has_gpu=False)
FACTS = ModelFacts(
    weights_bytes=10**9,
    bytes_per_token=10**9,
    exact=True,
    source="gguf",
    quantization="Q4_K_M",
    kv=KvLayout(full_elems_per_token=100_000),
)


def run(
    rate: float | None,
    *,
    kind: str = "decode",
    warmup: bool = False,
    depth: int = 0,
    prompt: int = 40,
    decode: int = 20,
    stream_rate: float | None = None,
    ttft: float | None = None,
    prompt_rate: float | None = None,
    spilled: bool = False,
) -> BenchRun:
    return BenchRun(
        kind=kind,  # type: ignore[arg-type]
        warmup=warmup,
        depth_tokens=depth,
        prompt_tokens=prompt,
        cached_tokens=0,
        decode_tokens=decode,
        streamed_tokens=decode,
        server_decode_tok_s=rate,
        stream_decode_tok_s=stream_rate,
        ttft_s=ttft,
        prompt_tok_s=prompt_rate,
        prompt_rate_upper_bound=False,
        wall_s=1.0,
        spilled=spilled,
    )


def target(machine: Machine = GPU, gpu_fraction: float | None = 1.0) -> BenchTarget:
    return BenchTarget(
        server_url="http://127.0.0.1:8080",
        server_kind="llamacpp",
        server_version="b1234",
        model="m.gguf",
        quantization="Q4_K_M",
        facts=FACTS,
        context_length=8192,
        gpu_fraction=gpu_fraction,
        gpu_fraction_source="nvml",
        vram_bytes=None,
        hardware=machine.label,
    )


def settings(depths: tuple[int, ...] = (0,)) -> BenchSettings:
    return BenchSettings(tokens=20, runs=3, warmup=1, depths=depths, prompt_depth_tokens=512)


def result(runs: list[BenchRun], depths: tuple[int, ...] = (0,), machine: Machine = GPU, **kw: Any):
    return summarize(
        target(machine),
        settings(depths),
        runs,
        machine,
        Thresholds(),
        started_wall_s=1000.0,
        finished_wall_s=1010.0,
        **kw,
    )


# --------------------------------------------------------------------------- statistics


def test_median_spread_and_cv_by_hand() -> None:
    assert median([14.0, 10.0, 12.0]) == 12.0
    assert median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert median([]) is None
    assert spread([10.0, 12.0, 14.0]) == 4.0
    assert spread([7.0]) == 0.0
    # mean 12, squares 4 + 0 + 4 = 8, sample variance 8 / 2 = 4, sd 2: 2 / 12
    assert coefficient_of_variation([10.0, 12.0, 14.0]) == pytest.approx(2 / 12)
    assert coefficient_of_variation([10.0]) is None


def test_stream_estimate_is_tokens_after_the_first_over_their_seconds() -> None:
    assert stream_decode_tok_s(33, 1.0, 3.0) == 16.0  # 32 tokens after the first in 2 s
    assert stream_decode_tok_s(1, 1.0, 3.0) is None
    assert stream_decode_tok_s(10, 2.0, 2.0) is None


def test_run_uses_the_servers_exact_rate_else_its_own_estimate() -> None:
    exact = FinishedRequest(
        model="m", finished_wall_s=0.0, prompt_tokens=30, decode_tokens=21, decode_tok_s=50.0
    )
    made = bench_run(
        exact, kind="decode", warmup=False, depth_tokens=0, streamed_tokens=21, first_text_s=10.0,
        last_text_s=10.5, wall_s=1.0,
    )  # fmt: skip
    assert made.decode_tok_s == 50.0 and made.decode_exact
    assert made.stream_decode_tok_s == 40.0  # 20 tokens in 0.5 s
    usage_only = FinishedRequest(
        model="m", finished_wall_s=0.0, prompt_tokens=1000, cached_tokens=200, decode_tokens=21,
        decode_tok_s=44.0, ttft_s=2.0, decode_exact=False,
    )  # fmt: skip
    made = bench_run(
        usage_only, kind="decode", warmup=False, depth_tokens=0, streamed_tokens=21, first_text_s=10.0,
        last_text_s=10.5, wall_s=1.0,
    )  # fmt: skip
    assert made.server_decode_tok_s is None and not made.decode_exact
    assert made.decode_tok_s == 40.0
    assert made.prompt_tok_s == 400.0  # (1000 − 200 cached) / 2.0 s


# --------------------------------------------------------------------------- the result


def test_warmup_is_kept_but_not_in_the_median() -> None:
    runs = [run(5.0, warmup=True), run(10.0), run(12.0), run(14.0)]
    out = result(runs)
    assert out.decode_tok_s == 12.0  # with the warm-up it would be 11.0
    assert out.decode_spread.tok_s == 4.0
    assert out.decode_spread.cv == pytest.approx(2 / 12)
    data = bench_json(out)
    assert [r["warmup"] for r in data["runs"]] == [True, False, False, False]
    assert data["decode_tok_s"] == 12.0


def test_spilled_runs_are_named_not_averaged_in() -> None:
    out = result([run(10.0), run(12.0), run(3.0, spilled=True)])
    assert out.decode_tok_s == 11.0
    assert any("spilled to the CPU" in w for w in out.warnings)


def test_efficiency_against_the_ceiling_at_the_runs_context() -> None:
    out = result([run(60.0), run(60.0)])
    # context 40 + 20/2 = 50 tokens: 1e9 + 2e5·50 = 1.01e9 bytes; 100e9 / 1.01e9
    assert out.ceiling_tok_s == pytest.approx(100 / 1.01)
    assert out.efficiency == pytest.approx(60 / (100 / 1.01))
    assert out.healthy.verdict == "healthy"  # 60.6 %: in 60–75 %


def test_sweep_prediction_scales_the_shallow_rate_by_the_ceilings() -> None:
    runs = [run(60.0), run(60.0), run(40.0, kind="sweep", depth=5000, prompt=5000)]
    runs.append(run(30.0, kind="sweep", depth=5000, prompt=5000))
    out = result(runs, depths=(0, 5000))
    shallow, deep = out.sweep
    assert (shallow.depth_tokens, shallow.context_tokens, shallow.decode_tok_s) == (0, 50, 60.0)
    assert (deep.depth_tokens, deep.context_tokens, deep.decode_tok_s) == (5000, 5010, 35.0)
    # bytes per token at 50: 1.01e9; at 5010: 1e9 + 1.002e9 = 2.002e9
    assert deep.predicted_tok_s == pytest.approx(60 * 1.01 / 2.002)
    assert deep.ceiling_tok_s == pytest.approx(100 / 2.002)
    assert shallow.predicted_tok_s == pytest.approx(60.0)
    assert predicted_tok_s(60.0, 50, 5010, FACTS, GPU, 1.0) == pytest.approx(60 * 1.01 / 2.002)
    assert predicted_tok_s(60.0, 50, 5010, None, GPU, 1.0) is None


def test_sweep_point_missing_when_its_depth_was_never_measured() -> None:
    out = result([run(60.0)], depths=(0, 2048), sweep_stopped="depth 2048 …")
    assert [p.depth_tokens for p in out.sweep] == [0]
    assert bench_json(out)["sweep_stopped"] == "depth 2048 …"


def test_healthy_range_follows_the_monitors_rules() -> None:
    t = Thresholds()
    at = healthy_range(100.0, 70.0, GPU, 1.0, t)
    assert (at.band_low_tok_s, at.band_high_tok_s, at.floor_tok_s) == pytest.approx((60.0, 75.0, 45.0))
    assert at.verdict == "healthy"
    assert healthy_range(100.0, 50.0, GPU, 1.0, t).verdict == "below_band"
    assert healthy_range(100.0, 40.0, GPU, 1.0, t).verdict == "low_efficiency"  # under 0.45
    assert healthy_range(100.0, 40.0, CPU, None, t).verdict == "not_judged"
    assert healthy_range(100.0, 40.0, GPU, 0.5, t).verdict == "not_judged"  # offloaded
    assert healthy_range(None, 40.0, GPU, 1.0, t).verdict == "not_judged"


def test_spill_is_a_fall_below_the_offload_mark() -> None:
    t = Thresholds()  # offload mark 0.98
    assert is_spill(1.0, 0.8, t)
    assert not is_spill(1.0, 0.99, t)
    assert not is_spill(1.0, None, t)
    assert not is_spill(0.5, 0.5, t)  # offloaded from the start: not a spill during the bench
    assert is_spill(0.5, 0.3, t)


def test_bench_json_has_the_issue_fields_and_docs_list_them() -> None:
    data = bench_json(result([run(10.0, warmup=True), run(12.0, ttft=0.5, prompt_rate=900.0, kind="prompt")]))
    for key in ("decode_tok_s", "decode_spread", "ttft_s", "prompt_tok_s", "ceiling_tok_s", "efficiency"):
        assert key in data
    for key in ("sweep", "runs", "model", "quantization", "server", "hardware"):
        assert key in data
    assert set(data["decode_spread"]) == {"tok_s", "cv"}
    assert data["server"] == {"url": "http://127.0.0.1:8080", "kind": "llamacpp", "version": "b1234"}
    assert data["ttft_s"] == 0.5 and data["prompt_tok_s"] == 900.0
    section = JSON_DOC.read_text(encoding="utf-8").split("# `bench --json`", 1)
    assert len(section) == 2, "docs/json.md has no bench section"
    documented = set(re.findall(r'^\s*"([a-z_]+)":', section[1], flags=re.M))
    written = set(data) | set(data["hardware"]) | set(data["settings"]) | set(data["healthy"])
    written |= set(data["runs"][0]) | {"depth", "context_tokens", "predicted_tok_s", "decode_spread_tok_s"}
    assert written - documented == set()


def test_json_numbers_are_finite_and_plain() -> None:
    data = bench_json(result([run(10.0), run(12.0)]))
    assert all(not isinstance(v, float) or math.isfinite(v) for v in data.values())


# --------------------------------------------------------------------------- choosing the target


def snapshot(*servers: ServerStatus) -> Snapshot:
    return Snapshot(0.0, 0.0, servers, HardwareSnapshot((), HostReading(None, None, None)))


def test_pick_target_errors_say_what_is_wrong() -> None:
    url = "http://127.0.0.1:11434"
    empty = ServerStatus("ollama", url, "ok")
    with pytest.raises(BenchError, match="no model loaded"):
        pick_target(snapshot(empty), [], None)
    two = ServerStatus("ollama", url, "ok", models=(ModelStatus("a:1b", "idle"), ModelStatus("b:8b", "idle")))
    with pytest.raises(BenchError, match=r"several models .* --model"):
        pick_target(snapshot(two), [], None)
    with pytest.raises(BenchError, match=r"unknown model 'c' \(the server lists: a:1b, b:8b\)"):
        pick_target(snapshot(two), [], "c")
    assert pick_target(snapshot(two), [], "b:8b")[1].name == "b:8b"
    down = ServerStatus("ollama", url, "unreachable", reason="connection refused")
    with pytest.raises(BenchError, match=r"no server is up.*connection refused"):
        pick_target(snapshot(down), [], None)
    with pytest.raises(BenchError, match="no server found"):
        pick_target(snapshot(two), ["http://127.0.0.1:9999"], None)


def test_depth_prompts_learn_the_filler_size() -> None:
    plan = _Plan(settings(), 8192)
    plan.base_tokens = 30
    assert plan.reps_for(530) == 50  # guess: 10 tokens a filler sentence
    plan.learn(50, 30 + 600)  # the server counted 600 tokens for 50 sentences: 12 each
    assert plan.reps_for(3030) == 250


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_only_on_a_terminal() -> None:
    piped = io.StringIO()
    quiet = Progress(4, piped)
    quiet.show("decode")
    quiet.clear()
    assert piped.getvalue() == ""
    tty = _Tty()
    bar = Progress(4, tty)
    bar.step()
    bar.show("decode: 42 tok/s")
    assert tty.getvalue() == "\rbench [#####...............] 1/4 decode: 42 tok/s"
    bar.clear()
    assert tty.getvalue().endswith("\r")
