"""The rates stage's parts: one stream's track, and the arithmetic on it.

`SlotTrack` is what `RateTracker` (rates.py) remembers of one slot between polls; the functions
here turn it into prefill progress, a window rate or a `RequestRecord`, and compare two counter
scrapes (throughput, deltas, resets). Pure, like rates.py: times are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    PrefillProgress,
    RequestRecord,
    ServerReading,
    SlotReading,
)

MAX_PLAUSIBLE_TOK_S = 50_000.0  # anything above is a counter glitch, not a rate


@dataclass
class SlotTrack:
    task_id: int | None
    first_seen_mono_s: float
    points: deque[tuple[float, int, int | None]] = field(default_factory=deque)  # (t, n_decoded, context)
    decode_started_mono_s: float | None = None
    first_decode_point: tuple[float, int] | None = None
    last_progress_mono_s: float = 0.0
    prompt_points: list[tuple[float, int]] = field(default_factory=list)  # (t, tokens read), at each change
    prompt_seen_midway: bool = False  # the first of them saw a batch begun at an unknown time
    last_n_decoded: int = 0
    last_context: int | None = None
    reported: bool = False


def prompt_tokens_read(slot: SlotReading) -> int:
    """The server's best current figure for a prompt being read: evaluated + cached tokens, or the
    KV fill (`context_tokens`) when that is ahead — llama-server's evaluated count stays at 1 through
    the whole first batch and trails by a batch after, while its KV fill already holds the batch."""
    read = (slot.prompt_tokens_processed or 0) + (slot.prompt_tokens_cached or 0)
    return max(read, slot.context_tokens or 0)


def note_prompt_read(state: SlotTrack, now_mono_s: float, slot: SlotReading) -> None:
    """Keep the polls that first saw a new count: each lies within one poll of a batch boundary,
    except a first one that found tokens already read (or a batch in flight)."""
    read_tokens = prompt_tokens_read(slot)
    if not state.prompt_points:
        state.prompt_seen_midway = read_tokens > (slot.prompt_tokens_cached or 0)
    if not state.prompt_points or state.prompt_points[-1][1] != read_tokens:
        state.prompt_points.append((now_mono_s, read_tokens))


def own_prompt_tok_s(state: SlotTrack) -> float | None:
    """This prompt's own reading speed: tokens ÷ seconds between the first and the last poll that
    saw the count change (a first poll that came midway is left out). None until two such polls —
    never another request's speed."""
    points = state.prompt_points[1:] if state.prompt_seen_midway else state.prompt_points
    if len(points) < 2:
        return None
    (t0, n0), (t1, n1) = points[0], points[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None


def prefill_progress(slot: SlotReading, state: SlotTrack) -> PrefillProgress:
    """One stream's prompt so far: tokens read (`prompt_tokens_read`), cached, this prompt's own
    reading speed, and an ETA from it."""
    cached = slot.prompt_tokens_cached or 0
    return _with_eta(
        PrefillProgress(prompt_tokens_read(slot), cached, slot.prompt_tokens_total, own_prompt_tok_s(state))
    )


def sum_prefill(parts: list[PrefillProgress]) -> PrefillProgress:
    totals = [p.tokens_total for p in parts if p.tokens_total is not None]
    rates = [p.tok_s for p in parts if p.tok_s is not None]
    return _with_eta(
        PrefillProgress(
            tokens_done=sum(p.tokens_done for p in parts),
            cached_tokens=sum(p.cached_tokens for p in parts),
            # Known only when every prompt's total is (llama-server gives none: never 0, never partial).
            tokens_total=sum(totals) if len(totals) == len(parts) else None,
            tok_s=sum(rates) if rates else None,
        )
    )


def _with_eta(progress: PrefillProgress) -> PrefillProgress:
    if progress.tokens_total is None or not progress.tok_s:
        return progress
    left = max(progress.tokens_total - progress.tokens_done, 0)
    return PrefillProgress(
        progress.tokens_done,
        progress.cached_tokens,
        progress.tokens_total,
        progress.tok_s,
        left / progress.tok_s,
    )


def _window_start(points: deque[tuple[float, int, int | None]], window_s: float) -> int | None:
    """Index of the window's first point: the newest poll that *first* saw a count at least
    `window_s` before the poll that first saw the newest count (else the oldest such first).
    Starting where a count first appeared keeps a slow stream's rate whole: a window starting
    between two tokens would count one token over part of the gap. None: one count only."""
    firsts = [i for i, (_, n, _) in enumerate(points) if i == 0 or n > points[i - 1][1]]
    if len(firsts) < 2:
        return None
    t_last = points[firsts[-1]][0]
    start = firsts[0]
    for i in firsts[:-1]:
        if t_last - points[i][0] >= window_s:
            start = i
    return start


def trim_window(points: deque[tuple[float, int, int | None]], window_s: float, max_points: int) -> None:
    """Drop the polls before the window's start (and any over `max_points`, the oldest first)."""
    start = _window_start(points, window_s) or 0
    for _ in range(start):
        points.popleft()
    while len(points) > max_points:
        points.popleft()


def window_rate(points: deque[tuple[float, int, int | None]], window_s: float) -> float | None:
    """Tokens ÷ seconds between the first polls that saw the window's first and newest counts, but
    no more than the newest count plus one over the seconds until now: a next token that has not
    come yet lowers it (a stream that slows or stalls reads so). None: one count seen only."""
    start = _window_start(points, window_s)
    if start is None:
        return None
    t0, n0, _ = points[start]
    t_now, n_now, _ = points[-1]
    t_last = next(t for t, n, _ in points if n == n_now)
    if t_last <= t0:
        return None
    rate = min((n_now - n0) / (t_last - t0), (n_now - n0 + 1) / (t_now - t0))
    return rate if rate < MAX_PLAUSIBLE_TOK_S else None


def record_from_track(
    reading: ServerReading, model_name: str, state: SlotTrack, now_wall_s: float
) -> RequestRecord | None:
    """A request as polling saw it: decode rate over the polls that saw it decoding."""
    if state.first_decode_point is None or not state.points:
        return None
    t0, n0 = state.first_decode_point
    t1, n1, _ = state.points[-1]
    rate = (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None
    prompt_rate = own_prompt_tok_s(state)
    return RequestRecord(
        server=reading.url,
        server_kind=reading.kind,
        model=model_name,
        finished_wall_s=now_wall_s,  # seen finished at this poll
        session_id=None,
        exact=False,
        decode_tokens=state.last_n_decoded or None,
        context_tokens=state.last_context,
        decode_tok_s=rate,
        prompt_tok_s=prompt_rate,
        source="slots",
    )


def record_from_finished(reading: ServerReading, fin: FinishedRequest) -> RequestRecord:
    return RequestRecord(
        server=reading.url,
        server_kind=reading.kind,
        model=fin.model,
        finished_wall_s=fin.finished_wall_s,
        session_id=None,
        exact=fin.decode_tok_s is not None and fin.decode_exact,
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
        cached_tokens=fin.cached_tokens,
        endpoint=fin.endpoint,
        http_status=fin.http_status,
        aborted=fin.aborted,
        prompt_rate_upper_bound=fin.prompt_rate_upper_bound,
        prompt_tokens_sent=fin.prompt_tokens_sent,
        prompt_sent_exact=fin.prompt_sent_exact,
        context_limit_tokens=fin.context_limit_tokens,
        stop_reason=fin.stop_reason,
        max_tokens_requested=fin.max_tokens_requested,
        queue_wait_s=fin.queue_wait_s,
        client_name=fin.client_name,
        client_pid=fin.client_pid,
    )


def counter_throughput(before: CounterReading, after: CounterReading, interval_s: float) -> float | None:
    """Generation tok/s over wall time from a live token counter (vLLM, SGLang)."""
    d_tok = counter_delta(before.tokens_predicted_total, after.tokens_predicted_total)
    if d_tok is None or d_tok < 0:
        return None
    rate = d_tok / interval_s
    return rate if rate < MAX_PLAUSIBLE_TOK_S else None


def counter_delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return after - before


def acceptance_by_position(before: CounterReading | None, after: CounterReading) -> tuple[float, ...]:
    """The share of drafts (verification steps) whose token at each draft position was accepted,
    between two readings (`before` None: since the server started). Positions past the last one
    ever accepted are left off (llama-server lists every position up to its draft maximum); () when
    the server reports no positions or no drafts were made in between."""
    drafts = after.spec_drafts_total
    if before is not None:
        drafts = counter_delta(before.spec_drafts_total, drafts)
    positions = after.spec_accepted_per_position
    if not drafts or drafts <= 0 or not positions:
        return ()
    earlier = before.spec_accepted_per_position if before is not None else ()
    if earlier and len(earlier) != len(positions):
        return ()
    accepted = [a - (earlier[i] if earlier else 0.0) for i, a in enumerate(positions)]
    reached = max((i + 1 for i, a in enumerate(positions) if a > 0), default=0)
    return tuple(max(0.0, min(1.0, a / drafts)) for a in accepted[:reached])


def counters_reset(before: CounterReading, after: CounterReading) -> bool:
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


SAME_REQUEST_WITHIN_S = 10.0  # a server's own record and the proxy's of one request finish this close


def merge_proxy_records(
    server_records: tuple[FinishedRequest, ...],
    proxy_records: Sequence[FinishedRequest],
    model_names: Sequence[str] = (),
) -> tuple[FinishedRequest, ...]:
    """A server's finished requests plus the proxy's, one record per request.

    A request the proxy saw is kept as the proxy recorded it (exact TTFT, cached tokens, status);
    the server's own record of it (same model and decode tokens, finished within
    SAME_REQUEST_WITHIN_S) goes. Requests that bypassed the proxy, and records with no tokens
    (a router's measured load), stay. A proxy record naming a model the server does not list
    (llama-server answers with its file path) is the server's only model when it has one.
    """
    if not proxy_records:
        return server_records
    if len(model_names) == 1:
        (only,) = model_names
        proxy_records = [p if p.model in model_names else replace(p, model=only) for p in proxy_records]

    def seen_by_proxy(record: FinishedRequest) -> bool:
        return record.decode_tokens is not None and any(
            p.model == record.model
            and p.decode_tokens == record.decode_tokens
            and abs(p.finished_wall_s - record.finished_wall_s) <= SAME_REQUEST_WITHIN_S
            for p in proxy_records
        )

    kept = tuple(r for r in server_records if not seen_by_proxy(r))
    return kept + tuple(proxy_records)


def with_prompt_totals(reading: ServerReading, totals: Sequence[tuple[str | None, int]]) -> ServerReading:
    """A reading whose prompt-reading slots carry the lengths the proxy counted for them.

    `totals` are (model asked for, prompt tokens) of the proxied prompts being read now. A model
    takes the totals that name it (or, with one loaded model, every total: llama-server answers to
    any name). They are given only when as many of its slots are reading a prompt as there are
    totals, paired smallest with smallest, and each covers what its slot has already read —
    otherwise a prompt that bypassed the proxy could be mistaken for a counted one.
    """
    if not totals:
        return reading
    loaded = [m for m in reading.models if m.loaded]
    models = []
    for model in reading.models:
        named = [n for name, n in totals if name == model.name]
        mine = named or ([n for _, n in totals] if len(loaded) == 1 and model is loaded[0] else [])
        reading_prompt = [s for s in model.slots if _reading_prompt(s)]
        if not mine or len(mine) != len(reading_prompt):
            models.append(model)
            continue
        by_done = sorted(reading_prompt, key=_prompt_done)
        pairs = dict(zip((s.slot_id for s in by_done), sorted(mine), strict=True))
        if any(pairs[s.slot_id] < _prompt_done(s) for s in reading_prompt):
            models.append(model)
            continue
        slots = tuple(
            replace(s, prompt_tokens_total=pairs[s.slot_id]) if s.slot_id in pairs else s for s in model.slots
        )
        models.append(replace(model, slots=slots))
    return replace(reading, models=tuple(models))


def _reading_prompt(slot: SlotReading) -> bool:
    return (
        slot.is_processing
        and not slot.n_decoded
        and slot.prompt_tokens_processed is not None
        and slot.prompt_tokens_total is None
    )


def _prompt_done(slot: SlotReading) -> int:
    return (slot.prompt_tokens_processed or 0) + (slot.prompt_tokens_cached or 0)
