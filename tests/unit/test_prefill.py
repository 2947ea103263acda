"""Prefill progress (#11): the rates stage on synthetic llama-server slots reading a prompt, and what
the tooltip, the icon, the JSON and the Prometheus gauges make of it.

Expected values are hand arithmetic on the slot readings below (tokens ÷ seconds between polls).
"""

from __future__ import annotations

import pytest

from tests.support import snapshots
from tests.support.metrics import scrape, value
from trayapp.core.glance import icon_state, prefill_line
from trayapp.core.jsonview import model_json
from trayapp.core.model import ModelReading, ModelStatus, PrefillProgress, ServerReading, SlotReading
from trayapp.core.rates import RateEstimate, RateTracker
from trayapp.sinks.metrics import MetricsState

URL = snapshots.LLAMA
MODEL = "gemma-3-270m-q4_k_m.gguf"
WALL0 = 1_750_000_000.0


def slot(
    processed: int,
    *,
    cached: int = 0,
    decoded: int = 0,
    total: int | None = None,
    slot_id: int = 0,
    task: int = 1,
) -> SlotReading:
    """A busy slot with `processed` prompt tokens evaluated and `cached` reused from the cache."""
    return SlotReading(
        slot_id=slot_id,
        is_processing=True,
        task_id=task,
        n_decoded=decoded,
        context_tokens=processed + cached + decoded,
        prompt_tokens_processed=processed,
        prompt_tokens_cached=cached,
        prompt_tokens_total=total,
        n_ctx=4096,
    )


def estimate(tracker: RateTracker, t_s: float, *slots: SlotReading) -> RateEstimate:
    """The model's estimate after one poll at monotonic time `t_s`."""
    reading = ServerReading(
        kind="llamacpp", url=URL, status="ok", models=(ModelReading(name=MODEL, slots=slots),)
    )
    return tracker.update(reading, t_s, WALL0 + t_s).models[MODEL]


# --------------------------------------------------------------------------- the rates stage


def test_progress_rises_with_the_evaluated_tokens_and_the_rate_is_tokens_over_seconds() -> None:
    tracker = RateTracker()
    first = estimate(tracker, 0.0, slot(0))
    assert first.phase == "prefill"
    assert first.prefill == PrefillProgress(tokens_done=0, cached_tokens=0)  # one poll: no rate yet
    second = estimate(tracker, 1.0, slot(128))
    assert second.prefill == PrefillProgress(128, 0, None, 128.0, None)  # 128 tokens in 1 s
    third = estimate(tracker, 2.0, slot(256))
    assert third.prefill == PrefillProgress(256, 0, None, 128.0, None)  # 256 tokens in 2 s
    fourth = estimate(tracker, 4.0, slot(512))
    assert fourth.prefill is not None and fourth.prefill.tok_s == pytest.approx(128.0)  # 512 in 4 s
    # llama-server says no total: no share and no ETA, never a guess.
    assert fourth.prefill.tokens_total is None and fourth.prefill.share is None
    assert fourth.prefill.eta_s is None


def test_cached_prompt_tokens_count_as_done_but_not_in_the_rate() -> None:
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(0, cached=3000))
    progress = estimate(tracker, 2.0, slot(100, cached=3000)).prefill
    assert progress is not None
    assert (progress.tokens_done, progress.cached_tokens) == (3100, 3000)
    assert progress.tok_s == pytest.approx(50.0)  # 100 evaluated tokens in 2 s; the 3000 cost nothing
    assert progress.mostly_cached  # 3000 of 3100 from the cache


def test_two_slots_reading_prompts_are_summed() -> None:
    """Both first seen midway (tokens already read): their rates start at the second poll."""
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(64, slot_id=0, task=1), slot(32, cached=1000, slot_id=1, task=2))
    estimate(tracker, 1.0, slot(128, slot_id=0, task=1), slot(64, cached=1000, slot_id=1, task=2))
    progress = estimate(
        tracker, 3.0, slot(384, slot_id=0, task=1), slot(192, cached=1000, slot_id=1, task=2)
    ).prefill
    assert progress is not None
    assert progress.tokens_done == 384 + 192 + 1000
    assert progress.cached_tokens == 1000
    # (384 − 128) ÷ 2 s = 128 tok/s, plus (192 − 64) ÷ 2 s = 64 tok/s.
    assert progress.tok_s == pytest.approx(192.0)
    assert progress.tokens_total is None and progress.eta_s is None


def test_a_known_total_gives_share_and_eta() -> None:
    tracker = RateTracker()
    first = estimate(tracker, 0.0, slot(0, total=2000)).prefill
    assert first is not None and first.share == 0.0 and first.eta_s is None  # no rate yet: no ETA
    estimate(tracker, 2.0, slot(400, total=2000))
    progress = estimate(tracker, 4.0, slot(800, total=2000)).prefill
    assert progress is not None
    assert progress.tokens_total == 2000
    assert progress.tok_s == pytest.approx(200.0)  # 800 tokens in 4 s
    assert progress.share == pytest.approx(0.4)  # 800 / 2000
    assert progress.eta_s == pytest.approx(6.0)  # (2000 − 800) ÷ 200 tok/s


