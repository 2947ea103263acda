"""The rates and sessions stages on synthetic llama-server / vLLM sample streams (pure, time passed in).

They run as the pipeline runs them (`Pipeline.process`, one server, no GPU), so a status is
checked as the user gets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.machine import resolve_machine
from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelReading,
    ModelStatus,
    RequestRecord,
    ServerReading,
    SessionRecord,
    SlotReading,
)
from trayapp.core.pipeline import Pipeline

URL = "http://127.0.0.1:8080"
MODEL = "Llama-3.1-8B-Instruct-Q4_K_M.gguf"
WALL0 = 1_750_000_000.0  # wall clock at mono 0
NO_GPU = HardwareSnapshot(gpus=(), host=HostReading(None, None, None))


@dataclass(frozen=True)
class TickResult:
    models: tuple[ModelStatus, ...]
    requests: tuple[RequestRecord, ...]
    sessions: tuple[SessionRecord, ...]


class Stages:
    """The pipeline's rates → placement → sessions → statuses stages for one server."""

    def __init__(self, idle_gap_s: float = 60.0) -> None:
        self.pipeline = Pipeline(idle_gap_s=idle_gap_s)

    def update(self, r: ServerReading, now_mono_s: float, now_wall_s: float) -> TickResult:
        out = self.pipeline.process([r], NO_GPU, {}, resolve_machine(NO_GPU), now_mono_s, now_wall_s)
        server = out.snapshot.servers[0]
        return TickResult(server.models, out.snapshot.requests, out.sessions)

    def open_sessions(self) -> list[SessionRecord]:
        return self.pipeline.sessions.open_sessions()


def slot(
    n: int | None = 0,
    *,
    task: int | None = 1,
    processing: bool = True,
    ctx: int | None = None,
    slot_id: int = 0,
    prompt_done: int | None = None,
) -> SlotReading:
    """A llama-server slot; `ctx` defaults to a 200-token prompt plus what was generated."""
    context = ctx if ctx is not None else 200 + (n or 0)
    return SlotReading(
        slot_id=slot_id,
        is_processing=processing,
        task_id=task,
        n_decoded=n,
        context_tokens=context,
        prompt_tokens_processed=prompt_done,
        n_ctx=8192,
    )


def reading(
    *slots: SlotReading,
    counters: CounterReading | None = None,
    finished: Sequence[FinishedRequest] = (),
    status: str = "ok",
    age_s: float | None = None,
    t_mono_s: float | None = None,
    kind: str = "llamacpp",
) -> ServerReading:
    models: tuple[ModelReading, ...] = ()
    if status == "ok":
        models = (ModelReading(name=MODEL, context_length=8192, slots=tuple(slots), counters=counters),)
    return ServerReading(
        kind=kind,
        url=URL,
        status=status,  # type: ignore[arg-type]
        version="b6500",
        models=models,
        finished=tuple(finished),
        age_s=age_s,
        t_mono_s=t_mono_s,
    )


def tick(engine: Stages, r: ServerReading, t: float, wall: float | None = None) -> TickResult:
    return engine.update(r, t, WALL0 + t if wall is None else wall)


def only(result: TickResult) -> ModelStatus:
    assert len(result.models) == 1
    return result.models[0]


def decode_run(engine: Stages, start_t: float, seconds: int, rate: float, task: int = 1) -> list[ModelStatus]:
    """A request: one poll in prefill at `start_t`, then `seconds` polls 1 s apart decoding at `rate`."""
    out = [only(tick(engine, reading(slot(0, task=task)), start_t))]
    for i in range(1, seconds + 1):
        out.append(only(tick(engine, reading(slot(round(rate * i), task=task)), start_t + i)))
    return out


# --------------------------------------------------------------------------- live rates


