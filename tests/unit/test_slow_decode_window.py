"""The live decode window of a server slower than one token per window (the rates stage).

Seen beside the CI host's busy neighbour: a server decoding ~0.5 tok/s read 0.0 tok/s in a 4 s
window that fell between two tokens, and `below_floor` quoted that 0.0. The window keeps at least
one new token, so the rate is tokens over the seconds since an earlier one. Expected values are
hand arithmetic over the polled counts."""

from __future__ import annotations

import pytest

from tests.support import snapshots
from trayapp.core.model import ModelReading, ServerReading, SlotReading
from trayapp.core.rates import MAX_WINDOW_POINTS, RATE_WINDOW_S, STALL_AFTER_S, RateEstimate, RateTracker

MODEL = "gemma-3-270m-q4_k_m.gguf"


def _poll(tracker: RateTracker, t_s: float, decoded: int) -> RateEstimate:
    slot = SlotReading(
        slot_id=0, is_processing=True, task_id=1, n_decoded=decoded, context_tokens=100 + decoded, n_ctx=4096
    )
    reading = ServerReading(
        kind="llamacpp", url=snapshots.LLAMA, status="ok", models=(ModelReading(name=MODEL, slots=(slot,)),)
    )
    return tracker.update(reading, t_s, 1_750_000_000.0 + t_s).models[MODEL]


def test_a_token_every_six_seconds_reads_about_a_sixth_never_zero() -> None:
    tracker = RateTracker()
    rates: list[float | None] = []
    for second in range(0, 31):  # one poll a second; token k arrives at 6k s (k = 1..5)
        rates.append(_poll(tracker, float(second), 1 + second // 6).decode_tok_s)
    assert rates[:6] == [None] * 6  # one count only (the first token): no rate yet, never 0 tok/s
    # from the poll that first saw one count to the poll that first saw a later one: 1 token in 6 s
    assert rates[6:] == [pytest.approx(1 / 6)] * 25, rates


def test_a_stream_that_slows_reads_lower_before_its_next_token() -> None:
    tracker = RateTracker()
    for second in range(0, 6):
        _poll(tracker, float(second), 1 + 20 * second)  # 20 tok/s: 101 tokens at 5 s
    # then nothing: from the window's start at 1 s (21 tokens), at most the next token has come
    readings = {second: _poll(tracker, float(second), 101).decode_tok_s for second in range(6, 10)}
    assert readings == {s: pytest.approx((101 - 21 + 1) / (s - 1)) for s in range(6, 10)}  # 16.2 … 10.1


def test_a_fast_stream_keeps_its_four_second_window() -> None:
    tracker = RateTracker()
    for second in range(0, 11):
        rate = _poll(tracker, float(second), 1 + 20 * second).decode_tok_s
    assert rate == pytest.approx(20.0)  # 20 tokens a second over the last RATE_WINDOW_S
    assert RATE_WINDOW_S == 4.0


def test_a_stalled_stream_says_stalled_and_its_window_stays_bounded() -> None:
    tracker = RateTracker()
    _poll(tracker, 0.0, 1)
    _poll(tracker, 1.0, 2)
    for second in range(2, 2 + 3 * MAX_WINDOW_POINTS):
        estimate = _poll(tracker, float(second), 2)
    assert second - 1 >= STALL_AFTER_S and estimate.phase == "stalled"
    state = next(iter(tracker._tracks.values())).slots[0]
    assert len(state.points) <= MAX_WINDOW_POINTS
