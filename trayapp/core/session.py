"""Live rates, phases, per-request records and sessions, from a series of readings.

Pure: readings and times go in, statuses come out. Rates use the monotonic
clock (`now_mono_s`), so a laptop's suspend or an NTP step never makes a spike;
wall time (`now_wall_s`) only labels records.

Honesty rules:

* A decode rate is only measured between two polls that both saw the same
  request already decoding (n_decoded ≥ 1), so prefill and load time never
  leak into it. Such a rate is *estimated* (from polling).
* A rate a server reports for a finished request (timings, LM Studio stats)
  is *exact*.
* A counter that goes backwards (a server restart, a new task on a slot)
  resets the baseline; no negative or absurd rate is ever produced.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelReading,
    ModelStatus,
    Phase,
    RequestRecord,
    ServerReading,
    SessionRecord,
    SlotReading,
)

RATE_WINDOW_S = 4.0  # live decode rate = tokens over (at most) the last few seconds
STALL_AFTER_S = 10.0  # decoding with no new token for this long → "stalled"
MAX_PLAUSIBLE_TOK_S = 50_000.0  # anything above is a counter glitch, not a rate
# Servers whose token counters move only when a request finishes (llama-server's /metrics):
# no live rate from them, but tokens ÷ busy seconds over finished requests is exact. The
# others (vLLM, SGLang) count generated tokens as they go: a live throughput.
FINISH_ONLY_COUNTER_KINDS = frozenset({"llamacpp"})


@dataclass
class _SlotTrack:
    task_id: int | None
    first_seen_mono_s: float
    points: deque[tuple[float, int, int | None]] = field(default_factory=deque)  # (t, n_decoded, context)
    decode_started_mono_s: float | None = None
    first_decode_point: tuple[float, int] | None = None
    last_progress_mono_s: float = 0.0
    prompt_points: list[tuple[float, int]] = field(default_factory=list)
    last_n_decoded: int = 0
    last_context: int | None = None
    reported: bool = False


@dataclass
class _StreamRate:
    decode_tok_s: float | None
    context_tokens: int | None
    phase: Phase


@dataclass
class _ModelTrack:
    slots: dict[int, _SlotTrack] = field(default_factory=dict)
    counters: CounterReading | None = None
    counters_mono_s: float | None = None
    counter_rate_tok_s: float | None = None  # generation throughput from counter deltas (vLLM/SGLang)
    last_decode_tok_s: float | None = None
    last_decode_exact: bool | None = None
    last_decode_context: int | None = None
    last_prompt_tok_s: float | None = None
    last_ttft_s: float | None = None
    last_ttft_exact: bool | None = None
    draft_acceptance: float | None = None
    session: SessionRecord | None = None
    session_rate_weight: float = 0.0
    session_rate_sum: float = 0.0
    session_prompt_n: int = 0
    session_prompt_sum: float = 0.0
    session_ttft_n: int = 0
    session_ttft_sum: float = 0.0
    last_activity_mono_s: float | None = None
    last_activity_wall_s: float | None = None


@dataclass(frozen=True)
class TickResult:
    """What one server's tick produced."""

    models: tuple[ModelStatus, ...]
    requests: tuple[RequestRecord, ...]
    sessions: tuple[SessionRecord, ...]  # sessions that started, changed or ended at this tick