def test_steady_decode_is_measured_from_n_decoded_and_flagged_estimated() -> None:
    engine = Stages()
    statuses = decode_run(engine, 0.0, 8, 50.0)
    last = statuses[-1]
    assert last.phase == "decoding"
    assert last.decode_tok_s == pytest.approx(50.0, rel=0.01)
    assert last.decode_total_tok_s == pytest.approx(50.0, rel=0.01)
    assert last.active_streams == 1
    assert last.decode_exact is False
    assert last.context_tokens == 200 + 400


def test_first_poll_after_prefill_gives_no_rate_and_prefill_never_leaks_in() -> None:
    engine = Stages()
    # A 2 s prefill: the first poll sees n_decoded = 0, the next (2 s later) already 30.
    assert only(tick(engine, reading(slot(0, ctx=4000)), 0.0)).phase == "prefill"
    first = only(tick(engine, reading(slot(30, ctx=4030)), 2.0))
    assert first.phase == "decoding"
    assert first.decode_tok_s is None  # not 30 / 2 s, which would mix prefill into decode
    second = only(tick(engine, reading(slot(80, ctx=4080)), 3.0))
    assert second.decode_tok_s == pytest.approx(50.0)  # (80 - 30) / 1 s, not 80 / 3 s


def test_phase_sequence_and_request_record_on_completion() -> None:
    engine = Stages()
    phases = [s.phase for s in decode_run(engine, 0.0, 5, 50.0)]
    done = tick(engine, reading(slot(260, processing=False)), 6.0)
    phases.append(only(done).phase)
    assert phases == ["prefill", *["decoding"] * 5, "idle"]

    assert len(done.requests) == 1
    record = done.requests[0]
    assert record.exact is False and record.source == "slots"
    assert record.decode_tok_s == pytest.approx(50.0)  # over the polls that saw it decoding
    assert record.decode_tokens == 260  # the final count, seen once it finished
    assert record.server == URL and record.model == MODEL
    assert record.session_id is not None and record.session_id == only(done).session_id
    idle = only(done)
    assert idle.decode_tok_s is None and idle.decode_total_tok_s is None and idle.active_streams == 0
    assert idle.last_decode_tok_s == pytest.approx(50.0)
    # Reported once: later idle polls of the same finished slot add nothing.
    assert tick(engine, reading(slot(260, processing=False)), 7.0).requests == ()


def test_finished_slot_seen_at_start_up_is_not_reported() -> None:
    engine = Stages()
    result = tick(engine, reading(slot(500, processing=False, task=41)), 0.0)
    assert result.requests == () and only(result).phase == "idle" and only(result).session_id is None


def test_a_task_that_ends_between_polls_is_reported_when_the_next_one_starts() -> None:
    engine = Stages()
    decode_run(engine, 0.0, 4, 40.0, task=1)
    result = tick(engine, reading(slot(10, task=2)), 5.0)
    assert [r.decode_tok_s for r in result.requests] == [pytest.approx(40.0)]
    assert only(result).decode_tok_s is None  # the new task has one decoding point only


def test_prompt_rate_from_prefill_progress() -> None:
    """llama-server reads a 3,000-token prompt in 1,000-token batches: its KV fill (`ctx`) holds the
    batch in flight, its evaluated count trails. The first poll came midway (left out); then 1,000
    tokens between the polls at 1 s and 2 s: 1,000 tok/s."""
    engine = Stages()
    tick(engine, reading(slot(0, ctx=1000, prompt_done=1)), 0.0)
    tick(engine, reading(slot(0, ctx=2000, prompt_done=1000)), 1.0)
    tick(engine, reading(slot(0, ctx=3000, prompt_done=2000)), 2.0)
    tick(engine, reading(slot(20, ctx=3020, prompt_done=3000)), 3.0)
    tick(engine, reading(slot(70, ctx=3070, prompt_done=3000)), 4.0)
    done = tick(engine, reading(slot(90, ctx=3090, processing=False, prompt_done=3000)), 5.0)
    record = done.requests[0]
    assert record.prompt_tok_s == pytest.approx(1000.0)
    assert record.decode_tok_s == pytest.approx(50.0)
    assert only(done).prompt_tok_s == pytest.approx(1000.0)
    assert only(done).prompt_exact is False  # polled: shown with '~'


