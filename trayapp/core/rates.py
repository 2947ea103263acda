"""The rates stage: live decode / prompt rates, phases and request records from a series of readings.

Pure: readings and times go in, one immutable `RateEstimate` per model comes out. Rates use the
monotonic clock (`now_mono_s`), so a laptop's suspend or an NTP step never makes a spike; wall time
(`now_wall_s`) only labels records. A slot's track and the arithmetic on it (prefill progress,
window rates, request records, counter deltas) live in `rate_helpers.py`.

Honesty rules:

* A decode rate is only measured between two polls that both saw the same request already
  decoding (n_decoded ≥ 1), so prefill and load time never leak into it. Such a rate is
  *estimated* (from polling).
* A rate a server reports for a finished request (timings, LM Studio stats) is *exact*.
* A counter that goes backwards (a server restart, a new task on a slot) resets the baseline; no
  negative or absurd rate is ever produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelReading,
    PrefillProgress,
    RequestRecord,
    ServerReading,
    SlotReading,
)
from trayapp.core.phases import Phase, is_busy, is_ready, top_phase
from trayapp.core.rate_helpers import (
    MAX_PLAUSIBLE_TOK_S,
    SlotTrack,
    acceptance_by_position,
    counter_delta,
    counter_throughput,
    counters_reset,
    note_prompt_read,
    own_prompt_tok_s,
    prefill_progress,
    record_from_finished,
    record_from_track,
    sum_prefill,
    trim_window,
    window_rate,
)

RATE_WINDOW_S = 4.0  # live decode rate = tokens over the last few seconds (longer when slower)
MAX_WINDOW_POINTS = 120  # a stalled stream's window stops growing here
STALL_AFTER_S = 10.0  # decoding with no new token for this long → "stalled"
# Servers whose token counters move only when a request finishes (llama-server's /metrics):
# no live rate from them, but tokens ÷ busy seconds over finished requests is exact. The
# others (vLLM, SGLang) count generated tokens as they go: a live throughput.
FINISH_ONLY_COUNTER_KINDS = frozenset({"llamacpp"})


@dataclass(frozen=True)
class RateEstimate:
    """What the readings say about one model's speed right now (and its last known speeds)."""

    phase: Phase = "idle"
    decode_tok_s: float | None = None  # per stream, mean over active streams
    decode_total_tok_s: float | None = None
    active_streams: int = 0
    decode_exact: bool | None = None  # True: server-reported timings; False: estimated from polling
    last_decode_tok_s: float | None = None
    last_decode_context_tokens: int | None = None
    context_tokens: int | None = None  # deepest live context among active streams
    prompt_tok_s: float | None = None
    prompt_exact: bool | None = None  # True: the server's own timing; False: polled estimate
    ttft_s: float | None = None
    ttft_exact: bool | None = None  # True: server-reported; False: prompt tokens ÷ this prompt's tok/s
    draft_acceptance: float | None = None
    draft_acceptance_by_position: tuple[float, ...] = ()  # see ModelStatus
    prefill: PrefillProgress | None = None  # prompts being read right now


@dataclass(frozen=True)
class ServerRates:
    """One server's rates at one tick: an estimate per listed model, and the requests that finished."""

    models: dict[str, RateEstimate]
    requests: tuple[RequestRecord, ...]  # no session id or ceiling yet: later stages add them


@dataclass(frozen=True)
class _StreamRate:
    decode_tok_s: float | None
    context_tokens: int | None
    phase: Phase
    prefill: PrefillProgress | None = None  # while this stream reads its prompt


@dataclass
class _ModelTrack:
    slots: dict[int, SlotTrack] = field(default_factory=dict)
    counters: CounterReading | None = None
    counters_mono_s: float | None = None
    counter_rate_tok_s: float | None = None  # generation throughput from counter deltas (vLLM/SGLang)
    last_decode_tok_s: float | None = None
    last_decode_exact: bool | None = None
    last_decode_context: int | None = None
    last_prompt_tok_s: float | None = None
    last_prompt_exact: bool | None = None
    last_ttft_s: float | None = None
    last_ttft_exact: bool | None = None
    draft_acceptance: float | None = None
    draft_acceptance_by_position: tuple[float, ...] = ()


