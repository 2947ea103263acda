"""The report's SVG plots: decode tok/s over time against the ceiling and the realistic band,
and decode tok/s against context depth with the ceiling curve the samples recorded.

Plain strings, no script and no external assets (`report.py` inlines them in its page).
Long sessions are averaged into at most MAX_PLOT_POINTS time buckets.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trayapp.core.physics import REALISTIC_BAND

MAX_PLOT_POINTS = 600  # per series; longer sessions are averaged into this many time buckets
MAX_SCATTER_POINTS = 1500


@dataclass(frozen=True)
class PlotSample:
    """One recorded sample, as the plots use it."""

    t_wall_s: float
    decode_tok_s: float | None
    ceiling_tok_s: float | None
    context_tokens: int | None


def escape_html(value: object) -> str:
    """`value` as HTML text (None as empty), quotes escaped too."""
    return html.escape("" if value is None else str(value), quote=True)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks: list[float] = []
    value = first
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _tick_label(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


class _Plot:
    """A minimal SVG chart: linear axes, polylines, bands and dots."""

    def __init__(self, title: str, x_label: str, y_label: str, x_range: tuple[float, float],
                 y_max: float, width: int = 760, height: int = 320) -> None:  # fmt: skip
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = 64, 16, 46, 44
        self.x0, self.x1 = x_range if x_range[1] > x_range[0] else (x_range[0], x_range[0] + 1.0)
        self.y1 = y_max if y_max > 0 else 1.0
        self.parts: list[str] = [
            f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{escape_html(title)}">',
            f"<title>{escape_html(title)}</title>",
            f'<text x="{self.left}" y="18" class="title">{escape_html(title)}</text>',
        ]
        self._axes(x_label, y_label)

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return self.left + (value - self.x0) / (self.x1 - self.x0) * span

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        return self.top + span - min(max(value, 0.0), self.y1 * 1.05) / (self.y1 * 1.05) * span

    def _axes(self, x_label: str, y_label: str) -> None:
        bottom, top = self.height - self.bottom, self.top
        left, right = self.left, self.width - self.right
        for tick in _nice_ticks(0.0, self.y1):
            y = self.y(tick)
            self.parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
            self.parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                              f"{_tick_label(tick)}</text>")  # fmt: skip
        for tick in _nice_ticks(self.x0, self.x1):
            x = self.x(tick)
            self.parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
            self.parts.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                              f"{_tick_label(tick)}</text>")  # fmt: skip
        self.parts.append(f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>')
        self.parts.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>')
        self.parts.append(f'<text class="label" x="{(left + right) / 2:.0f}" y="{self.height - 6}" '
                          f'text-anchor="middle">{escape_html(x_label)}</text>')  # fmt: skip
        middle = (top + bottom) / 2
        self.parts.append(f'<text class="label" transform="translate(14 {middle:.0f}) rotate(-90)" '
                          f'text-anchor="middle">{escape_html(y_label)}</text>')  # fmt: skip

    def line(self, points: Sequence[tuple[float, float | None]], css: str) -> None:
        """A polyline; None values break it into segments."""
        segment: list[str] = []
        for x, y in [*points, (math.nan, None)]:
            if y is None or not math.isfinite(x):
                if len(segment) == 1:
                    px, py = segment[0].split(",")
                    self.parts.append(f'<circle class="{css}" cx="{px}" cy="{py}" r="2"/>')
                elif segment:
                    self.parts.append(f'<polyline class="{css}" points="{" ".join(segment)}"/>')
                segment = []
            else:
                segment.append(f"{self.x(x):.1f},{self.y(y):.1f}")

    def band(self, points: Sequence[tuple[float, float, float]], css: str) -> None:
        """A filled area between two curves: (x, low, high) points."""
        if len(points) < 2:
            return
        upper = [f"{self.x(x):.1f},{self.y(hi):.1f}" for x, _, hi in points]
        lower = [f"{self.x(x):.1f},{self.y(lo):.1f}" for x, lo, _ in reversed(points)]
        self.parts.append(f'<polygon class="{css}" points="{" ".join(upper + lower)}"/>')

    def dots(self, points: Iterable[tuple[float, float]], css: str, radius: float = 2.5) -> None:
        for x, y in points:
            self.parts.append(
                f'<circle class="{css}" cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="{radius}"/>'
            )

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """A key row under the title."""
        x = float(self.left)
        for css, label in items:
            self.parts.append(f'<rect class="{css} key" x="{x:.0f}" y="26" width="10" height="10"/>')
            self.parts.append(f'<text class="legend" x="{x + 14:.0f}" y="35">{escape_html(label)}</text>')
            x += 30 + 6.5 * len(label)

    def svg(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def _buckets(samples: Sequence[PlotSample], start: float, end: float) -> list[PlotSample]:
    """Average samples into at most MAX_PLOT_POINTS time buckets (a gap stays a gap)."""
    if len(samples) <= MAX_PLOT_POINTS:
        return list(samples)
    width = max((end - start) / MAX_PLOT_POINTS, 1e-9)
    grouped: dict[int, list[PlotSample]] = {}
    for s in samples:
        index = min(int((s.t_wall_s - start) / width), MAX_PLOT_POINTS - 1)
        grouped.setdefault(index, []).append(s)
    result = []
    for index in sorted(grouped):
        group = grouped[index]
        rates = [s.decode_tok_s for s in group if s.decode_tok_s is not None]
        ceilings = [s.ceiling_tok_s for s in group if s.ceiling_tok_s is not None]
        contexts = [s.context_tokens for s in group if s.context_tokens is not None]
        result.append(
            PlotSample(
                t_wall_s=start + (index + 0.5) * width,
                decode_tok_s=statistics.fmean(rates) if rates else None,
                ceiling_tok_s=statistics.fmean(ceilings) if ceilings else None,
                context_tokens=max(contexts) if contexts else None,
            )
        )
    return result


def time_plot(samples: Sequence[PlotSample], requests: Sequence[tuple[float, float]], start: float) -> str:
    end = max([s.t_wall_s for s in samples] + [t for t, _ in requests] + [start + 1.0])
    minutes = end - start > 180
    scale = 60.0 if minutes else 1.0
    points = _buckets(samples, start, end)
    y_max = max(
        [s.ceiling_tok_s or 0.0 for s in points]
        + [s.decode_tok_s or 0.0 for s in points]
        + [r for _, r in requests]
    )
    plot = _Plot(
        "Decode speed over time",
        f"time since start ({'min' if minutes else 's'})",
        "tok/s",
        (0.0, (end - start) / scale),
        y_max,
    )
    low, high = REALISTIC_BAND
    plot.band(
        [((s.t_wall_s - start) / scale, s.ceiling_tok_s * low, s.ceiling_tok_s * high)
         for s in points if s.ceiling_tok_s is not None],
        "band",
    )  # fmt: skip
    plot.line([((s.t_wall_s - start) / scale, s.ceiling_tok_s) for s in points], "ceiling")
    plot.line([((s.t_wall_s - start) / scale, s.decode_tok_s) for s in points], "rate")
    plot.dots([((t - start) / scale, r) for t, r in requests], "request", radius=3.5)
    plot.legend([("rate", "decode tok/s"), ("ceiling", "ceiling"), ("band", "realistic 60–75 %"),
                 ("request", "finished requests")])  # fmt: skip
    return plot.svg()


def context_plot(samples: Sequence[PlotSample], requests: Sequence[tuple[int, float]]) -> str:
    measured = [(s.context_tokens, s.decode_tok_s) for s in samples
                if s.context_tokens is not None and s.decode_tok_s is not None]  # fmt: skip
    stride = max(1, math.ceil(len(measured) / MAX_SCATTER_POINTS))
    measured = measured[::stride]
    curve_points: dict[int, list[float]] = {}
    contexts = [s.context_tokens for s in samples if s.context_tokens is not None] + [c for c, _ in requests]
    x_max = float(max(contexts, default=0)) or 1.0
    bin_width = max(x_max / 120, 1.0)
    for s in samples:
        if s.context_tokens is not None and s.ceiling_tok_s is not None:
            curve_points.setdefault(int(s.context_tokens / bin_width), []).append(s.ceiling_tok_s)
    curve = [((b + 0.5) * bin_width, statistics.fmean(v)) for b, v in sorted(curve_points.items())]
    y_max = max([c for _, c in curve] + [r for _, r in measured] + [r for _, r in requests] + [0.0])
    plot = _Plot(
        "Decode speed against context depth", "context depth (tokens)", "tok/s", (0.0, x_max * 1.02), y_max
    )
    low, high = REALISTIC_BAND
    plot.band([(x, c * low, c * high) for x, c in curve], "band")
    plot.line(curve, "ceiling")
    plot.dots([(float(c), r) for c, r in measured], "rate-dot", radius=2.0)
    plot.dots([(float(c), r) for c, r in requests], "request", radius=3.5)
    plot.legend([("rate", "decode tok/s"), ("ceiling", "ceiling (recorded)"), ("band", "realistic 60–75 %"),
                 ("request", "finished requests")])  # fmt: skip
    return plot.svg()