# --------------------------------------------------------------------------- restarts and glitches


def _assert_sane(statuses: Sequence[ModelStatus], limit: float = 200.0) -> None:
    for status in statuses:
        for value in (status.decode_tok_s, status.decode_total_tok_s, status.last_decode_tok_s):
            assert value is None or 0 <= value <= limit, statuses


def test_n_decoded_going_backwards_resets_without_a_bogus_rate() -> None:
    engine = Stages()
    statuses = decode_run(engine, 0.0, 4, 50.0, task=7)
    # Same task id, counter back to 5: the server restarted (task ids start again).
    after = only(tick(engine, reading(slot(5, task=7)), 5.0))
    assert after.decode_tok_s is None
    recovered = only(tick(engine, reading(slot(55, task=7)), 6.0))
    assert recovered.decode_tok_s == pytest.approx(50.0)
    _assert_sane([*statuses, after, recovered])


def test_new_task_id_starts_a_fresh_rate() -> None:
    engine = Stages()
    decode_run(engine, 0.0, 3, 50.0, task=7)
    # A new request that decoded 400 tokens before we saw it: not (400 - 150) / 1 s.
    jump = only(tick(engine, reading(slot(400, task=8)), 4.0))
    assert jump.decode_tok_s is None
    recovered = only(tick(engine, reading(slot(450, task=8)), 5.0))
    assert recovered.decode_tok_s == pytest.approx(50.0)


def test_a_server_outage_never_lets_a_rate_span_it() -> None:
    engine = Stages()
    decode_run(engine, 0.0, 3, 50.0, task=3)
    down = tick(engine, reading(status="unreachable"), 4.0)
    assert down.models == ()
    assert [r.decode_tok_s for r in down.requests] == [pytest.approx(50.0)]  # what was seen, reported once
    assert tick(engine, reading(status="unreachable"), 5.0).requests == ()
    # Restarted with the same task id and a larger count 20 s later: no rate across the gap.
    back = only(tick(engine, reading(slot(400, task=3)), 25.0))
    assert back.decode_tok_s is None
    assert only(tick(engine, reading(slot(450, task=3)), 26.0)).decode_tok_s == pytest.approx(50.0)


def vllm(
    tokens: float, running: float, ttft_sum: float = 0.0, ttft_n: float = 0.0, decode_s_sum: float = 0.0
) -> ServerReading:
    """As the vLLM adapter reads /metrics: the token counter runs live, the timing sums move at finish."""
    counters = CounterReading(
        tokens_predicted_total=tokens,
        tokens_predicted_seconds_total=decode_s_sum,
        prompt_tokens_total=tokens / 4,
        prompt_seconds_total=decode_s_sum / 50,
        requests_running=running,
        ttft_sum_s=ttft_sum,
        ttft_count=ttft_n,
    )
    model = ModelReading(name="Qwen/Qwen3-8B", counters=counters, busy=running > 0)
    return ServerReading(kind="vllm", url="http://127.0.0.1:8000", status="ok", models=(model,))


def test_counters_going_backwards_give_no_rate_then_recover() -> None:
    engine = Stages()
    statuses = [
        only(tick(engine, vllm(10_000, 1), 0.0)),
        only(tick(engine, vllm(10_100, 1), 1.0)),
        only(tick(engine, vllm(40, 1), 2.0)),  # restarted: counters from zero
        only(tick(engine, vllm(140, 1), 3.0)),
    ]
    assert statuses[1].decode_tok_s == pytest.approx(100.0)
    assert statuses[2].decode_tok_s is None
    assert statuses[3].decode_tok_s == pytest.approx(100.0)
    _assert_sane(statuses)


