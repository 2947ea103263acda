"""Diagnosis scenarios (issue 4): the whole Pipeline driven tick by tick with synthetic streams.

Each scenario feeds llama-server- or Ollama-shaped readings plus hardware snapshots of an
RTX 4090 machine, one tick per second, and asserts the *exact* set of alert kinds raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import pytest

from tests.support.diagnose_inputs import (
    GB,
    LLAMA_8B,
    LLAMA_URL,
    OLLAMA_URL,
    QWEN_32B_Q4,
    QWEN_32B_Q8,
    QWEN_Q4_4K_SIZE,
    QWEN_Q4_8K_SIZE,
    QWEN_Q4_32K_SIZE,
    QWEN_Q8_32K_SIZE,
    QWEN_Q8_32K_VRAM,
    RUNNER_PID,
    VRAM_TOTAL,
    WALL0,
    hardware,
    idle_slots,
    llama_hardware,
    llama_reading,
    ollama_model,
    ollama_reading,
    request_slots,
)
from trayapp.core.hardware_readings import GpuProcess, HardwareSnapshot
from trayapp.core.jsonview import alert_json
from trayapp.core.machine import Machine, resolve_machine
from trayapp.core.model import (
    Alert,
    Baseline,
    CounterReading,
    FinishedRequest,
    ModelStatus,
    ServerReading,
    ServerStatus,
    SlotReading,
    Snapshot,
)
from trayapp.core.pipeline import Pipeline, Priors
from trayapp.core.thresholds import Thresholds

# --------------------------------------------------------------------------- driving the pipeline


@dataclass
class Run:
    """A Pipeline fed one tick per second; keeps every snapshot.

    Like the monitor, it looks up the baselines of the models decoding at the last tick (with
    `baseline_lookup`, standing in for the store) and passes them into the next tick as data.
    """

    baseline_lookup: Callable[[ServerStatus, ModelStatus, Machine], Baseline | None] | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    t: float = 0.0
    snapshots: list[Snapshot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pipeline = Pipeline(self.thresholds)

    def tick(self, readings: ServerReading | Sequence[ServerReading], hw: HardwareSnapshot) -> Snapshot:
        batch = [readings] if isinstance(readings, ServerReading) else list(readings)
        self.t += 1.0
        machine = resolve_machine(hw)
        baselines: dict[tuple[str, str], Baseline] = {}
        if self.baseline_lookup is not None and self.snapshots:
            for server, model in self.snapshots[-1].models():
                found = self.baseline_lookup(server, model, machine) if model.phase == "decoding" else None
                if found is not None:
                    baselines[(server.url, model.name)] = found
        out = self.pipeline.process(batch, hw, {}, machine, self.t, WALL0 + self.t, priors=Priors(baselines))
        self.snapshots.append(out.snapshot)
        return out.snapshot

    def feed(self, readings: Iterable[ServerReading], hw: HardwareSnapshot) -> list[Snapshot]:
        return [self.tick(r, hw) for r in readings]

    @property
    def alerts(self) -> list[Alert]:
        return [a for s in self.snapshots for a in s.alerts]

    def kinds(self) -> set[str]:
        return {a.kind for a in self.alerts}

    def episodes(self, kind: str) -> dict[str, list[Alert]]:
        """Alert id → its appearances, for one kind."""
        out: dict[str, list[Alert]] = {}
        for alert in self.alerts:
            if alert.kind == kind:
                out.setdefault(alert.id, []).append(alert)
        return out

    def ended(self) -> list[Alert]:
        return [a for s in self.snapshots for a in s.ended_alerts]


def assert_one_episode(run: Run, kind: str) -> Alert:
    """Exactly one episode of `kind`: the same id on every tick it is listed, listed on consecutive ticks."""
    episodes = run.episodes(kind)
    assert len(episodes) == 1, f"expected one {kind} episode, got {list(episodes)}"
    (alert_id,) = episodes
    ticks = [i for i, s in enumerate(run.snapshots) if any(a.id == alert_id for a in s.alerts)]
    assert ticks == list(range(ticks[0], ticks[-1] + 1)), "the alert came and went: a repeat"
    return episodes[alert_id][-1]


def settle(run: Run, reading: ServerReading, hw: HardwareSnapshot, seconds: int) -> None:
    for _ in range(seconds):
        run.tick(reading, hw)


# --------------------------------------------------------------------------- scenarios


def test_healthy_session_raises_nothing() -> None:
    run = Run()
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=250, rate_tok_s=140.0, decode_s=20)
    polls += idle_slots(polls[-1], 5)
    polls += request_slots(task=2, prompt_tokens=900, rate_tok_s=138.0, decode_s=15)
    polls += idle_slots(polls[-1], 70)  # past the idle gap: the session ends
    run.feed((llama_reading(p) for p in polls), hw)

    assert run.alerts == [] and run.ended() == []
    decoding = [m for s in run.snapshots for _, m in s.models() if m.decode_tok_s is not None]
    assert len(decoding) >= 25
    for model in decoding:
        assert model.gpu_fraction == 1.0  # from NVML: the server's process holds the whole model
        # DOMAIN.md §1's 60–75 % band: 140 / (1008e9 / (4_920_753_328 + 250 × 131_072)) = 140 / 203.5 = 0.69
        # at the first request's start; 138 / (1008e9 / (4_920_753_328 + 2970 × 131_072)) = 138 / 189.8
        # = 0.73 at the second one's end.
        assert 0.6 < model.efficiency < 0.75  # type: ignore[operator]
    assert run.snapshots[-1].servers[0].models[0].session_id is None


def test_offload_at_load_raises_exactly_one_offload_alert() -> None:
    run = Run()
    ctx = 32768
    size, vram = QWEN_Q8_32K_SIZE, QWEN_Q8_32K_VRAM  # 44.3 GB, 48 % of it in VRAM
    runner = GpuProcess(pid=RUNNER_PID, name="llama-server", used_bytes=vram)
    hw = hardware(VRAM_TOTAL - 700_000_000, (runner,))  # Ollama fills the GPU
    # Loaded and idle, then a request decodes at ~2.4 tok/s (below the 3 tok/s floor).
    run.feed([ollama_reading(ollama_model(QWEN_32B_Q8, ctx, size, vram))] * 3, hw)
    polls = request_slots(task=1, prompt_tokens=400, rate_tok_s=2.4, decode_s=30)
    run.feed((ollama_reading(ollama_model(QWEN_32B_Q8, ctx, size, vram, p)) for p in polls), hw)

    # One root cause: no below_floor, and the full VRAM is part of the offload story.
    assert run.kinds() == {"offload"}
    assert len(run.snapshots[0].alerts) == 1  # a state: no confirmation window
    alert = assert_one_episode(run, "offload")
    assert alert.severity == "critical" and alert.server == OLLAMA_URL and alert.model == "qwen2.5:32b"

    status = run.snapshots[-2].servers[0].models[0]
    assert status.phase == "decoding" and status.decode_tok_s == pytest.approx(2.4, rel=0.1)
    ev = alert.evidence
    assert ev["cpu_share"] == pytest.approx(0.52, abs=0.005)  # 1 − 0.48
    full, split = ev["expected_full_gpu_tok_s"], ev["expected_split_tok_s"]
    assert isinstance(full, float) and isinstance(split, float)
    # Bytes per token ≈ 34.8 GB of weights (+ ~0.1 GB of KV at ~450 tokens × 262_144 B).
    # Full GPU (DOMAIN.md §1): 1008 GB/s ÷ 34.8 GB = 29.0 tok/s.
    assert full == pytest.approx(29.0, rel=0.05)
    # Split (DOMAIN.md §2): 1 / (0.48 × 34.8 / 1008 + 0.52 × 34.8 / 60) = 1 / (0.01657 + 0.30160 s) = 3.14.
    assert split == pytest.approx(3.14, rel=0.05)
    assert status.decode_tok_s is not None
    assert status.decode_tok_s < split < full  # what it does ≤ what the split allows ≪ full GPU
    assert "52 % on the CPU" in alert.message
    assert "expect at most ~3.1 tok/s instead of ~29 tok/s fully in GPU memory" in alert.message
    assert (
        f"expect at most ~{split:.1f} tok/s instead of ~{full:.0f} tok/s fully in GPU memory" in alert.message
    )
    # A computed fix: a Q4+ build at a shorter context, or a lossy step down at this context.
    # Q4_K_M: 34_807_500_000 × 4.89 / 8.50 = 20_024_550_000 B of weights. Room for KV in 24 GiB, by the
    # core's planning rule (runtime overhead 0.5 GiB + 2 % of the weights = 536_870_912 + 400_491_000;
    # DOMAIN.md gives no overhead rule): 25_769_803_776 − 20_024_550_000 − 937_361_912 = 4_807_891_864 B
    # ÷ 262_144 B/token = 18_340 tokens = 17.9 × 1024 → "17k" (rounded down).
    assert alert.fix.startswith("Q4_K_M with a context of 17k tokens fits;")
    # Q3_K_M (3.90 bpw, the core's estimate between Q3_K_S 3.64 and Q3_K_L 4.30, hardware.md §5.1):
    # 32.76e9 × 3.90 / 8 = 15_970_500_000 + KV 8_589_934_592 + overhead 536_870_912 + 319_410_000
    # = 25_416_715_504 B ≤ 25_769_803_776: fits at 32k.
    assert "Q3_K_M fits at this context (clear loss; coding hallucinations rise)" in alert.fix

    # Unloaded: the offload ends after the clear window, once.
    gone = ollama_reading()
    settle(run, gone, hardware(1_000_000_000), 25)
    ended = [a for a in run.ended() if a.kind == "offload"]
    assert [a.id for a in ended] == [alert.id]
    assert ended[0].ended_wall_s is not None and ended[0].ended_wall_s < WALL0 + run.t - 15
    assert run.snapshots[-1].alerts == ()


def test_raised_context_spills_and_the_cause_names_the_kv_growth() -> None:
    run = Run()
    small, big = 4096, 32768
    fits_size = QWEN_Q4_4K_SIZE  # 22.0 GB: all of it in VRAM
    spilled_size = QWEN_Q4_32K_SIZE  # 29.5 GB
    spilled_vram = 22_769_803_776  # Ollama fills the GPU but 3 GB: 25_769_803_776 − 3_000_000_000
    hw_fits = hardware(fits_size + 400_000_000, (GpuProcess(RUNNER_PID, "llama-server", fits_size),))
    hw_spilled = hardware(VRAM_TOTAL - 500_000_000, (GpuProcess(RUNNER_PID, "llama-server", spilled_vram),))

    run.feed([ollama_reading(ollama_model(QWEN_32B_Q4, small, fits_size, fits_size))] * 10, hw_fits)
    assert run.alerts == []
    run.tick(ollama_reading(), hardware(400_000_000))  # the user reloads it with num_ctx 32768
    run.feed([ollama_reading(ollama_model(QWEN_32B_Q4, big, spilled_size, spilled_vram))] * 10, hw_spilled)

    assert run.kinds() == {"offload"}
    first = next(a for a in run.alerts if a.kind == "offload")
    alert = assert_one_episode(run, "offload")
    # KV growth: (32768 − 4096) × 262_144 B = 28_672 × 262_144 = 7_516_192_768 B = 7.5 GB.
    cause = "The context was raised from 4k to 32k tokens and the KV cache grew by 7.5 GB."
    assert first.cause == cause and cause in first.message  # named from the very first tick
    assert alert.cause == cause
    # 1 − 22_769_803_776 / 29_514_484_592 = 1 − 0.77148 = 0.22852.
    assert alert.evidence["cpu_share"] == pytest.approx(0.2285, abs=0.001)
    assert "23 % on the CPU" in alert.message
    assert alert.severity == "critical"  # a quarter on the CPU: several times slower
    full, split = alert.evidence["expected_full_gpu_tok_s"], alert.evidence["expected_split_tok_s"]
    # Weights only (idle): full 1008 / 20.0 = 50.3 tok/s; split 1 / (0.7715 × 20.0 / 1008 + 0.2285 × 20.0
    # / 60) = 1 / (0.0153 + 0.0763 s) = 10.9 tok/s: 4.6× slower (more with the KV cache in the bytes).
    assert full / split >= 3  # type: ignore[operator]
    # The fix offers the old context back (or close to it), a q8_0 KV cache and a smaller quant.
    # The largest context that fits 24 GiB: 18_340 tokens (worked in the test above) → "17k",
    # between the old 4k and the new 32k.
    assert alert.fix.startswith("Lower the context to 17k tokens;")
    assert "a q8_0 KV cache" in alert.fix


def test_slow_kv_growth_raises_kv_slowdown_with_the_explained_share() -> None:
    run = Run()
    hw = llama_hardware()
    short_rate = 140.0
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=short_rate, decode_s=10)
    polls += idle_slots(polls[-1], 3)
    # A 16k-token follow-up: the KV cache now adds 2.1 GB to every token's reads. By DOMAIN.md §3,
    # time/token ∝ weights + KV: short (~600 tokens) 4_920_753_328 + 600 × 131_072 = 4_999_396_528 B;
    # deep (~16_300 tokens) 4_920_753_328 + 16_300 × 131_072 = 7_057_226_928 B. The KV model predicts
    # 140 × 4_999_396_528 / 7_057_226_928 = 140 × 0.7084 = 99.2 tok/s; it runs 3 % below that:
    # 99.2 × 0.97 = 96.2 tok/s, a drop of 1 − 96.2 / 140 = 31.3 %. Measured over each decode window
    # (middles ~860 and ~16_721 tokens) the KV model expects 1 − (4_920_753_328 + 860 × 131_072) /
    # (4_920_753_328 + 16_721 × 131_072) = 1 − 5_033_475_248 / 7_112_408_240 = 29.2 % of it:
    # an explained share of 29.2 / 31.3 = 0.93.
    deep_ctx = 16_000
    deep_rate = 96.2
    polls += request_slots(task=2, prompt_tokens=deep_ctx, rate_tok_s=deep_rate, decode_s=12, prefill_s=4)
    run.feed((llama_reading(p) for p in polls), hw)

    assert run.kinds() == {"kv_slowdown"}
    alert = assert_one_episode(run, "kv_slowdown")
    ev = alert.evidence
    assert ev["short_decode_tok_s"] == pytest.approx(short_rate, rel=0.02)
    assert ev["decode_tok_s"] == pytest.approx(deep_rate, rel=0.02)
    assert ev["drop_pct"] == pytest.approx(31.3, abs=1.5)  # 1 − 96.2 / 140
    assert ev["drop_pct"] >= 15  # type: ignore[operator]
    assert ev["context_tokens"] > deep_ctx  # type: ignore[operator]
    assert ev["explained_share"] == pytest.approx(0.93, abs=0.07)  # the KV model explains most of it
    assert "decodes 31 % slower at 16." in alert.message
    assert "KV-cache reads explain about" in alert.message
    assert "q8_0" in alert.fix


def test_a_fresh_conversation_ends_the_kv_slowdown_at_once() -> None:
    """After the 16k-token slowdown above, a new 300-token conversation in the same session: the
    episode ends at the first tick that sees the short context, not a 20 s clear window later."""
    run = Run()
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=140.0, decode_s=10)
    polls += idle_slots(polls[-1], 3)
    polls += request_slots(task=2, prompt_tokens=16_000, rate_tok_s=96.2, decode_s=12, prefill_s=4)
    deep_ticks = len(polls)
    polls += request_slots(task=3, prompt_tokens=300, rate_tok_s=140.0, decode_s=4)
    run.feed((llama_reading(p) for p in polls), hw)
    assert run.kinds() == {"kv_slowdown"}
    assert [a.kind for a in run.ended()] == ["kv_slowdown"]
    ended_at = next(i for i, s in enumerate(run.snapshots) if s.ended_alerts)
    assert ended_at == deep_ticks  # the fresh conversation's first poll (prefill of 300 tokens)
    assert not run.snapshots[ended_at].alerts


def test_drop_without_context_growth_is_not_kv_slowdown() -> None:
    run = Run()
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=140.0, decode_s=6)
    # 30 % slower a few hundred tokens deeper: the KV cache cannot explain that (it is not kv_slowdown).
    polls += request_slots(task=2, prompt_tokens=1000, rate_tok_s=100.0, decode_s=6)
    run.feed((llama_reading(p) for p in polls), hw)
    assert run.kinds() == set()


def test_throttling_gpu_raises_low_efficiency_naming_the_throttle() -> None:
    run = Run()
    throttle = ("hw_thermal", "sw_power_cap")  # as NvmlProbe names them (sources/gpu.py THROTTLE_BITS)
    hw = llama_hardware(throttle=throttle)
    # Ceiling at ~500 tokens: 1008e9 / (4_920_753_328 + 500 × 131_072) = 1008e9 / 4_986_289_328
    # = 202.2 tok/s; 30 % of it: 60.7 tok/s.
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=60.7, decode_s=20)
    snaps = run.feed((llama_reading(p) for p in polls), hw)

    assert run.kinds() == {"low_efficiency"}
    alert = assert_one_episode(run, "low_efficiency")
    # A rate needs a confirmation window: not on the first slow ticks.
    first_tick = next(i for i, s in enumerate(snaps) if s.alerts)
    first_slow = next(i for i, s in enumerate(snaps) if s.servers[0].models[0].decode_tok_s)
    assert first_tick - first_slow >= 5
    # 60.7 / 202.2 = 0.30 near the start; ~1500 tokens deep: 60.7 / (1008e9 / 5_117_361_328) = 0.31.
    assert alert.evidence["efficiency"] == pytest.approx(0.30, abs=0.02)
    assert alert.evidence["throttle_reasons"] == list(throttle)
    assert "hw_thermal" in alert.message and "throttling" in alert.message
    assert "other processes" not in alert.message  # a desktop's 300 MB is no GPU workload
    rate, ceiling_now = alert.evidence["decode_tok_s"], alert.evidence["ceiling_tok_s"]
    assert isinstance(rate, float) and isinstance(ceiling_now, float)
    share = f"{rate / ceiling_now * 100:.0f} %"
    assert f"decodes at {rate:.0f} tok/s, {share} of its {ceiling_now:.0f} tok/s ceiling" in alert.message
    assert "nvidia-smi" in alert.fix


def test_low_draft_acceptance_raises_draft_acceptance() -> None:
    run = Run()
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=135.0, decode_s=12)
    readings = []
    for i, poll in enumerate(polls):
        counters = None
        if i % 5 == 0:  # /metrics is read sparingly
            drafted = 1000.0 + 400 * i
            counters = CounterReading(
                tokens_predicted_total=5000.0 + 100 * i,
                tokens_predicted_seconds_total=40.0 + i,
                spec_draft_tokens_total=drafted,
                spec_accepted_tokens_total=drafted * 0.28,
                spec_drafts_total=drafted / 8,
            )
        readings.append(llama_reading(poll, counters=counters))
    run.feed(readings, hw)

    assert run.kinds() == {"draft_acceptance"}
    alert = assert_one_episode(run, "draft_acceptance")
    assert alert.evidence["draft_acceptance"] == pytest.approx(0.28, abs=0.01)
    assert "accepts only 28 % of drafted tokens" in alert.message
    assert "--draft-max" in alert.fix


def test_regression_after_a_server_update_names_both_versions() -> None:
    calls: list[str | None] = []

    def baseline_lookup(server: ServerStatus, model: ModelStatus, machine: Machine) -> Baseline | None:
        calls.append(model.quantization)
        return Baseline(
            decode_tok_s=150.0,
            context_tokens=600,
            server_version="b5000",
            session_id="20250601-101500-abc123",
            when_wall_s=WALL0 - 7 * 86400,
        )

    run = Run(baseline_lookup=baseline_lookup)
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=90.0, decode_s=15)
    run.feed((llama_reading(p, version="b6500") for p in polls), hw)

    assert calls and set(calls) == {"Q4_K_M"}
    assert run.kinds() == {"regression"}
    alert = assert_one_episode(run, "regression")
    ev = alert.evidence
    assert ev["baseline_version"] == "b5000" and ev["version"] == "b6500"
    assert ev["baseline_tok_s"] == 150.0
    assert ev["decode_tok_s"] == pytest.approx(90.0, rel=0.02)
    assert ev["drop_pct"] == pytest.approx(40.0, abs=1.5)  # 1 − 90 / 150
    # polled rates against a polled baseline: the 20 % mark plus the estimate's 10 points
    assert ev["exact"] is False and ev["needed_pct"] == 30.0
    assert "is slower since llama.cpp b5000 → b6500: 150 → 90 tok/s, 40 % below its baseline" in alert.message
    assert ev["engine"] == "llama.cpp"
    assert "earlier llama.cpp build (b5000)" in alert.fix


def test_a_deep_conversation_is_not_a_regression_against_a_short_baseline() -> None:
    baseline = Baseline(decode_tok_s=150.0, context_tokens=600, server_version="b5000", session_id="s0")
    run = Run(baseline_lookup=lambda *_: baseline)
    hw = llama_hardware()
    polls = request_slots(task=1, prompt_tokens=16_000, rate_tok_s=100.0, decode_s=12, prefill_s=4)
    run.feed((llama_reading(p, version="b6500") for p in polls), hw)
    assert run.kinds() == set()


def test_offload_also_explains_a_regression() -> None:
    """One root cause per model: an offloaded model slower than its baseline gets the offload alert only."""
    baseline = Baseline(decode_tok_s=30.0, context_tokens=500, server_version="0.11.0", session_id="s1")
    run = Run(baseline_lookup=lambda *_: baseline)
    ctx = 32768
    size, vram = QWEN_Q8_32K_SIZE, QWEN_Q8_32K_VRAM
    hw = hardware(VRAM_TOTAL - 700_000_000, (GpuProcess(RUNNER_PID, "llama-server", vram),))
    polls = request_slots(task=1, prompt_tokens=400, rate_tok_s=2.4, decode_s=15)
    run.feed((ollama_reading(ollama_model(QWEN_32B_Q8, ctx, size, vram, p)) for p in polls), hw)
    assert run.kinds() == {"offload"}


def test_offload_caused_by_another_loaded_model_names_it() -> None:
    """Two Ollama models share the GPU; NVML shows no process list (a container): the sibling is named."""
    run = Run()
    other = replace(
        ollama_model(LLAMA_8B, 8192, 6_300_000_000, 6_300_000_000), name="llama3.1:8b", server_pid=6000
    )
    # What is left of 24 GiB beside the sibling's 6.3 GB and 1.5 GB of buffers and driver reserve:
    # 25_769_803_776 − 6_300_000_000 − 1_500_000_000 = 17_969_803_776 B of 23_072_033_648.
    spilled = ollama_model(QWEN_32B_Q4, 8192, QWEN_Q4_8K_SIZE, 17_969_803_776)
    hw = hardware(VRAM_TOTAL - 600_000_000)
    run.feed([ollama_reading(other, spilled)] * 3, hw)
    assert run.kinds() == {"offload"}
    alert = assert_one_episode(run, "offload")
    assert alert.model == "qwen2.5:32b"
    assert alert.cause == "llama3.1:8b, also loaded, holds 6.3 GB of VRAM."
    assert alert.fix.startswith("Unload llama3.1:8b, which holds 6.3 GB of VRAM")


# --------------------------------------------------------------------------- smaller rules


def test_several_streams_are_not_low_efficiency() -> None:
    """Batching lowers the per-stream rate by design (DOMAIN.md §6)."""
    run = Run()
    hw = llama_hardware()
    for i in range(15):
        slots = (
            SlotReading(0, True, 1, 45 * i, 300 + 45 * i, n_ctx=32768),
            SlotReading(1, True, 2, 45 * i, 500 + 45 * i, n_ctx=32768),
            SlotReading(2, True, 3, 45 * i, 700 + 45 * i, n_ctx=32768),
        )
        reading = llama_reading(None)
        model = replace(reading.models[0], slots=slots, busy=True)
        run.tick(replace(reading, models=(model,)), hw)
    status = run.snapshots[-1].servers[0].models[0]
    assert status.active_streams == 3 and status.decode_total_tok_s == pytest.approx(135.0)
    assert run.kinds() == set()


def test_vram_pressure_alone_and_context_full() -> None:
    run = Run()
    base = llama_hardware()
    other = GpuProcess(pid=777, name="blender", used_bytes=14 * GB)
    gpu = replace(
        base.gpus[0], vram_used_bytes=VRAM_TOTAL - 600_000_000, processes=(*base.gpus[0].processes, other)
    )
    hw = replace(base, gpus=(gpu,))
    # A conversation at 29k of a 32k context, decoding normally.
    polls = request_slots(task=1, prompt_tokens=29_000, rate_tok_s=100.0, decode_s=6)
    run.feed((llama_reading(p) for p in polls), hw)
    assert run.kinds() == {"vram_pressure", "context_full"}
    pressure = assert_one_episode(run, "vram_pressure")
    assert pressure.server == "gpu:0" and pressure.model is None
    assert "blender 14.0 GB" in pressure.message
    full = assert_one_episode(run, "context_full")
    assert full.evidence["context_length"] == 32768
    assert "% full (29." in full.message and "of 32k tokens" in full.message


def test_vram_pressure_through_the_pipeline_offers_to_unload_the_idle_model() -> None:
    run = Run()
    model = ollama_model(QWEN_32B_Q4, 4096, QWEN_Q4_4K_SIZE, QWEN_Q4_4K_SIZE)  # all on the GPU, idle
    settle(run, ollama_reading(model), hardware(VRAM_TOTAL - 500_000_000), 3)
    pressure = assert_one_episode(run, "vram_pressure")
    assert "qwen2.5:32b" in pressure.fix
    assert pressure.fix_commands == ("ollama stop qwen2.5:32b",)


def test_server_down_after_confirmation_and_cold_load() -> None:
    run = Run()
    hw = llama_hardware()
    run.tick(llama_reading(SlotReading(0, False, 1, 10, 300, n_ctx=32768)), hw)
    down = llama_reading(None, status="unreachable")
    settle(run, down, hw, 3)
    assert run.kinds() == set()  # a blip is not an outage
    settle(run, down, hw, 5)
    assert run.kinds() == {"server_down"}
    alert = assert_one_episode(run, "server_down")
    assert alert.message == f"llama-server at {LLAMA_URL} stopped answering: connection refused."

    cold = Run()
    fin = FinishedRequest(model="Llama-3.1-8B-Instruct-Q4_K_M.gguf", finished_wall_s=WALL0, load_s=7.5)
    reading = replace(llama_reading(SlotReading(0, False, 1, 10, 300, n_ctx=32768)), finished=(fin,))
    cold.tick(reading, hw)
    assert cold.kinds() == {"cold_load"}
    (alert,) = cold.snapshots[0].alerts
    assert alert.severity == "info" and "7.5 s" in alert.message


def test_unknown_gpu_share_is_not_an_offload() -> None:
    """NVML that cannot see the server's process (a container) says nothing about where the model is."""
    run = Run()
    hw = hardware(8 * GB, ())  # no process list
    polls = request_slots(task=1, prompt_tokens=300, rate_tok_s=140.0, decode_s=8)
    run.feed((llama_reading(p) for p in polls), hw)
    assert run.kinds() == set()
    assert run.snapshots[-2].servers[0].models[0].gpu_fraction is None