class RateTracker:
    """Tracks every (server, model)'s slots and counters across ticks. One instance per pipeline."""

    def __init__(self) -> None:
        self._tracks: dict[tuple[str, str], _ModelTrack] = {}
        self._last: dict[str, ServerRates] = {}

    def update(self, reading: ServerReading, now_mono_s: float, now_wall_s: float) -> ServerRates:
        if reading.age_s is not None:
            # A repeated earlier reading carries no new information: keep the last estimates.
            last = self._last.get(reading.url)
            return ServerRates(dict(last.models) if last else {}, ())
        measured_mono_s = reading.t_mono_s if reading.t_mono_s is not None else now_mono_s
        rates = self._update(reading, measured_mono_s, now_wall_s)
        self._last[reading.url] = rates
        return rates

    def _update(self, reading: ServerReading, now_mono_s: float, now_wall_s: float) -> ServerRates:
        models: dict[str, RateEstimate] = {}
        requests: list[RequestRecord] = []
        finished_by_model: dict[str, list[FinishedRequest]] = {}
        for fin in reading.finished:
            finished_by_model.setdefault(fin.model, []).append(fin)

        for model in reading.models:
            track = self._tracks.setdefault((reading.url, model.name), _ModelTrack())
            estimate, model_requests = self._update_model(
                reading, model, track, finished_by_model.pop(model.name, []), now_mono_s, now_wall_s
            )
            models[model.name] = estimate
            requests.extend(model_requests)

        # Finished requests for models the server no longer lists (unloaded right after).
        for fins in finished_by_model.values():
            requests.extend(record_from_finished(reading, fin) for fin in fins)

        seen = {m.name for m in reading.models}
        for (url, name), track in list(self._tracks.items()):
            if url != reading.url or name in seen:
                continue
            if reading.status in ("unreachable", "error"):
                # No rate may span an outage: a restarted server counts from zero again.
                requests.extend(_interrupt_slots(reading, name, track, now_wall_s))
                continue
            del self._tracks[(url, name)]  # unloaded
        return ServerRates(models, tuple(requests))

    # ------------------------------------------------------------------ per model

    def _update_model(
        self,
        reading: ServerReading,
        model: ModelReading,
        track: _ModelTrack,
        finished: list[FinishedRequest],
        now_mono_s: float,
        now_wall_s: float,
    ) -> tuple[RateEstimate, list[RequestRecord]]:
        requests: list[RequestRecord] = []
        streams: list[_StreamRate] = []
        for slot in model.slots:
            stream, record = _update_slot(reading, model, track, slot, now_mono_s, now_wall_s)
            if stream is not None:
                streams.append(stream)
            if record is not None and not reading.proxied:  # the proxy reports each request exactly
                requests.append(record)
        live_ids = {s.slot_id for s in model.slots}
        for slot_id in list(track.slots):
            if slot_id not in live_ids:
                del track.slots[slot_id]

        _update_counters(model.counters, track, now_mono_s, reading.kind not in FINISH_ONLY_COUNTER_KINDS)

        for fin in finished:
            requests.append(record_from_finished(reading, fin))
            if fin.decode_tok_s is not None:
                track.last_decode_tok_s = fin.decode_tok_s
                track.last_decode_exact = fin.decode_exact
                track.last_decode_context = fin.context_tokens
            if fin.prompt_tok_s is not None:
                track.last_prompt_tok_s = fin.prompt_tok_s
                track.last_prompt_exact = True
            if fin.ttft_s is not None:
                track.last_ttft_s = fin.ttft_s
                track.last_ttft_exact = True
            if fin.draft_tokens:
                track.draft_acceptance = (fin.draft_accepted or 0) / fin.draft_tokens

        rates = [s.decode_tok_s for s in streams if s.phase == "decoding" and s.decode_tok_s is not None]
        decode_total: float | None = sum(rates) if rates else None
        decode_tok_s = decode_total / len(rates) if decode_total is not None else None
        contexts = [s.context_tokens for s in streams if is_busy(s.phase) and s.context_tokens is not None]
        context_tokens = max(contexts) if contexts else None

        phase: Phase = "idle"
        if model.sleeping:
            phase = "sleeping"
        elif reading.status == "loading" or model.loading:
            phase = "loading"
        elif not model.loaded:
            phase = "unloaded"
        elif streams_phase := top_phase(s.phase for s in streams):
            phase = streams_phase
        elif model.busy:
            phase = "decoding"

        # Throughput servers (vLLM/SGLang) give only counters: rate from their deltas.
        counter_rate = track.counter_rate_tok_s
        running = model.counters.requests_running if model.counters else None
        active_streams = len(rates)
        if decode_tok_s is None and not model.slots and is_ready(phase):
            if counter_rate:
                streams_now = max(running or 1.0, 1.0)
                decode_total = counter_rate
                decode_tok_s = counter_rate / streams_now
                phase = "decoding"
                active_streams = int(streams_now)
            elif running:
                # Requests are running: with a token counter that did not move since the last
                # poll they are still in prefill; without one (llama-server counts only finished
                # requests) all we know is that it is busy.
                phase = "prefill" if counter_rate == 0.0 else "decoding"

        if decode_tok_s is not None:
            track.last_decode_tok_s = decode_tok_s
            track.last_decode_exact = False
            track.last_decode_context = context_tokens

        prefills = [p.prefill for p in streams if p.prefill is not None]
        estimate = RateEstimate(
            phase=phase,
            decode_tok_s=decode_tok_s,
            decode_total_tok_s=decode_total,
            active_streams=active_streams,
            decode_exact=(False if decode_tok_s is not None else track.last_decode_exact),
            last_decode_tok_s=track.last_decode_tok_s,
            last_decode_context_tokens=track.last_decode_context,
            context_tokens=context_tokens,
            prompt_tok_s=track.last_prompt_tok_s,
            prompt_exact=track.last_prompt_exact,
            ttft_s=track.last_ttft_s,
            ttft_exact=track.last_ttft_exact,
            draft_acceptance=track.draft_acceptance,
            draft_acceptance_by_position=track.draft_acceptance_by_position,
            prefill=sum_prefill(prefills) if prefills else None,
        )
        return estimate, requests