def test_vllm_counters_give_total_and_per_stream_throughput() -> None:
    engine = Stages()
    first = only(tick(engine, vllm(0, 0), 0.0))
    assert first.phase == "idle" and first.decode_tok_s is None
    waiting = only(tick(engine, vllm(0, 3), 1.0))
    assert waiting.phase == "prefill"  # admitted, no token generated since the last poll
    busy = only(tick(engine, vllm(600, 3, ttft_sum=1.5, ttft_n=3), 3.0))
    assert busy.phase == "decoding"
    assert busy.decode_total_tok_s == pytest.approx(300.0)
    assert busy.decode_tok_s == pytest.approx(100.0)
    assert busy.active_streams == 3
    assert busy.decode_exact is False
    assert busy.ttft_s == pytest.approx(0.5)
    # One request finished (its decode time lands in the sum) while two keep going: the live
    # token counter, not tokens ÷ finished seconds, is the rate.
    more = only(tick(engine, vllm(900, 2, ttft_sum=1.5, ttft_n=3, decode_s_sum=2.0), 4.0))
    assert more.decode_total_tok_s == pytest.approx(300.0) and more.decode_tok_s == pytest.approx(150.0)
    assert more.last_decode_tok_s == pytest.approx(150.0)  # not 300 tokens / 2 s
    idle = only(tick(engine, vllm(900, 0, ttft_sum=1.5, ttft_n=3, decode_s_sum=2.0), 5.0))
    assert idle.phase == "idle" and idle.decode_tok_s is None
    assert idle.last_decode_tok_s == pytest.approx(150.0)


def test_two_slots_report_per_stream_and_total_throughput() -> None:
    engine = Stages()
    for i in range(5):
        status = only(
            tick(
                engine,
                reading(slot(50 * i, task=1, slot_id=0), slot(30 * i, task=2, slot_id=1, ctx=5000 + 30 * i)),
                float(i),
            )
        )
    assert status.decode_tok_s == pytest.approx(40.0)  # mean per stream
    assert status.decode_total_tok_s == pytest.approx(80.0)
    assert status.active_streams == 2
    assert status.context_tokens == 5000 + 120  # the deepest active context


def test_no_progress_for_a_while_is_stalled() -> None:
    engine = Stages()
    decode_run(engine, 0.0, 3, 50.0)
    phases = [only(tick(engine, reading(slot(150)), 3.0 + s)).phase for s in (1, 5, 9, 10, 14)]
    assert phases == ["decoding", "decoding", "decoding", "stalled", "stalled"]
    stalled = only(tick(engine, reading(slot(150)), 20.0))
    assert stalled.decode_tok_s is None
    assert only(tick(engine, reading(slot(200)), 21.0)).phase == "decoding"


# --------------------------------------------------------------------------- exact statistics


def test_finished_request_with_server_timings_is_exact() -> None:
    engine = Stages()
    fin = FinishedRequest(
        model=MODEL,
        finished_wall_s=WALL0 + 1.5,
        prompt_tokens=1200,
        decode_tokens=256,
        prompt_tok_s=900.0,
        decode_tok_s=61.5,
        ttft_s=1.33,
        draft_tokens=100,
        draft_accepted=70,
        context_tokens=1456,
        source="proxy",
    )
    result = tick(engine, reading(slot(256, processing=False), finished=[fin]), 2.0)
    status = only(result)
    assert status.last_decode_tok_s == 61.5
    assert status.decode_exact is True
    assert status.decode_tok_s is None  # nothing decodes now
    assert status.ttft_s == 1.33 and status.prompt_tok_s == 900.0 and status.prompt_exact is True
    assert status.draft_acceptance == pytest.approx(0.70)
    (record,) = result.requests
    assert record.exact is True and record.decode_tok_s == 61.5 and record.ttft_s == 1.33
    assert record.draft_tokens == 100 and record.draft_accepted == 70 and record.source == "proxy"
    assert record.session_id == status.session_id is not None  # a finished request is activity