def test_two_slots_with_totals_sum_totals_and_the_eta_uses_the_summed_rate() -> None:
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(0, total=1000, slot_id=0, task=1), slot(0, total=3000, slot_id=1, task=2))
    progress = estimate(
        tracker, 2.0, slot(200, total=1000, slot_id=0, task=1), slot(300, total=3000, slot_id=1, task=2)
    ).prefill
    assert progress is not None
    assert progress.tokens_total == 4000
    assert progress.tok_s == pytest.approx(250.0)  # 100 + 150 tok/s
    assert progress.eta_s == pytest.approx(14.0)  # (4000 − 500) ÷ 250


def test_no_total_when_one_of_the_prompts_has_none() -> None:
    """A share of a partial total would be a made-up number: unknown instead."""
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(0, total=1000, slot_id=0, task=1), slot(0, slot_id=1, task=2))
    progress = estimate(
        tracker, 2.0, slot(200, total=1000, slot_id=0, task=1), slot(300, slot_id=1, task=2)
    ).prefill
    assert progress is not None and progress.tokens_done == 500
    assert progress.tokens_total is None and progress.share is None and progress.eta_s is None


def batch_slot(evaluated: int, kv_fill: int, *, decoded: int = 0, total: int | None = None) -> SlotReading:
    """llama-server's /slots while it reads a prompt in 2,048-token batches: `n_prompt_tokens_processed`
    stays at 1 through the first batch and trails a batch after; `n_prompt_tokens` (the KV fill)
    already holds the batch being read."""
    return SlotReading(
        slot_id=0, is_processing=True, task_id=1, n_decoded=decoded, context_tokens=kv_fill,
        prompt_tokens_processed=evaluated, prompt_tokens_total=total, n_ctx=8192,
    )  # fmt: skip


def test_prefill_progress_from_the_first_batch() -> None:
    """The count is the server's best figure from the first poll (2,048, not 1); the rate is this
    prompt's own, between the polls that saw the count change: (5000 − 4096) ÷ (22 − 12) s."""
    tracker = RateTracker()
    first = estimate(tracker, 1.0, batch_slot(1, 2048, total=5000)).prefill
    assert first is not None and first.tokens_done == 2048 and first.share == pytest.approx(2048 / 5000)
    assert first.tok_s is None and first.eta_s is None  # one poll, midway: no rate yet
    assert estimate(tracker, 2.0, batch_slot(1, 2048, total=5000)).prefill.tokens_done == 2048  # type: ignore[union-attr]
    second = estimate(tracker, 12.0, batch_slot(2048, 4096, total=5000)).prefill
    assert second is not None and second.tok_s is None  # the first poll came midway: left out
    third = estimate(tracker, 22.0, batch_slot(4096, 5000, total=5000)).prefill
    assert third is not None and third.tokens_done == 5000
    assert third.tok_s == pytest.approx(90.4)  # (5000 − 4096) ÷ 10 s
    assert third.eta_s == pytest.approx(0.0)


def test_the_eta_uses_this_prompts_own_rate() -> None:
    """Batches every 5 s after a midway first poll: (6144 − 4096) ÷ (11 − 6) s = 409.6 tok/s, and
    (10000 − 6144) ÷ 409.6 ≈ 9.4 s left — the rate of this prompt, not of the last request."""
    tracker = RateTracker()
    estimate(tracker, 1.0, batch_slot(1, 2048, total=10_000))
    estimate(tracker, 6.0, batch_slot(2048, 4096, total=10_000))
    progress = estimate(tracker, 11.0, batch_slot(4096, 6144, total=10_000)).prefill
    assert progress is not None and progress.tok_s == pytest.approx(409.6)
    assert progress.eta_s == pytest.approx((10_000 - 6144) / 409.6)


def test_ttft_is_estimated_only_from_the_prompts_own_rate() -> None:
    """A long prompt read at 200 tok/s, then a short one never seen reading: no TTFT for it (the
    long prompt's speed applied to it was 4–90× off), not the last request's figure either."""
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(0))
    estimate(tracker, 1.0, slot(200))
    estimate(tracker, 2.0, slot(400))
    decoding = estimate(tracker, 3.0, slot(500, decoded=3))
    assert decoding.ttft_s == pytest.approx(2.5) and decoding.ttft_exact is False  # 500 ÷ 200 tok/s
    estimate(tracker, 4.0, SlotReading(0, False, 1, 3, 503, prompt_tokens_processed=500, n_ctx=4096))
    short = estimate(tracker, 5.0, slot(20, decoded=2, task=2))
    assert short.phase == "decoding" and short.ttft_s is None and short.ttft_exact is None


def test_the_first_decoded_token_ends_prefill() -> None:
    tracker = RateTracker()
    estimate(tracker, 0.0, slot(0))
    assert estimate(tracker, 1.0, slot(512)).prefill is not None
    decoding = estimate(tracker, 2.0, slot(1024, decoded=5))
    assert decoding.phase == "decoding"
    assert decoding.prefill is None


