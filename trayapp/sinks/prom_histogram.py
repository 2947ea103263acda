"""One Prometheus histogram's state, immutable: counts per bucket, their total and the cumulative view
`HistogramMetricFamily.add_metric` takes. Shared by /metrics' request histograms and its energy ones."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString


@dataclass(frozen=True)
class Histogram:
    """Counts per bucket (not cumulative; the last one is above every bound) and the sum of the values."""

    counts: tuple[int, ...]
    total: float  # in the values' unit (seconds, joules)

    @staticmethod
    def empty(bounds: tuple[float, ...]) -> Histogram:
        return Histogram((0,) * (len(bounds) + 1), 0.0)

    def add(self, bounds: tuple[float, ...], value: float) -> Histogram:
        i = bisect.bisect_left(bounds, value)  # the first bound >= value: `le` is inclusive
        counts = list(self.counts)
        counts[i] += 1
        return Histogram(tuple(counts), self.total + value)

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip([*map(floatToGoString, bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out