def test_llama_server_counters_give_an_exact_last_rate_and_draft_acceptance() -> None:
    engine = Stages()
    before = CounterReading(
        tokens_predicted_total=1000,
        tokens_predicted_seconds_total=20.0,
        spec_draft_tokens_total=400,
        spec_accepted_tokens_total=300,
    )
    after = CounterReading(
        tokens_predicted_total=1500,
        tokens_predicted_seconds_total=30.0,
        spec_draft_tokens_total=800,
        spec_accepted_tokens_total=400,
    )
    tick(engine, reading(slot(0, processing=False), counters=before), 0.0)
    status = only(tick(engine, reading(slot(0, processing=False), counters=after), 10.0))
    assert status.last_decode_tok_s == pytest.approx(50.0)  # 500 tokens in 10 busy seconds
    assert status.decode_exact is True
    assert status.decode_tok_s is None  # llama-server counters are never a live rate
    assert status.draft_acceptance == pytest.approx(0.25)  # 100 of the last 400 drafted


# --------------------------------------------------------------------------- sessions


def test_sessions_span_requests_closer_than_the_idle_gap_and_end_after_it() -> None:
    engine = Stages(idle_gap_s=60.0)
    assert only(tick(engine, reading(slot(0, processing=False, task=0)), -1.0)).session_id is None

    started = tick(engine, reading(slot(0, task=1)), 0.0)
    first_id = only(started).session_id
    assert first_id is not None
    assert [s.id for s in started.sessions] == [first_id] and started.sessions[0].ended_wall_s is None
    decode_run(engine, 0.0, 5, 50.0, task=1)
    tick(engine, reading(slot(250, task=1, processing=False)), 6.0)
    for t in range(7, 40, 5):  # idle, but within the gap
        assert (
            only(tick(engine, reading(slot(250, task=1, processing=False)), float(t))).session_id == first_id
        )

    decode_run(engine, 40.0, 5, 50.0, task=2)  # 34 s after the last activity: same session
    done = tick(engine, reading(slot(250, task=2, processing=False)), 46.0)
    assert only(done).session_id == first_id
    assert done.sessions[-1].requests == 2

    quiet = [tick(engine, reading(slot(250, task=2, processing=False)), float(t)) for t in range(47, 120)]
    ended = [s for r in quiet for s in r.sessions]
    assert len(ended) == 1 and ended[0].id == first_id
    assert ended[0].ended_wall_s == pytest.approx(WALL0 + 46.0)  # the last activity, not the moment noticed
    assert ended[0].decode_tokens == 500
    assert ended[0].mean_decode_tok_s == pytest.approx(50.0)
    assert only(quiet[-1]).session_id is None

    again = tick(engine, reading(slot(0, task=3)), 200.0)
    assert only(again).session_id not in (None, first_id)


def test_activity_after_an_unpolled_gap_starts_a_new_session() -> None:
    engine = Stages(idle_gap_s=60.0)
    decode_run(engine, 0.0, 3, 50.0, task=1)
    first = only(tick(engine, reading(slot(200, task=1)), 4.0)).session_id
    # Nothing polled for 5 minutes, then a new request decodes.
    result = tick(engine, reading(slot(10, task=2)), 300.0)
    ended = [s for s in result.sessions if s.ended_wall_s is not None]
    assert [s.id for s in ended] == [first]
    assert only(result).session_id not in (None, first)


def test_an_unloaded_model_ends_its_session() -> None:
    engine = Stages()
    decode_run(engine, 0.0, 3, 50.0)
    gone = engine.update(ServerReading(kind="llamacpp", url=URL, status="ok", models=()), 4.0, WALL0 + 4.0)
    assert len(gone.sessions) == 1 and gone.sessions[0].ended_wall_s == pytest.approx(WALL0 + 3.0)
    assert engine.open_sessions() == []


# --------------------------------------------------------------------------- clocks and stale readings


def test_a_stale_reading_changes_nothing() -> None:
    engine = Stages()
    statuses = decode_run(engine, 0.0, 3, 50.0)
    stale = tick(engine, reading(slot(9999), age_s=2.5), 3.5)
    assert stale.models == (statuses[-1],)
    assert stale.requests == () and stale.sessions == ()
    fresh = only(tick(engine, reading(slot(200)), 4.0))
    assert fresh.decode_tok_s == pytest.approx(50.0)