# --------------------------------------------------------------------------- alert JSON


def test_alert_json_shape() -> None:
    run = Run()
    ctx = 32768
    hw = hardware(VRAM_TOTAL - 700_000_000)
    run.tick(ollama_reading(ollama_model(QWEN_32B_Q8, ctx, QWEN_Q8_32K_SIZE, QWEN_Q8_32K_VRAM)), hw)
    (alert,) = run.snapshots[0].alerts
    data = alert_json(alert)
    assert {"id", "kind", "severity", "server", "model", "message", "fix", "since", "evidence"} <= set(data)
    assert data["id"] == alert.id and data["kind"] == "offload" and data["severity"] == "critical"
    assert data["server"] == OLLAMA_URL and data["model"] == "qwen2.5:32b"
    assert data["since"].endswith("Z")
    since = datetime.fromisoformat(data["since"].replace("Z", "+00:00"))
    assert since.utcoffset() is not None and since.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert since.timestamp() == pytest.approx(WALL0 + 1.0)
    assert data["evidence"]["cpu_share"] == pytest.approx(0.52, abs=0.005)
    assert isinstance(data["evidence"]["expected_full_gpu_tok_s"], float)
    assert isinstance(data["evidence"]["expected_split_tok_s"], float)
    assert data["ended"] is None
    # Numbers in the message are the evidence, rounded as a user reads them.
    share = re.search(r"is (\d+) % on the CPU", data["message"])
    assert share is not None and int(share.group(1)) == round(data["evidence"]["cpu_share"] * 100) == 52


def test_one_shot_reports_state_findings_without_a_window() -> None:
    pipeline = Pipeline(one_shot=True)
    ctx = 32768
    hw = hardware(VRAM_TOTAL - 700_000_000)
    fits = replace(ollama_model(QWEN_32B_Q4, 4096, 21 * GB, 21 * GB), name="qwen2.5:32b-q4")
    reading = ollama_reading(ollama_model(QWEN_32B_Q8, ctx, QWEN_Q8_32K_SIZE, QWEN_Q8_32K_VRAM), fits)
    out = pipeline.process([reading], hw, {}, resolve_machine(hw), 5.0, WALL0)
    assert [(a.kind, a.model) for a in out.snapshot.alerts] == [("offload", "qwen2.5:32b")]
