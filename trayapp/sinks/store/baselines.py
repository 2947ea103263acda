"""Baselines: a stored bench of a model, else its typical comparable earlier session, for the
`regression` detector.

Only what deserves to be one: a bench whose decode runs spread more than `BASELINE_MAX_CV` is
never a baseline (nor a calibration or a bench line); a session's exact figures (server timings of
finished requests, proxy records) are used before its polled estimates, its finished requests' polled
rates (each over a whole decode) before its polled ticks, and a session with only ticks needs
`min_values` of them; sessions with exact figures win over estimated ones, and of
the newest `TYPICAL_OF` such sessions the baseline is the median one (the lower of two), so one
lucky fast session does not become the yardstick.

`BaselineQueries` is the baseline half of `Store`. It answers with the core's own
`trayapp.core.model.Baseline` and keeps the one baseline cache: the monitor asks every tick.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
import threading
from collections.abc import Mapping

from trayapp.core.bench import BASELINE_MAX_CV
from trayapp.core.model import Baseline
from trayapp.core.ttl_cache import TtlCache

BASELINE_CACHE_S = 60.0  # the monitor asks every tick; the answer may be this old
_BASELINE_CONTEXT_STEP = math.log(1.05)  # contexts within ~5 % share a cached answer
_MAX_CACHED = 256
TYPICAL_OF = 5  # the baseline is the median session of this many newest comparable ones
_STABLE = f"AND (decode_cv IS NULL OR decode_cv <= {BASELINE_MAX_CV!r}) "

_CANDIDATES_SQL = (
    "SELECT session_id, started_wall_s, server_version, spec_type FROM sessions "
    "WHERE model = :model AND quantization IS :quantization AND hardware IS :hardware "
    "AND spec_type IS :spec_type "
    "AND started_wall_s < :before_wall_s AND COALESCE(ended_wall_s, started_wall_s) >= :oldest_wall_s "
    "AND session_id IS NOT :exclude_session "
    "ORDER BY started_wall_s DESC LIMIT 200"
)
_BENCH_SQL = (
    "SELECT started_wall_s, server_version, spec_type, depth_tokens, context_tokens, decode_tok_s, runs, "
    "decode_exact FROM bench WHERE model = :model AND quantization IS :quantization "
    "AND hardware IS :hardware AND spec_type IS :spec_type AND finished_wall_s < :before_wall_s "
    "AND finished_wall_s >= :oldest_wall_s AND decode_tok_s > 0 "
    + _STABLE
    + "ORDER BY started_wall_s DESC, depth_tokens LIMIT 200"
)
_CALIBRATION_SQL = (
    "SELECT efficiency FROM bench WHERE model = :model AND hardware IS :hardware AND depth_tokens = 0 "
    "AND judged = 1 AND efficiency > 0 AND finished_wall_s < :before_wall_s "
    + _STABLE
    + "ORDER BY started_wall_s DESC LIMIT 1"
)
_BENCH_RATE_SQL = (
    "SELECT decode_tok_s FROM bench WHERE model = :model AND quantization IS :quantization "
    "AND hardware IS :hardware AND depth_tokens = 0 AND decode_tok_s > 0 "
    "AND finished_wall_s < :before_wall_s " + _STABLE + "ORDER BY started_wall_s DESC LIMIT 1"
)
_RATES_SQL = (  # rate, context, exact, a whole request's (1) or a polled tick's (0)
    "SELECT decode_tok_s, context_tokens, COALESCE(decode_exact, 0), 0 FROM samples "
    "WHERE session_id = :session_id AND decode_tok_s > 0 AND t_wall_s < :before_wall_s "
    "UNION ALL SELECT decode_tok_s, context_tokens, exact, 1 FROM requests WHERE session_id = :session_id "
    "AND decode_tok_s > 0 AND finished_wall_s < :before_wall_s"
)


def new_baseline_caches() -> tuple[
    TtlCache[tuple[object, ...], Baseline | None], TtlCache[tuple[object, ...], float | None]
]:
    """The empty caches of `baseline()` and of the bench values (`bench_rate`, `calibration`)."""
    return TtlCache(BASELINE_CACHE_S, _MAX_CACHED), TtlCache(BASELINE_CACHE_S, _MAX_CACHED)


def comparable_context(context: int | None, target: int | None, tolerance: float) -> bool:
    """`context` within ±`tolerance` (relative) of `target`, or both under 1024 tokens; any
    context compares with an unknown target, an unknown one with no known target."""
    if target is None:
        return True
    if context is None:
        return False
    if context < 1024 and target < 1024:
        return True
    return abs(context - target) <= tolerance * target


class BaselineQueries:
    """`baseline()` over `_conn` (set up by `Store`, with the caches of `new_baseline_caches()`)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    _baseline_cache: TtlCache[tuple[object, ...], Baseline | None]
    _bench_cache: TtlCache[tuple[object, ...], float | None]  # bench_rate, calibration

    def bench_rate(
        self, *, model: str, quantization: str | None, hardware: str | None, before_wall_s: float
    ) -> float | None:
        """The decode tok/s at depth 0 of the newest bench of this (model, quantization, hardware)
        finished before `before_wall_s` (the dashboard's bench line), or None. Cached like `baseline()`."""
        query = {"model": model, "quantization": quantization, "hardware": hardware}
        return self._newest_bench_value(_BENCH_RATE_SQL, query, before_wall_s)

    def calibration(self, *, model: str, hardware: str | None, before_wall_s: float) -> float | None:
        """The efficiency (decode ÷ ceiling at depth 0) of the newest bench of `model` on `hardware`
        finished before `before_wall_s`, judged as the monitor judges it (a GPU machine, the model
        fully in GPU memory); None when it was never benched so. Cached like `baseline()`."""
        query = {"model": model, "hardware": hardware}
        return self._newest_bench_value(_CALIBRATION_SQL, query, before_wall_s)

    def _newest_bench_value(
        self, sql: str, query: dict[str, str | None], before_wall_s: float
    ) -> float | None:
        """The one value `sql` selects for `query` before `before_wall_s`, cached per query."""

        def newest() -> float | None:
            with self._lock:
                row = self._conn.execute(sql, {**query, "before_wall_s": before_wall_s}).fetchone()
            return None if row is None else float(row[0])

        return self._bench_cache.get_or_compute((sql, *query.values()), before_wall_s, newest)

    def baseline(
        self,
        *,
        model: str,
        quantization: str | None,
        hardware: str | None,
        context_tokens: int | None,
        before_wall_s: float,
        exclude_session: str | None = None,
        context_tolerance: float = 0.5,
        max_age_s: float = 30 * 86400.0,
        min_values: int = 3,
        spec_type: str | None = None,
    ) -> Baseline | None:
        """The newest stable stored bench at a comparable context, else the typical comparable recent
        session (see the module's docstring). A bench wins: it was measured on purpose, on an idle
        server (`Baseline.source` says which; `Baseline.exact` whether its figures were exact).

        Comparable: same model, quantization, hardware and speculative decoding (None matches
        None: `spec_type=None` asks for plain-decode sessions), started
        before `before_wall_s` and active within `max_age_s` of it, and rates measured at a
        context depth within ±`context_tolerance` (relative) of `context_tokens`, or both
        under 1024 tokens. Rates come from decoding samples and finished requests: a session's
        exact ones when it has any, else its estimates, of which it needs `min_values`. Answers
        are cached for `BASELINE_CACHE_S` of `before_wall_s` (contexts within ~5 % share an
        answer): the monitor asks every tick.
        """
        bucket = (
            None
            if context_tokens is None
            else round(math.log(max(context_tokens, 1)) / _BASELINE_CONTEXT_STEP)
        )
        key = (
            model,
            quantization,
            hardware,
            spec_type,
            bucket,
            exclude_session,
            context_tolerance,
            max_age_s,
            min_values,
        )
        return self._baseline_cache.get_or_compute(
            key,
            before_wall_s,
            lambda: self._find_baseline(
                model=model,
                quantization=quantization,
                hardware=hardware,
                context_tokens=context_tokens,
                before_wall_s=before_wall_s,
                exclude_session=exclude_session,
                context_tolerance=context_tolerance,
                max_age_s=max_age_s,
                min_values=min_values,
                spec_type=spec_type,
            ),
        )

    def _find_baseline(
        self,
        *,
        model: str,
        quantization: str | None,
        hardware: str | None,
        context_tokens: int | None,
        before_wall_s: float,
        exclude_session: str | None,
        context_tolerance: float,
        max_age_s: float,
        min_values: int,
        spec_type: str | None,
    ) -> Baseline | None:
        query = {
            "model": model,
            "quantization": quantization,
            "hardware": hardware,
            "before_wall_s": before_wall_s,
            "oldest_wall_s": before_wall_s - max_age_s,
            "exclude_session": exclude_session,
            "spec_type": spec_type,
        }
        exact: list[Baseline] = []
        estimated: list[Baseline] = []
        with self._lock:
            bench = self._bench_baseline(
                query, model, quantization, hardware, context_tokens, context_tolerance
            )
            if bench is not None:
                return bench
            candidates = self._conn.execute(_CANDIDATES_SQL, query).fetchall()
            for session_id, started_wall_s, server_version, session_spec_type in candidates:
                if len(exact) >= TYPICAL_OF:
                    break
                rates = self._conn.execute(
                    _RATES_SQL, {"session_id": session_id, "before_wall_s": before_wall_s}
                ).fetchall()
                used = [
                    (r, c, bool(e), bool(whole))
                    for r, c, e, whole in rates
                    if comparable_context(c, context_tokens, context_tolerance)
                ]
                exact_used = [u for u in used if u[2]]
                requests_used = [u for u in used if u[3]]
                if exact_used:
                    used = exact_used
                elif requests_used:  # like `regression` judges: whole requests before polled ticks
                    used = requests_used
                elif len(used) < max(min_values, 1):
                    continue
                contexts = [u[1] for u in used if u[1] is not None]
                found = Baseline(
                    decode_tok_s=float(statistics.median(u[0] for u in used)),
                    context_tokens=int(statistics.median(contexts)) if contexts else None,
                    server_version=server_version,
                    session_id=session_id,
                    when_wall_s=started_wall_s,
                    spec_type=session_spec_type,
                    values=len(used),
                    model=model,
                    quantization=quantization,
                    hardware=hardware,
                    exact=bool(exact_used),
                )
                (exact if exact_used else estimated).append(found)
        newest = (exact or estimated)[:TYPICAL_OF]
        if not newest:
            return None
        by_rate = sorted(newest, key=lambda b: b.decode_tok_s)
        return by_rate[(len(by_rate) - 1) // 2]

    def _bench_baseline(
        self,
        query: Mapping[str, object],
        model: str,
        quantization: str | None,
        hardware: str | None,
        context_tokens: int | None,
        context_tolerance: float,
    ) -> Baseline | None:
        """The newest bench of the key with a depth at a context comparable to `context_tokens`
        (the closest of its depths; depth 0 when the context is unknown)."""
        rows = self._conn.execute(_BENCH_SQL, query).fetchall()
        benches: dict[float, list[sqlite3.Row]] = {}
        for row in rows:  # newest first
            benches.setdefault(row["started_wall_s"], []).append(row)
        for started_wall_s, points in benches.items():
            used = [
                p
                for p in points
                if comparable_context(p["context_tokens"], context_tokens, context_tolerance)
            ]
            if not used:
                continue
            if context_tokens is not None:
                used.sort(key=lambda p: abs((p["context_tokens"] or 0) - context_tokens))
            point = used[0]
            return Baseline(
                decode_tok_s=float(point["decode_tok_s"]),
                context_tokens=point["context_tokens"],
                server_version=point["server_version"],
                session_id=None,
                when_wall_s=started_wall_s,
                spec_type=point["spec_type"],
                values=int(point["runs"]),
                model=model,
                quantization=quantization,
                hardware=hardware,
                source="bench",
                exact=bool(point["decode_exact"]),
            )
        return None