def test_wall_clock_jumps_do_not_matter() -> None:
    steady = Stages()
    jumpy = Stages()
    walls = [WALL0, WALL0 + 1, WALL0 - 3600, WALL0 + 86_400, WALL0 + 86_401, WALL0 + 5, WALL0 + 6]
    for i, wall in enumerate(walls):
        r = reading(slot(40 * i))
        a = only(steady.update(r, float(i), WALL0 + i))
        b = only(jumpy.update(r, float(i), wall))
        assert a.decode_tok_s == b.decode_tok_s and a.phase == b.phase
    assert b.decode_tok_s == pytest.approx(40.0)
    assert b.session_id is not None and len(jumpy.open_sessions()) == 1  # no jump ended the session


def test_rates_use_the_time_the_answer_arrived() -> None:
    engine = Stages()
    # Answers arrive 1 s apart, but the ticks that process them are uneven.
    for i, tick_t in enumerate([0.3, 1.9, 2.2, 3.95, 4.1]):
        status = only(engine.update(reading(slot(60 * i), t_mono_s=float(i)), tick_t, WALL0 + tick_t))
    assert status.decode_tok_s == pytest.approx(60.0)


def test_ttft_is_estimated_from_the_prompts_own_speed_never_anothers() -> None:
    """The server's counters say 500 tok/s over earlier prompts; this 3,000-token prompt is seen
    reading at 500 tok/s itself ((3000 − 2000) ÷ (15 − 13) s, the midway first poll left out): TTFT
    ~6 s. A prompt never seen reading gets no TTFT at all, not one from the counters' speed."""
    engine = Stages()
    before = CounterReading(prompt_tokens_total=1000, prompt_seconds_total=4.0)
    after = CounterReading(prompt_tokens_total=3000, prompt_seconds_total=8.0)  # 2000 tokens in 4 s
    tick(engine, reading(slot(0, processing=False, task=None), counters=before), 0.0)
    tick(engine, reading(slot(0, processing=False, task=None), counters=after), 10.0)
    tick(engine, reading(slot(0, task=7, ctx=1000, prompt_done=1)), 11.0)
    tick(engine, reading(slot(0, task=7, ctx=2000, prompt_done=1000)), 13.0)
    tick(engine, reading(slot(0, task=7, ctx=3000, prompt_done=2000)), 15.0)
    status = only(tick(engine, reading(slot(12, task=7, prompt_done=3000)), 18.0))
    assert status.prompt_tok_s == pytest.approx(500.0)  # the counters' figure, shown as the server's
    assert status.prompt_exact is True
    assert status.ttft_s == pytest.approx(6.0)  # 3,000 tokens ÷ 500 tok/s, this prompt's own
    assert status.ttft_exact is False
    tick(engine, reading(slot(40, task=7, processing=False, prompt_done=3000)), 19.0)
    unseen = only(tick(engine, reading(slot(3, task=8, prompt_done=40)), 20.0))  # decoding at first sight
    assert unseen.phase == "decoding" and unseen.ttft_s is None and unseen.ttft_exact is None


def test_server_reported_ttft_is_exact() -> None:
    engine = Stages()
    fin = FinishedRequest(
        model=MODEL, finished_wall_s=WALL0 + 1, decode_tokens=10, decode_tok_s=40.0, ttft_s=0.8
    )
    status = only(tick(engine, reading(slot(0, processing=False), finished=[fin]), 1.0))
    assert status.ttft_s == 0.8 and status.ttft_exact is True


def test_sglang_acceptance_gauge_becomes_draft_acceptance() -> None:
    engine = Stages()
    counters = CounterReading(tokens_predicted_total=100.0, spec_accept_rate=0.31)
    status = only(tick(engine, reading(counters=counters, kind="sglang"), 0.0))
    assert status.draft_acceptance == pytest.approx(0.31)