class SessionEngine:
    """Tracks every (server, model) across ticks. One instance per monitor."""

    def __init__(self, idle_gap_s: float = 60.0) -> None:
        self.idle_gap_s = idle_gap_s
        self._tracks: dict[tuple[str, str], _ModelTrack] = {}
        self._last_models: dict[str, tuple[ModelStatus, ...]] = {}

    # ------------------------------------------------------------------ public

    def update(self, reading: ServerReading, now_mono_s: float, now_wall_s: float) -> TickResult:
        if reading.age_s is not None:
            # A repeated earlier reading carries no new information: keep the last statuses.
            return TickResult(self._last_models.get(reading.url, ()), (), ())
        measured_mono_s = reading.t_mono_s if reading.t_mono_s is not None else now_mono_s
        result = self._update(reading, measured_mono_s, now_wall_s)
        self._last_models[reading.url] = result.models
        return result

    def _update(self, reading: ServerReading, now_mono_s: float, now_wall_s: float) -> TickResult:
        models: list[ModelStatus] = []
        requests: list[RequestRecord] = []
        sessions: list[SessionRecord] = []
        seen: set[str] = set()
        finished_by_model: dict[str, list[FinishedRequest]] = {}
        for fin in reading.finished:
            finished_by_model.setdefault(fin.model, []).append(fin)

        for model in reading.models:
            seen.add(model.name)
            track = self._tracks.setdefault((reading.url, model.name), _ModelTrack())
            status, model_requests = self._update_model(
                reading, model, track, finished_by_model.pop(model.name, []), now_mono_s, now_wall_s
            )
            sessions.extend(
                self._update_session(reading, model, status, track, model_requests, now_mono_s, now_wall_s)
            )
            status = replace(status, session_id=track.session.id if track.session else None)
            model_requests = [replace(r, session_id=status.session_id) for r in model_requests]
            models.append(status)
            requests.extend(model_requests)

        # Finished requests for models the server no longer lists (unloaded right after).
        for fins in finished_by_model.values():
            for fin in fins:
                requests.append(_record_from_finished(reading, fin, None))

        # Models that disappeared (unloaded, server down): close their sessions.
        for (url, name), track in list(self._tracks.items()):
            if url != reading.url or name in seen:
                continue
            if reading.status in ("unreachable", "error") and track.session is not None:
                # Keep the session across a short outage (the idle gap still ends it), but
                # no rate may span the outage: a restarted server counts from zero again.
                requests.extend(self._interrupt_slots(reading, name, track, now_wall_s))
                ended = self._maybe_end_session(track, now_mono_s)
                if ended is not None:
                    sessions.append(ended)
                continue
            if track.session is not None:
                sessions.append(self._end_session(track))
            del self._tracks[(url, name)]
        return TickResult(tuple(models), tuple(requests), tuple(sessions))

    def _interrupt_slots(
        self, reading: ServerReading, name: str, track: _ModelTrack, now_wall_s: float
    ) -> list[RequestRecord]:
        """The server stopped answering: report what was seen of running requests, restart the windows."""
        records: list[RequestRecord] = []
        model = ModelReading(name=name)
        for state in track.slots.values():
            if not state.reported:
                record = _record_from_track(reading, model, state, now_wall_s)
                if record is not None:
                    record = replace(record, session_id=track.session.id if track.session else None)
                    records.append(record)
                    self._learn_from_record(track, record)
                state.reported = True
            state.points.clear()
            state.prompt_points.clear()
            state.first_decode_point = None
            state.decode_started_mono_s = None
        track.counters = None  # counters of a restarted server start from zero
        track.counters_mono_s = None
        return records

    def open_sessions(self) -> list[SessionRecord]:
        return [t.session for t in self._tracks.values() if t.session is not None]

    # ------------------------------------------------------------------ per model

    def _update_model(
        self,
        reading: ServerReading,
        model: ModelReading,
        track: _ModelTrack,
        finished: list[FinishedRequest],
        now_mono_s: float,
        now_wall_s: float,
    ) -> tuple[ModelStatus, list[RequestRecord]]:
        requests: list[RequestRecord] = []
        streams: list[_StreamRate] = []

        for slot in model.slots:
            stream, record = self._update_slot(reading, model, track, slot, now_mono_s, now_wall_s)
            if stream is not None:
                streams.append(stream)
            if record is not None:
                requests.append(record)
        live_ids = {s.slot_id for s in model.slots}
        for slot_id in list(track.slots):
            if slot_id not in live_ids:
                del track.slots[slot_id]

        self._update_counters(
            model.counters, track, now_mono_s, reading.kind not in FINISH_ONLY_COUNTER_KINDS
        )

        for fin in finished:
            record = _record_from_finished(reading, fin, None)
            requests.append(record)
            if fin.decode_tok_s is not None:
                track.last_decode_tok_s = fin.decode_tok_s
                track.last_decode_exact = True
                track.last_decode_context = fin.context_tokens
            if fin.prompt_tok_s is not None:
                track.last_prompt_tok_s = fin.prompt_tok_s
            if fin.ttft_s is not None:
                track.last_ttft_s = fin.ttft_s
                track.last_ttft_exact = True
            if fin.draft_tokens:
                track.draft_acceptance = (fin.draft_accepted or 0) / fin.draft_tokens

        rates = [s.decode_tok_s for s in streams if s.phase == "decoding" and s.decode_tok_s is not None]
        decode_total: float | None = sum(rates) if rates else None
        decode_tok_s = decode_total / len(rates) if decode_total is not None else None
        active = [s for s in streams if s.phase in ("prefill", "decoding", "stalled")]
        contexts = [s.context_tokens for s in active if s.context_tokens is not None]
        context_tokens = max(contexts) if contexts else None

        phase: Phase = "idle"
        if reading.status == "loading" or model.loading:
            phase = "loading"
        elif any(s.phase == "decoding" for s in streams):
            phase = "decoding"
        elif any(s.phase == "prefill" for s in streams):
            phase = "prefill"
        elif any(s.phase == "stalled" for s in streams):
            phase = "stalled"
        elif model.busy:
            phase = "decoding"

        # Throughput servers (vLLM/SGLang) give only counters: rate from their deltas.
        counter_rate = track.counter_rate_tok_s
        running = model.counters.requests_running if model.counters else None
        active_streams = len(rates)
        if decode_tok_s is None and not model.slots and phase != "loading":
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

        gpu_fraction = None
        if model.size_bytes and model.vram_bytes is not None and model.size_bytes > 0:
            gpu_fraction = max(0.0, min(1.0, model.vram_bytes / model.size_bytes))

        status = ModelStatus(
            name=model.name,
            phase=phase,
            size_bytes=model.size_bytes,
            weights_bytes=model.weights_bytes or (model.facts.weights_bytes if model.facts else None),
            vram_bytes=model.vram_bytes,
            gpu_fraction=gpu_fraction,
            context_length=model.context_length,
            context_tokens=context_tokens,
            quantization=model.quantization or (model.facts.quantization if model.facts else None),
            parameter_count=model.parameter_count or (model.facts.parameter_count if model.facts else None),
            bytes_per_token=model.facts.bytes_per_token if model.facts else None,
            bytes_per_token_exact=bool(model.facts and model.facts.exact),
            decode_tok_s=decode_tok_s,
            decode_total_tok_s=decode_total,
            active_streams=active_streams,
            decode_exact=(False if decode_tok_s is not None else track.last_decode_exact),
            last_decode_tok_s=track.last_decode_tok_s,
            last_decode_context_tokens=track.last_decode_context,
            prompt_tok_s=track.last_prompt_tok_s,
            ttft_s=track.last_ttft_s,
            ttft_exact=track.last_ttft_exact,
            draft_acceptance=track.draft_acceptance,
            live_rate_reason=model.live_rate_reason,
            server_pid=model.server_pid or reading.pid,
            facts=model.facts,
        )
        return status, requests

    def _update_slot(
        self,
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
            record = _record_from_track(reading, model, state, now_wall_s)
            self._learn_from_record(track, record)
        if new_task:
            if not slot.is_processing:
                # A finished task seen for the first time (e.g. at start-up): remember, don't report.
                track.slots[slot.slot_id] = _SlotTrack(
                    task_id=slot.task_id,
                    first_seen_mono_s=now_mono_s,
                    last_n_decoded=n_decoded,
                    reported=True,
                )
                return None, record
            state = _SlotTrack(
                task_id=slot.task_id, first_seen_mono_s=now_mono_s, last_progress_mono_s=now_mono_s
            )
            track.slots[slot.slot_id] = state
        assert state is not None

        if not slot.is_processing:
            # The task finished between polls: report what we saw of it, once.
            if not state.reported:
                state.last_n_decoded = max(state.last_n_decoded, n_decoded)
                record = _record_from_track(reading, model, state, now_wall_s)
                state.reported = True
                self._learn_from_record(track, record)
            return None, record

        if n_decoded > state.last_n_decoded:
            state.last_progress_mono_s = now_mono_s
        state.last_n_decoded = n_decoded
        state.last_context = slot.context_tokens
        if slot.prompt_tokens_processed is not None and n_decoded == 0:
            state.prompt_points.append((now_mono_s, slot.prompt_tokens_processed))

        if n_decoded >= 1:
            if state.decode_started_mono_s is None:
                state.decode_started_mono_s = now_mono_s
                state.first_decode_point = (now_mono_s, n_decoded)
                # Polling cannot see the first token arrive; estimate the prompt's time from
                # its evaluated tokens and the server's own prompt speed (counters).
                if slot.prompt_tokens_processed and track.last_prompt_tok_s:
                    track.last_ttft_s = slot.prompt_tokens_processed / track.last_prompt_tok_s
                    track.last_ttft_exact = False
            state.points.append((now_mono_s, n_decoded, slot.context_tokens))
            while len(state.points) > 2 and now_mono_s - state.points[1][0] >= RATE_WINDOW_S:
                state.points.popleft()

        rate = _window_rate(state.points)
        if n_decoded == 0:
            return _StreamRate(None, slot.context_tokens, "prefill"), record
        if now_mono_s - state.last_progress_mono_s >= STALL_AFTER_S:
            return _StreamRate(None, slot.context_tokens, "stalled"), record
        return _StreamRate(rate, slot.context_tokens, "decoding"), record

    def _learn_from_record(self, track: _ModelTrack, record: RequestRecord | None) -> None:
        if record is None:
            return
        if record.decode_tok_s is not None:
            track.last_decode_tok_s = record.decode_tok_s
            track.last_decode_exact = record.exact
            track.last_decode_context = record.context_tokens
        if record.prompt_tok_s is not None:
            track.last_prompt_tok_s = record.prompt_tok_s
        if record.ttft_s is not None:
            track.last_ttft_s = record.ttft_s
            track.last_ttft_exact = record.exact

    def _update_counters(
        self, counters: CounterReading | None, track: _ModelTrack, now_mono_s: float, live: bool
    ) -> None:
        """Deltas of cumulative counters: live throughput (`live` kinds) or exact finished-request rates."""
        track.counter_rate_tok_s = None
        if counters is None:
            return
        previous = track.counters
        if previous is not None and _counters_reset(previous, counters):
            track.counters = counters
            track.counters_mono_s = now_mono_s
            return
        if (
            live
            and previous is not None
            and track.counters_mono_s is not None
            and now_mono_s > track.counters_mono_s
        ):
            track.counter_rate_tok_s = _throughput(previous, counters, now_mono_s - track.counters_mono_s)
        if previous is not None:
            d_draft = _delta(previous.spec_draft_tokens_total, counters.spec_draft_tokens_total)
            d_acc = _delta(previous.spec_accepted_tokens_total, counters.spec_accepted_tokens_total)
            if d_draft and d_draft > 0 and d_acc is not None:
                track.draft_acceptance = max(0.0, min(1.0, d_acc / d_draft))
            # Token ÷ seconds ratios only where both counters move at the same moment (when a
            # request finishes); vLLM's token counters run ahead of its per-request timings.
            d_prompt = _delta(previous.prompt_tokens_total, counters.prompt_tokens_total)
            d_prompt_s = _delta(previous.prompt_seconds_total, counters.prompt_seconds_total)
            if not live and d_prompt and d_prompt_s and d_prompt_s > 0:
                track.last_prompt_tok_s = d_prompt / d_prompt_s
            d_tok = _delta(previous.tokens_predicted_total, counters.tokens_predicted_total)
            d_tok_s = _delta(previous.tokens_predicted_seconds_total, counters.tokens_predicted_seconds_total)
            if not live and d_tok and d_tok_s and d_tok_s > 0 and d_tok / d_tok_s < MAX_PLAUSIBLE_TOK_S:
                # Busy-time rate measured by the server over finished requests.
                track.last_decode_tok_s = d_tok / d_tok_s
                track.last_decode_exact = True
            d_ttft_sum = _delta(previous.ttft_sum_s, counters.ttft_sum_s)
            d_ttft_n = _delta(previous.ttft_count, counters.ttft_count)
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
        track.counters = counters
        track.counters_mono_s = now_mono_s

    # ------------------------------------------------------------------ sessions

    def _update_session(
        self,
        reading: ServerReading,
        model: ModelReading,
        status: ModelStatus,
        track: _ModelTrack,
        requests: list[RequestRecord],
        now_mono_s: float,
        now_wall_s: float,
    ) -> list[SessionRecord]:
        """Start, extend or end the model's session; returns the sessions that changed."""
        active = status.phase in ("prefill", "decoding", "stalled") or bool(requests)
        changes: list[SessionRecord] = []
        ended = self._maybe_end_session(track, now_mono_s)  # the idle gap passed (even unpolled)
        if ended is not None:
            changes.append(ended)
        if not active:
            return changes
        if track.session is None:
            track.session = SessionRecord(
                id=_session_id(reading.url, model.name, now_wall_s),
                server=reading.url,
                server_kind=reading.kind,
                model=model.name,
                started_wall_s=now_wall_s,
                ended_wall_s=None,
                server_version=reading.version,
                quantization=status.quantization,
            )
            track.session_rate_sum = track.session_rate_weight = 0.0
            track.session_prompt_n = track.session_ttft_n = 0
            track.session_prompt_sum = track.session_ttft_sum = 0.0
        track.last_activity_mono_s = now_mono_s
        track.last_activity_wall_s = now_wall_s
        session = track.session
        peak = session.peak_decode_tok_s
        if status.decode_tok_s is not None:
            peak = max(peak or 0.0, status.decode_tok_s)
            track.session_rate_sum += status.decode_tok_s
            track.session_rate_weight += 1.0
        decode_tokens = session.decode_tokens + sum(r.decode_tokens or 0 for r in requests)
        for r in requests:
            if r.prompt_tok_s is not None:
                track.session_prompt_n += 1
                track.session_prompt_sum += r.prompt_tok_s
            if r.ttft_s is not None:
                track.session_ttft_n += 1
                track.session_ttft_sum += r.ttft_s
            if r.decode_tok_s is not None and r.exact:
                peak = max(peak or 0.0, r.decode_tok_s)
        contexts = [c for c in (session.max_context_tokens, status.context_tokens) if c is not None]
        contexts += [r.context_tokens for r in requests if r.context_tokens is not None]
        changed = replace(
            session,
            requests=session.requests + len(requests),
            decode_tokens=decode_tokens,
            mean_decode_tok_s=(
                track.session_rate_sum / track.session_rate_weight
                if track.session_rate_weight
                else _mean([r.decode_tok_s for r in requests if r.decode_tok_s is not None])
                or session.mean_decode_tok_s
            ),
            peak_decode_tok_s=peak,
            mean_prompt_tok_s=(
                track.session_prompt_sum / track.session_prompt_n
                if track.session_prompt_n
                else session.mean_prompt_tok_s
            ),
            mean_ttft_s=track.session_ttft_sum / track.session_ttft_n
            if track.session_ttft_n
            else session.mean_ttft_s,
            max_context_tokens=max(contexts) if contexts else None,
            gpu_fraction=status.gpu_fraction if status.gpu_fraction is not None else session.gpu_fraction,
            server_version=reading.version or session.server_version,
            quantization=status.quantization or session.quantization,
        )
        track.session = changed
        changes.append(changed)
        return changes

    def set_session_details(self, server: str, model: str, **changes: object) -> SessionRecord | None:
        """Let the pipeline attach what it computed (ceiling, hardware label, alert kinds)."""
        track = self._tracks.get((server, model))
        if track is None or track.session is None:
            return None
        session = replace(track.session, **changes)  # type: ignore[arg-type]
        track.session = session
        return session

    def _maybe_end_session(self, track: _ModelTrack, now_mono_s: float) -> SessionRecord | None:
        if track.session is None or track.last_activity_mono_s is None:
            return None
        if now_mono_s - track.last_activity_mono_s < self.idle_gap_s:
            return None
        return self._end_session(track)

    def _end_session(self, track: _ModelTrack) -> SessionRecord:
        assert track.session is not None
        ended = replace(
            track.session, ended_wall_s=track.last_activity_wall_s or track.session.started_wall_s
        )
        track.session = None
        return ended


# ---------------------------------------------------------------------- helpers


def _window_rate(points: deque[tuple[float, int, int | None]]) -> float | None:
    if len(points) < 2:
        return None
    t0, n0, _ = points[0]
    t1, n1, _ = points[-1]
    if t1 <= t0 or n1 < n0:
        return None
    rate = (n1 - n0) / (t1 - t0)
    return rate if rate < MAX_PLAUSIBLE_TOK_S else None


def _record_from_track(
    reading: ServerReading, model: ModelReading, state: _SlotTrack, now_wall_s: float
) -> RequestRecord | None:
    """A request as polling saw it: decode rate over the polls that saw it decoding."""
    if state.first_decode_point is None or not state.points:
        return None
    t0, n0 = state.first_decode_point
    t1, n1, _ = state.points[-1]
    rate = (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None
    prompt_rate = None
    if len(state.prompt_points) >= 2:
        (pa, na), (pb, nb) = state.prompt_points[0], state.prompt_points[-1]
        if pb > pa and nb > na:
            prompt_rate = (nb - na) / (pb - pa)
    return RequestRecord(
        server=reading.url,
        server_kind=reading.kind,
        model=model.name,
        finished_wall_s=now_wall_s,  # seen finished at this poll
        session_id=None,
        exact=False,
        decode_tokens=state.last_n_decoded or None,
        context_tokens=state.last_context,
        decode_tok_s=rate,
        prompt_tok_s=prompt_rate,
        source="slots",
    )


def _record_from_finished(
    reading: ServerReading, fin: FinishedRequest, session_id: str | None
) -> RequestRecord:
    return RequestRecord(
        server=reading.url,
        server_kind=reading.kind,
        model=fin.model,
        finished_wall_s=fin.finished_wall_s,
        session_id=session_id,
        exact=fin.decode_tok_s is not None,
        prompt_tokens=fin.prompt_tokens,
        decode_tokens=fin.decode_tokens,
        context_tokens=fin.context_tokens,
        prompt_tok_s=fin.prompt_tok_s,
        decode_tok_s=fin.decode_tok_s,
        ttft_s=fin.ttft_s,
        load_s=fin.load_s,
        draft_tokens=fin.draft_tokens,
        draft_accepted=fin.draft_accepted,
        source=fin.source,
    )


def _throughput(before: CounterReading, after: CounterReading, interval_s: float) -> float | None:
    """Generation tok/s over wall time from a live token counter (vLLM, SGLang)."""
    d_tok = _delta(before.tokens_predicted_total, after.tokens_predicted_total)
    if d_tok is None or d_tok < 0:
        return None
    rate = d_tok / interval_s
    return rate if rate < MAX_PLAUSIBLE_TOK_S else None


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return after - before


def _counters_reset(before: CounterReading, after: CounterReading) -> bool:
    if (
        before.process_start_s is not None
        and after.process_start_s is not None
        and abs(after.process_start_s - before.process_start_s) > 1.0
    ):
        return True
    pairs = (
        (before.tokens_predicted_total, after.tokens_predicted_total),
        (before.prompt_tokens_total, after.prompt_tokens_total),
        (before.spec_draft_tokens_total, after.spec_draft_tokens_total),
        (before.requests_total, after.requests_total),
    )
    return any(b is not None and a is not None and a < b for b, a in pairs)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _session_id(server: str, model: str, now_wall_s: float) -> str:
    digest = hashlib.sha1(f"{server}|{model}|{now_wall_s:.6f}".encode()).hexdigest()[:6]
    stamp = datetime.fromtimestamp(now_wall_s, tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{digest}"
