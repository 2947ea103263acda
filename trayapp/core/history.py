"""Bounded recent history per (server, model), for the dashboard's plots.

Pure: snapshots go in, numpy arrays come out. Fed on every snapshot even while
the dashboard is hidden (cheap: a few appends), read only when it draws.
Polled rates are `nan` whenever a model is not decoding, so plots show gaps,
not zeros. Finished requests (exact where the server timed them) are kept
apart from the polled line.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from trayapp.core import physics
from trayapp.core.model import ModelKey, ModelStatus, Snapshot
from trayapp.core.phases import is_busy
from trayapp.core.units import GB

NAN = math.nan


@dataclass(frozen=True)
class Sample:
    t_wall_s: float
    decode_tok_s: float  # nan when not decoding
    ceiling_tok_s: float  # nan when unknown
    context_tokens: float  # nan when unknown
    exact: bool


@dataclass(frozen=True)
class RequestPoint:
    t_wall_s: float
    decode_tok_s: float
    context_tokens: float  # nan when unknown
    exact: bool


@dataclass
class _Series:
    samples: deque[Sample]
    requests: deque[RequestPoint]
    last_t_wall_s: float = -math.inf


@dataclass(frozen=True)
class SeriesArrays:
    """Columns of one model's recent history (all float64)."""

    t_wall_s: np.ndarray
    decode_tok_s: np.ndarray
    ceiling_tok_s: np.ndarray
    context_tokens: np.ndarray
    exact: np.ndarray  # bool
    request_t_wall_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    request_tok_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    request_context_tokens: np.ndarray = field(default_factory=lambda: np.empty(0))
    request_exact: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))


def _f(value: float | int | None) -> float:
    return NAN if value is None else float(value)


class History:
    """Ring buffers of recent samples, at most `window_s` old and `max_points` long per model."""

    def __init__(
        self, window_s: float = 600.0, max_points: int = 1800, max_requests: int = 500, gap_s: float = 15.0
    ) -> None:
        self.window_s = window_s
        self.max_points = max_points
        self.max_requests = max_requests
        self.gap_s = gap_s  # a silence longer than this breaks the line (paused, server away)
        self._series: dict[ModelKey, _Series] = {}
        self.latest_t_wall_s: float | None = None

    def model_keys(self) -> list[ModelKey]:
        return list(self._series)

    def __len__(self) -> int:
        return sum(len(s.samples) for s in self._series.values())

    def _get(self, key: ModelKey) -> _Series:
        series = self._series.get(key)
        if series is None:
            series = _Series(deque(maxlen=self.max_points), deque(maxlen=self.max_requests))
            self._series[key] = series
        return series

    def add(self, snapshot: Snapshot) -> None:
        now = snapshot.t_wall_s
        self.latest_t_wall_s = now
        seen: set[ModelKey] = set()
        for server, model in snapshot.models():
            key = (server.url, model.name)
            seen.add(key)
            series = self._get(key)
            if now - series.last_t_wall_s > self.gap_s and series.samples:
                series.samples.append(Sample(series.last_t_wall_s + 1e-3, NAN, NAN, NAN, False))
            decoding = model.phase == "decoding" and model.decode_tok_s is not None
            rate = float(model.decode_tok_s) if decoding and model.decode_tok_s is not None else NAN
            if model.phase == "stalled":
                rate = 0.0
            series.samples.append(
                Sample(now, rate, _f(model.ceiling_tok_s), _f(model.context_tokens), bool(model.decode_exact))
            )
            series.last_t_wall_s = now
        for record in snapshot.requests:
            if record.decode_tok_s is None:
                continue
            key = (record.server, record.model)
            self._get(key).requests.append(
                RequestPoint(
                    record.finished_wall_s, record.decode_tok_s, _f(record.context_tokens), record.exact
                )
            )
        for key, series in list(self._series.items()):
            if key not in seen and series.samples and not math.isnan(series.samples[-1].decode_tok_s):
                series.samples.append(Sample(now, NAN, NAN, NAN, False))  # gone: break the line
        self._prune(now)

    def _prune(self, now: float) -> None:
        oldest = now - self.window_s
        for key, series in list(self._series.items()):
            while series.samples and series.samples[0].t_wall_s < oldest:
                series.samples.popleft()
            while series.requests and series.requests[0].t_wall_s < oldest:
                series.requests.popleft()
            if not series.samples and not series.requests:
                del self._series[key]

    def arrays(self, key: ModelKey) -> SeriesArrays:
        series = self._series.get(key)
        samples = list(series.samples) if series else []
        requests = list(series.requests) if series else []
        return SeriesArrays(
            t_wall_s=np.array([s.t_wall_s for s in samples], dtype=float),
            decode_tok_s=np.array([s.decode_tok_s for s in samples], dtype=float),
            ceiling_tok_s=np.array([s.ceiling_tok_s for s in samples], dtype=float),
            context_tokens=np.array([s.context_tokens for s in samples], dtype=float),
            exact=np.array([s.exact for s in samples], dtype=bool),
            request_t_wall_s=np.array([r.t_wall_s for r in requests], dtype=float),
            request_tok_s=np.array([r.decode_tok_s for r in requests], dtype=float),
            request_context_tokens=np.array([r.context_tokens for r in requests], dtype=float),
            request_exact=np.array([r.exact for r in requests], dtype=bool),
        )

    def ceiling_points(self, key: ModelKey) -> list[tuple[float, float]]:
        """(context tokens, ceiling tok/s) pairs seen, one per context depth, sorted by depth."""
        series = self._series.get(key)
        points: dict[float, float] = {}
        for sample in series.samples if series else ():
            if not math.isnan(sample.context_tokens) and not math.isnan(sample.ceiling_tok_s):
                points[sample.context_tokens] = sample.ceiling_tok_s
        return sorted(points.items())


def expected_ceiling_curve(
    model: ModelStatus, max_context_tokens: int, kv_type: str = "f16", points: int = 33
) -> list[tuple[int, float]]:
    """The KV model's expected ceiling (tok/s) against context depth, for the dashboard.

    Anchored on the model's live ceiling: the effective bandwidth that explains
    `ceiling_tok_s` at the current depth (it folds in any CPU/GPU split) is fed
    to `physics.ceiling_curve`. [] when the facts or the ceiling are unknown.
    """
    facts = model.facts
    if facts is None or not model.ceiling_tok_s or max_context_tokens <= 0:
        return []
    depth = model.context_tokens if is_busy(model.phase) and model.context_tokens is not None else 0
    bytes_now = physics.bytes_per_token_at_context(facts, depth, kv_type)
    if bytes_now <= 0:
        return []
    effective_gbps = model.ceiling_tok_s * bytes_now / GB
    return physics.ceiling_curve(facts, effective_gbps, max_context_tokens, kv_type, points=points)