def test_a_server_silent_in_the_middle_of_a_request_keeps_its_session() -> None:
    """A long prompt on a busy CPU: llama-server answers no poll while it computes a batch, here for
    150 s, longer than the idle gap: read timeouts (`error`), then connect timeouts once its listen
    queue is full (`unreachable`). The request goes on: one session, so its decode is compared with
    the same conversation's earlier, shorter one."""
    engine = Stages(idle_gap_s=60.0)
    decode_run(engine, 0.0, 5, 50.0, task=1)
    first = only(tick(engine, reading(slot(250, task=1, processing=False)), 6.0)).session_id
    tick(engine, reading(slot(0, task=2, ctx=2048, prompt_done=0)), 8.0)  # the long prompt starts
    silent = [tick(engine, reading(status="error"), float(t)) for t in range(10, 80, 5)]
    silent += [tick(engine, reading(status="unreachable"), float(t)) for t in range(80, 160, 5)]
    assert not [s for r in silent for s in r.sessions if s.ended_wall_s is not None]
    resumed = tick(engine, reading(slot(3, task=2, ctx=6003)), 161.0)
    assert only(resumed).session_id == first


def test_a_partial_answer_mid_request_is_silence_not_idleness() -> None:
    """Seen on a busy host: the poll right after the server froze got /props but not /slots, an
    `error` reading that still names the model, read as idle; the silence after it then ended the
    session and the resumed request began another. A failed poll says nothing of the phase."""
    engine = Stages(idle_gap_s=6.0)
    first = decode_run(engine, 0.0, 3, 50.0, task=1)[-1].session_id
    partial = reading(slot(150, task=1))
    partial = replace(partial, status="error", reason="/slots: no answer within 2 s (hung?)")
    partial = replace(partial, models=(replace(partial.models[0], slots=()),))  # named, no slots
    silent = [tick(engine, partial, 4.0)]
    silent += [tick(engine, reading(status="error"), float(t)) for t in range(6, 20, 2)]
    assert not [s for r in silent for s in r.sessions if s.ended_wall_s is not None]
    assert only(tick(engine, reading(slot(170, task=1)), 21.0)).session_id == first


def test_a_server_silent_after_its_requests_ended_ends_its_session_after_the_idle_gap() -> None:
    """The same silence after the model was last seen idle is no activity: the idle gap ends the
    session, timed at the last activity."""
    for status in ("error", "unreachable"):
        engine = Stages(idle_gap_s=60.0)
        decode_run(engine, 0.0, 5, 50.0, task=1)
        first = only(tick(engine, reading(slot(250, task=1, processing=False)), 6.0)).session_id
        silent = [tick(engine, reading(status=status), float(t)) for t in range(10, 80, 5)]
        ended = [s for r in silent for s in r.sessions if s.ended_wall_s is not None]
        assert [s.id for s in ended] == [first], status
        assert ended[0].ended_wall_s == pytest.approx(WALL0 + 6.0)


def test_a_server_dead_in_the_middle_of_a_request_ends_its_session_after_ten_minutes_and_the_gap() -> None:
    """Silence mid-request keeps the session 600 s (SILENT_REQUEST_MAX_S: no prompt batch takes
    longer); past that the server is taken for dead mid-request, and the session ends at its last
    answer."""
    engine = Stages(idle_gap_s=60.0)
    decode_run(engine, 0.0, 5, 50.0, task=1)  # the last answer at 5 s: decoding
    silent = [tick(engine, reading(status="unreachable"), float(t)) for t in range(10, 700, 10)]
    times = range(10, 700, 10)
    ended_at = [t for t, r in zip(times, silent, strict=True) if any(s.ended_wall_s for s in r.sessions)]
    assert ended_at == [610]  # silent since 10 s: kept while under 600 s of silence
    ended = [s for r in silent for s in r.sessions if s.ended_wall_s is not None]
    assert ended[0].ended_wall_s == pytest.approx(WALL0 + 5.0)