def _update_slot(
    reading: ServerReading,
    model: ModelReading,
    track: _ModelTrack,
    slot: SlotReading,
    now_mono_s: float,
    now_wall_s: float,
) -> tuple[_StreamRate | None, RequestRecord | None]:
    state = track.slots.get(slot.slot_id)
    n_decoded = slot.n_decoded or 0
    record: RequestRecord | None = None

    new_task = (
        state is None
        or slot.task_id != state.task_id
        or n_decoded < state.last_n_decoded  # counter went backwards: restart or reused slot
    )
    if new_task and state is not None and not state.reported:
        # The previous task ended between polls (or the server restarted): report it once.
        record = record_from_track(reading, model.name, state, now_wall_s)
        _learn_from_record(track, record)
    if new_task:
        if not slot.is_processing:
            # A finished task seen for the first time (e.g. at start-up): remember, don't report.
            track.slots[slot.slot_id] = SlotTrack(
                task_id=slot.task_id, first_seen_mono_s=now_mono_s, last_n_decoded=n_decoded, reported=True
            )
            return None, record
        state = SlotTrack(task_id=slot.task_id, first_seen_mono_s=now_mono_s, last_progress_mono_s=now_mono_s)
        track.slots[slot.slot_id] = state
    assert state is not None

    if not slot.is_processing:
        # The task finished between polls: report what we saw of it, once.
        if not state.reported:
            state.last_n_decoded = max(state.last_n_decoded, n_decoded)
            record = record_from_track(reading, model.name, state, now_wall_s)
            state.reported = True
            _learn_from_record(track, record)
        return None, record

    if n_decoded > state.last_n_decoded:
        state.last_progress_mono_s = now_mono_s
    state.last_n_decoded = n_decoded
    state.last_context = slot.context_tokens
    if n_decoded == 0 and (slot.prompt_tokens_processed is not None or slot.context_tokens is not None):
        note_prompt_read(state, now_mono_s, slot)

    if n_decoded >= 1:
        if state.decode_started_mono_s is None:
            state.decode_started_mono_s = now_mono_s
            state.first_decode_point = (now_mono_s, n_decoded)
            # Polling cannot see the first token arrive: estimate the prompt's time from its
            # evaluated tokens and *its own* reading speed, when polls saw it read; else unknown
            # (another request's prompt speed says nothing of this one: a short prompt reads slower).
            own_tok_s = own_prompt_tok_s(state)
            if slot.prompt_tokens_processed and own_tok_s:
                track.last_ttft_s, track.last_ttft_exact = slot.prompt_tokens_processed / own_tok_s, False
            else:
                track.last_ttft_s, track.last_ttft_exact = None, None
        state.points.append((now_mono_s, n_decoded, slot.context_tokens))
        trim_window(state.points, RATE_WINDOW_S, MAX_WINDOW_POINTS)

    rate = window_rate(state.points, RATE_WINDOW_S)
    if n_decoded == 0:
        return _StreamRate(None, slot.context_tokens, "prefill", prefill_progress(slot, state)), record
    if now_mono_s - state.last_progress_mono_s >= STALL_AFTER_S:
        return _StreamRate(None, slot.context_tokens, "stalled"), record
    return _StreamRate(rate, slot.context_tokens, "decoding"), record