# --------------------------------------------------------------------------- tooltip and icon


def reading_prompt(progress: PrefillProgress) -> ModelStatus:
    return snapshots.model(MODEL, "prefill", prefill=progress, context_tokens=progress.tokens_done)


def test_tooltip_line_without_a_total() -> None:
    line = prefill_line(reading_prompt(PrefillProgress(3500, 0, None, 250.0)))
    assert line == "reading prompt 3.5k tokens so far · ~250 tok/s"  # ~: a polled speed


def test_tooltip_line_with_a_total_share_and_eta() -> None:
    progress = PrefillProgress(12_400, 0, 28_000, 250.0, (28_000 - 12_400) / 250.0)  # 62.4 s
    assert prefill_line(reading_prompt(progress)) == "reading prompt 12.4k / 28k · 44 % · ~250 tok/s · ~62 s"


def test_tooltip_line_says_when_the_prompt_is_mostly_cached() -> None:
    line = prefill_line(reading_prompt(PrefillProgress(3100, 3000, None, 50.0)))
    assert line == "reading prompt 3.1k tokens so far · ~50 tok/s · 3k from the cache"


def test_tooltip_line_before_any_rate() -> None:
    assert prefill_line(reading_prompt(PrefillProgress(0, 0))) == "reading prompt 0 tokens so far"


def test_icon_while_reading_a_prompt_shows_the_token_count_and_no_ceiling_ring() -> None:
    progress = PrefillProgress(3400, 0, None, 250.0)
    state = icon_state(snapshots.snap(10.0, snapshots.server(reading_prompt(progress))))
    assert state.health == "ok"
    assert state.prefill
    assert state.text == "3k"
    assert state.ring is None  # no total: no share to draw (not the ceiling share either)
    assert state.tooltip_lines[1] == "reading prompt 3.4k tokens so far · ~250 tok/s"


def test_icon_ring_is_the_share_of_the_prompt_when_the_total_is_known() -> None:
    progress = PrefillProgress(12_400, 0, 28_000, 250.0, 62.4)
    state = icon_state(snapshots.snap(10.0, snapshots.server(reading_prompt(progress))))
    assert state.prefill and state.text == "12k"
    assert state.ring == 0.45  # 12.4k / 28k = 0.443, in 5 % steps


def test_decoding_icon_is_not_a_prefill_icon() -> None:
    state = icon_state(snapshots.snap(10.0, snapshots.server(snapshots.model(MODEL, "decoding", 42.0))))
    assert not state.prefill and state.text == "42"


# --------------------------------------------------------------------------- JSON and Prometheus


def test_json_fields() -> None:
    progress = PrefillProgress(12_400, 200, 28_000, 250.0, 62.4)
    fields = model_json(reading_prompt(progress))
    assert fields["phase"] == "prefill"
    assert fields["prefill_tokens_done"] == 12_400
    assert fields["prefill_cached_tokens"] == 200
    assert fields["prefill_tokens_total"] == 28_000
    assert fields["prefill_tok_s"] == 250.0
    assert fields["prefill_eta_s"] == 62.4
    idle = model_json(snapshots.model(MODEL, "idle"))
    assert [idle[k] for k in sorted(idle) if k.startswith("prefill_")] == [None] * 5


def test_json_fields_for_llama_server_have_no_total_and_no_eta() -> None:
    fields = model_json(reading_prompt(PrefillProgress(3500, 0, None, 250.0)))
    assert (fields["prefill_tokens_done"], fields["prefill_tok_s"]) == (3500, 250.0)
    assert fields["prefill_tokens_total"] is None and fields["prefill_eta_s"] is None


def test_prometheus_gauges() -> None:
    state = MetricsState()
    progress = PrefillProgress(12_400, 200, 28_000, 250.0, 62.4)
    state.observe(snapshots.snap(10.0, snapshots.server(reading_prompt(progress))))
    samples = scrape(state)
    labels = {"server": URL, "kind": "llamacpp", "model": MODEL}
    assert value(samples, "llm_tray_prefill_tokens_done", **labels) == 12_400
    assert value(samples, "llm_tray_prefill_cached_tokens", **labels) == 200
    assert value(samples, "llm_tray_prefill_tokens_total", **labels) == 28_000
    assert value(samples, "llm_tray_prefill_tokens_per_second", **labels) == 250.0
    assert value(samples, "llm_tray_prefill_eta_seconds", **labels) == 62.4


def test_prometheus_leaves_unknown_prefill_gauges_out() -> None:
    state = MetricsState()
    state.observe(snapshots.snap(10.0, snapshots.server(reading_prompt(PrefillProgress(3500, 0)))))
    samples = scrape(state)
    assert value(samples, "llm_tray_prefill_tokens_done", model=MODEL) == 3500
    assert "llm_tray_prefill_tokens_total" not in samples  # unknown is absent, not zero
    assert "llm_tray_prefill_eta_seconds" not in samples
    assert "llm_tray_prefill_tokens_per_second" not in samples
