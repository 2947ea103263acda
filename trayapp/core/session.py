"""The sessions stage: one continuous run of activity per (server, model), ended by an idle gap.

Pure: what the rates and placement stages decided goes in (as `SessionInput`s), session records
come out. Time is passed in: the monotonic clock decides idle gaps, wall time labels records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from trayapp.core.model import RequestRecord, ServerReading, SessionRecord
from trayapp.core.phases import is_busy
from trayapp.core.rates import RateEstimate


@dataclass(frozen=True)
class SessionInput:
    """One listed model at one tick, as the earlier stages decided it."""

    name: str
    rate: RateEstimate
    quantization: str | None
    gpu_fraction: float | None
    ceiling_tok_s: float | None  # at empty context, for the split in force (placement)
    hardware: str | None  # a stable label of the machine, to compare sessions
    requests: Sequence[RequestRecord] = ()
    spec_type: str | None = None  # speculative decoding in use


@dataclass(frozen=True)
class SessionTick:
    ids: dict[str, str]  # model name → its open session's id
    sessions: tuple[SessionRecord, ...]  # sessions that started, changed or ended at this tick


SILENT_REQUEST_MAX_S = 600.0  # longest a server may go unanswered mid-request and keep its session


@dataclass
class _Track:
    session: SessionRecord | None = None
    rate_n: int = 0
    rate_sum: float = 0.0
    prompt_n: int = 0
    prompt_sum: float = 0.0
    ttft_n: int = 0
    ttft_sum: float = 0.0
    last_activity_mono_s: float | None = None
    last_activity_wall_s: float | None = None
    busy_when_last_seen: bool = False  # the model's phase at the server's last answer
    silent_since_mono_s: float | None = None  # the first unanswered poll since that answer


SILENT_STATES = ("unreachable", "error")  # a poll that got no (whole) answer


def _note_silence(track: _Track, now_mono_s: float) -> None:
    """The first unanswered poll since an answer that showed the model busy starts its silence."""
    if track.busy_when_last_seen and track.silent_since_mono_s is None:
        track.silent_since_mono_s = now_mono_s


class SessionTracker:
    """Every (server, model)'s session across ticks. One instance per pipeline."""

    def __init__(self, idle_gap_s: float = 60.0) -> None:
        self.idle_gap_s = idle_gap_s
        self._tracks: dict[tuple[str, str], _Track] = {}

    def update(
        self, reading: ServerReading, models: Sequence[SessionInput], now_mono_s: float, now_wall_s: float
    ) -> SessionTick:
        changes: list[SessionRecord] = []
        ids: dict[str, str] = {}
        for model in models:
            track = self._tracks.setdefault((reading.url, model.name), _Track())
            changes.extend(self._update_one(reading, model, track, now_mono_s, now_wall_s))
            if track.session is not None:
                ids[model.name] = track.session.id

        listed = {m.name for m in models}
        for (url, name), track in list(self._tracks.items()):
            if url != reading.url or name in listed:
                continue
            if reading.status in SILENT_STATES:
                # Keep the session across a short outage; the idle gap still ends it, unless the
                # model was busy at the last answer (`_silent_mid_request`).
                _note_silence(track, now_mono_s)
                ended = self._maybe_end(track, now_mono_s)
                if ended is not None:
                    changes.append(ended)
                continue
            if track.session is not None:  # unloaded
                changes.append(self._end(track))
            del self._tracks[(url, name)]
        return SessionTick(ids, tuple(changes))

    def ids(self, url: str) -> dict[str, str]:
        """The open sessions' ids of one server (for a repeated reading, which changes nothing)."""
        return {
            name: track.session.id
            for (track_url, name), track in self._tracks.items()
            if track_url == url and track.session is not None
        }

    def open_sessions(self) -> list[SessionRecord]:
        return [t.session for t in self._tracks.values() if t.session is not None]

    def end_all(self) -> list[SessionRecord]:
        """Every open session, ended at its last activity: the recorder stops (a later start opens
        new ones, so a session left open would read "live" with no one recording it)."""
        return [self._end(track) for track in self._tracks.values() if track.session is not None]

    def note_alerts(self, server: str, model: str, kinds: set[str]) -> SessionRecord | None:
        """Add alert kinds raised now to the model's open session; the changed record, if it changed."""
        track = self._tracks.get((server, model))
        if track is None or track.session is None or kinds <= set(track.session.alerts):
            return None
        track.session = replace(track.session, alerts=tuple(sorted(set(track.session.alerts) | kinds)))
        return track.session

    # ------------------------------------------------------------------ one model

    def _update_one(
        self, reading: ServerReading, model: SessionInput, track: _Track, now_mono_s: float, now_wall_s: float
    ) -> list[SessionRecord]:
        changes: list[SessionRecord] = []
        # A failed poll may still name the model (a partial answer: /props answered, /slots timed
        # out) with a phase the server never said: silence, as when it names nothing.
        answered = reading.status not in SILENT_STATES
        if not answered:
            _note_silence(track, now_mono_s)
        elif self._silent_mid_request(track, now_mono_s):  # it answers again: it was busy all along
            track.last_activity_mono_s, track.last_activity_wall_s = now_mono_s, now_wall_s
        ended = self._maybe_end(track, now_mono_s)  # the idle gap passed (even unpolled)
        if ended is not None:
            changes.append(ended)
        requests = model.requests
        busy = answered and is_busy(model.rate.phase)
        if answered:
            track.busy_when_last_seen = busy
            track.silent_since_mono_s = None
        if not (busy or requests):
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
                quantization=model.quantization,
                spec_type=model.spec_type,
            )
            track.rate_n = track.prompt_n = track.ttft_n = 0
            track.rate_sum = track.prompt_sum = track.ttft_sum = 0.0
        track.last_activity_mono_s = now_mono_s
        track.last_activity_wall_s = now_wall_s
        session = track.session
        rate = model.rate.decode_tok_s
        peak = session.peak_decode_tok_s
        if rate is not None:
            peak = max(peak or 0.0, rate)
            track.rate_sum += rate
            track.rate_n += 1
        for r in requests:
            if r.prompt_tok_s is not None:
                track.prompt_n += 1
                track.prompt_sum += r.prompt_tok_s
            if r.ttft_s is not None:
                track.ttft_n += 1
                track.ttft_sum += r.ttft_s
            if r.decode_tok_s is not None and r.exact:
                peak = max(peak or 0.0, r.decode_tok_s)
        request_rates = [r.decode_tok_s for r in requests if r.decode_tok_s is not None]
        contexts = [c for c in (session.max_context_tokens, model.rate.context_tokens) if c is not None]
        contexts += [r.context_tokens for r in requests if r.context_tokens is not None]
        changed = replace(
            session,
            requests=session.requests + len(requests),
            decode_tokens=session.decode_tokens + sum(r.decode_tokens or 0 for r in requests),
            mean_decode_tok_s=(
                track.rate_sum / track.rate_n
                if track.rate_n
                else (sum(request_rates) / len(request_rates) if request_rates else session.mean_decode_tok_s)
            ),
            peak_decode_tok_s=peak,
            mean_prompt_tok_s=track.prompt_sum / track.prompt_n
            if track.prompt_n
            else session.mean_prompt_tok_s,
            mean_ttft_s=track.ttft_sum / track.ttft_n if track.ttft_n else session.mean_ttft_s,
            max_context_tokens=max(contexts) if contexts else None,
            gpu_fraction=model.gpu_fraction if model.gpu_fraction is not None else session.gpu_fraction,
            server_version=reading.version or session.server_version,
            quantization=model.quantization or session.quantization,
            ceiling_tok_s=model.ceiling_tok_s if model.ceiling_tok_s is not None else session.ceiling_tok_s,
            hardware=model.hardware or session.hardware,
            spec_type=model.spec_type or session.spec_type,
        )
        track.session = changed
        changes.append(changed)
        return changes

    def _silent_mid_request(self, track: _Track, now_mono_s: float) -> bool:
        """Polls have gone unanswered since an answer that showed this model busy, for less than
        SILENT_REQUEST_MAX_S: a long prompt batch on a busy CPU keeps llama-server from answering
        for minutes (its HTTP threads wait on the batch, then its listen queue fills: read, then
        connect timeouts). Not idleness: the session goes on, so the long request stays in the
        conversation it belongs to. Longer, it is a server dead mid-request: the idle gap ends the
        session at its last answer. (An unpolled gap — the monitor paused — proves nothing either way
        and is left to the idle gap.)"""
        since = track.silent_since_mono_s
        return since is not None and now_mono_s - since < SILENT_REQUEST_MAX_S

    def _maybe_end(self, track: _Track, now_mono_s: float) -> SessionRecord | None:
        if track.session is None or track.last_activity_mono_s is None:
            return None
        if self._silent_mid_request(track, now_mono_s):
            return None
        if now_mono_s - track.last_activity_mono_s < self.idle_gap_s:
            return None
        return self._end(track)

    def _end(self, track: _Track) -> SessionRecord:
        assert track.session is not None
        ended = replace(
            track.session, ended_wall_s=track.last_activity_wall_s or track.session.started_wall_s
        )
        track.session = None
        return ended


def _session_id(server: str, model: str, now_wall_s: float) -> str:
    digest = hashlib.sha1(f"{server}|{model}|{now_wall_s:.6f}".encode()).hexdigest()[:6]
    stamp = datetime.fromtimestamp(now_wall_s, tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{digest}"