def _interrupt_slots(
    reading: ServerReading, name: str, track: _ModelTrack, now_wall_s: float
) -> list[RequestRecord]:
    """The server stopped answering: report what was seen of running requests, restart the windows."""
    records: list[RequestRecord] = []
    for state in track.slots.values():
        if not state.reported:
            record = record_from_track(reading, name, state, now_wall_s)
            if record is not None:
                if not reading.proxied:
                    records.append(record)
                _learn_from_record(track, record)
            state.reported = True
        state.points.clear()
        state.prompt_points.clear()
        state.first_decode_point = None
        state.decode_started_mono_s = None
    track.counters = None  # counters of a restarted server start from zero
    track.counters_mono_s = None
    return records


def _learn_from_record(track: _ModelTrack, record: RequestRecord | None) -> None:
    if record is None:
        return
    if record.decode_tok_s is not None:
        track.last_decode_tok_s = record.decode_tok_s
        track.last_decode_exact = record.exact
        track.last_decode_context = record.context_tokens
    if record.prompt_tok_s is not None:
        track.last_prompt_tok_s = record.prompt_tok_s
        track.last_prompt_exact = record.exact
    if record.ttft_s is not None:
        track.last_ttft_s = record.ttft_s
        track.last_ttft_exact = record.exact


def _update_counters(
    counters: CounterReading | None, track: _ModelTrack, now_mono_s: float, live: bool
) -> None:
    """Deltas of cumulative counters: live throughput (`live` kinds) or exact finished-request rates."""
    track.counter_rate_tok_s = None
    if counters is None:
        return
    previous = track.counters
    if previous is not None and counters_reset(previous, counters):
        track.counters = counters
        track.counters_mono_s = now_mono_s
        return
    if (
        live
        and previous is not None
        and track.counters_mono_s is not None
        and now_mono_s > track.counters_mono_s
    ):
        track.counter_rate_tok_s = counter_throughput(previous, counters, now_mono_s - track.counters_mono_s)
    if previous is not None:
        d_draft = counter_delta(previous.spec_draft_tokens_total, counters.spec_draft_tokens_total)
        d_acc = counter_delta(previous.spec_accepted_tokens_total, counters.spec_accepted_tokens_total)
        if d_draft and d_draft > 0 and d_acc is not None:
            track.draft_acceptance = max(0.0, min(1.0, d_acc / d_draft))
        by_position = acceptance_by_position(previous, counters)
        if by_position:
            track.draft_acceptance_by_position = by_position
        # Token ÷ seconds ratios only where both counters move at the same moment (when a
        # request finishes); vLLM's token counters run ahead of its per-request timings.
        d_prompt = counter_delta(previous.prompt_tokens_total, counters.prompt_tokens_total)
        d_prompt_s = counter_delta(previous.prompt_seconds_total, counters.prompt_seconds_total)
        if not live and d_prompt and d_prompt_s and d_prompt_s > 0:
            track.last_prompt_tok_s = d_prompt / d_prompt_s
            track.last_prompt_exact = True  # the server's own prompt seconds
        d_tok = counter_delta(previous.tokens_predicted_total, counters.tokens_predicted_total)
        d_tok_s = counter_delta(
            previous.tokens_predicted_seconds_total, counters.tokens_predicted_seconds_total
        )
        if not live and d_tok and d_tok_s and d_tok_s > 0 and d_tok / d_tok_s < MAX_PLAUSIBLE_TOK_S:
            # Busy-time rate measured by the server over finished requests.
            track.last_decode_tok_s = d_tok / d_tok_s
            track.last_decode_exact = True
        d_ttft_sum = counter_delta(previous.ttft_sum_s, counters.ttft_sum_s)
        d_ttft_n = counter_delta(previous.ttft_count, counters.ttft_count)
        if d_ttft_sum is not None and d_ttft_n and d_ttft_n > 0:
            track.last_ttft_s = d_ttft_sum / d_ttft_n  # the server's own histogram (vLLM/SGLang)
            track.last_ttft_exact = True
    if counters.spec_accept_rate is not None and counters.spec_draft_tokens_total is None:
        track.draft_acceptance = max(0.0, min(1.0, counters.spec_accept_rate))  # SGLang's own gauge
    elif (
        previous is None
        and counters.spec_draft_tokens_total
        and counters.spec_accepted_tokens_total is not None
    ):
        track.draft_acceptance = counters.spec_accepted_tokens_total / counters.spec_draft_tokens_total
        track.draft_acceptance_by_position = acceptance_by_position(None, counters)
    track.counters = counters
    track.counters_mono_s = now_mono_s
