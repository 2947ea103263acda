"""The rate-vs-time plot: decode tok/s (or ms/token) over the last minutes, against the ceiling
as recorded with each sample (a step line: a past point against its own ceiling, not today's),
the realistic band, reading speed and the user's floor.

Its curves, bands and lines are made once; each redraw feeds them with `setData` / `setValue`.
Gaps while idle stay gaps (nan with connect="finite"); polled rates (estimated) are a line,
finished requests are points (filled: exact server timings, hollow: estimated).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from trayapp.core.diagnose import band_text, healthy_band_shares, usable_calibration
from trayapp.core.history import SeriesArrays
from trayapp.core.peers import PeerBand
from trayapp.core.thresholds import Thresholds
from trayapp.ui.dashboard.plotting import (
    READING_BAND_TOK_S,
    STATIC_ITEM,
    Plot,
    add_legend,
    add_points,
    finite_max,
)

MIN_SPAN_S = 120.0  # the time axis shows at least this much, more as history grows (up to the window)
RIGHT_PAD = 0.03  # room right of "now" so the newest points are not cut by the plot's edge
HEADROOM = 1.25  # y range above the data: the one-row legend sits there, clear of the curves


def time_span_s(first_t_wall_s: float | None, now_s: float, window_s: float) -> float:
    """How much time the plot shows: the history there is, at least MIN_SPAN_S, at most the window."""
    seen = now_s - first_t_wall_s if first_t_wall_s is not None else 0.0
    return min(max(seen, MIN_SPAN_S), window_s)


def step_xy(t_wall_s: np.ndarray, values: np.ndarray, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """A step line: each value holds from its sample's time to the next one's (the last up to
    `end_s`); nan values stay gaps."""
    if not t_wall_s.size:
        return np.empty(0), np.empty(0)
    ends = np.append(t_wall_s[1:], max(end_s, float(t_wall_s[-1])))
    return np.column_stack((t_wall_s, ends)).ravel(), np.repeat(values, 2)


def floor_label(floor_tok_s: float, ms_per_token: bool) -> str:
    """'floor 3' (tok/s) or 'floor 333 ms' (ms/token)."""
    return f"floor {1000 / floor_tok_s:.0f} ms" if ms_per_token else f"floor {floor_tok_s:g}"


class RateTimePlot(Plot):
    """Decode rate over time for one model; `show_model(None, …)` empties it."""

    def __init__(self, window_s: float) -> None:
        super().__init__(axisItems={"bottom": pg.DateAxisItem()})
        self.window_s = window_s
        self.floor_tok_s = Thresholds().below_floor_tok_s
        self.setTitle("decode tok/s, last 10 min")
        self.setMouseEnabled(x=False, y=True)
        # No grid: with its minor lines it was most of the cost of each repaint (~60 %); the ceiling,
        # band and floor lines are the references that matter here.
        add_legend(self, 3)
        # No clip-to-view / downsampling: History holds at most 1,800 points, cheap to draw, and
        # with them every scroll of the time axis recomputed every series.
        self.reading_band = pg.LinearRegionItem(
            READING_BAND_TOK_S,
            orientation="horizontal",
            movable=False,
            brush=pg.mkBrush(90, 160, 255, 35),
            pen=pg.mkPen(None),
        )
        self.realistic_band = pg.LinearRegionItem(
            (0, 0),
            orientation="horizontal",
            movable=False,
            brush=pg.mkBrush(80, 200, 120, 45),
            pen=pg.mkPen(None),
        )
        self.realistic_band.hide()
        pg.InfLineLabel(
            self.reading_band.lines[1],
            "reading speed 5–10",
            position=0.01,
            anchors=[(0, 1), (0, 1)],
            color=(150, 190, 255),
        )
        self.realistic_label = pg.InfLineLabel(
            self.realistic_band.lines[1],
            f"realistic {band_text(None)}",
            position=0.01,
            anchors=[(0, 1), (0, 1)],
            color=(120, 210, 140),
        )
        self.realistic_label.setText(f"realistic {band_text(None)}")  # made while hidden: no text yet
        self.floor_line = pg.InfiniteLine(
            self.floor_tok_s,
            angle=0,
            movable=False,
            pen=pg.mkPen((220, 80, 80), style=Qt.PenStyle.DotLine),
            label=floor_label(
                self.floor_tok_s, False
            ),  # right end: clear of "reading speed" at a big y scale
            labelOpts={"position": 0.99, "color": (220, 120, 120), "anchors": [(1, 1), (1, 1)]},
        )
        self.ceiling_line = pg.InfiniteLine(
            0,
            angle=0,
            movable=False,
            pen=pg.mkPen((230, 230, 230), width=1.5),
            label="ceiling {value:.0f}",
            labelOpts={"position": 0.01, "color": (230, 230, 230), "anchors": [(0, 1), (0, 1)]},
        )
        self.ceiling_line.hide()
        self._ceiling_pen = self.ceiling_line.pen
        self.recorded_ceiling = self.plot(  # no name: the line's label names it
            connect="finite", pen=pg.mkPen((230, 230, 230), width=1.5), **STATIC_ITEM
        )
        self.bench_line = pg.InfiniteLine(  # the stored bench's decode at depth 0 (`llm-tray bench`)
            0,
            angle=0,
            movable=False,
            pen=pg.mkPen((120, 200, 255), width=1.5, style=Qt.PenStyle.DashLine),
            label="bench {value:.0f}",
            labelOpts={"position": 0.5, "color": (150, 210, 255), "anchors": [(0.5, 1), (0.5, 1)]},
        )
        self.bench_line.hide()
        lines = (self.reading_band, self.realistic_band, self.floor_line, self.ceiling_line, self.bench_line)
        for band in lines:
            self.addItem(band, ignoreBounds=True)
        self.decode_curve = self.plot(
            name="polled (estimated)", connect="finite", pen=pg.mkPen((255, 190, 60), width=2), **STATIC_ITEM
        )
        self.exact_points = add_points(self, "finished request (exact)", 7, (255, 255, 255))
        self.estimated_points = add_points(
            self, "finished request (estimated)", 7, None, pg.mkPen((255, 255, 255), width=1.5)
        )

    def set_floor_tok_s(self, floor_tok_s: float) -> None:
        """The user's floor (Thresholds.below_floor_tok_s); drawn at the next `show_model`."""
        self.floor_tok_s = floor_tok_s

    def clear_model(self) -> None:
        self.set_text("left", self.unit())
        self.set_text("title", f"decode {self.unit()}")
        for curve in (self.decode_curve, self.exact_points, self.estimated_points, self.recorded_ceiling):
            curve.setData([], [])
        self.ceiling_line.hide()
        self.realistic_band.hide()
        self.bench_line.hide()
        self._draw_references()

    def show_model(
        self,
        arrays: SeriesArrays,
        ceiling_tok_s: float | None,
        now_s: float,
        calibrated_efficiency: float | None = None,
        bench_tok_s: float | None = None,
        peer_band: PeerBand | None = None,
    ) -> tuple[int, int]:
        """Draw one model's history; returns (finite decode points, all points). With a calibration
        (a bench's efficiency here) the realistic band is centred on it, as `low_efficiency` is;
        `bench_tok_s` (that bench's decode at depth 0) is drawn as a dashed line. Without one, the
        published peers' band (`peer_band`, #23) is the band, labelled with its basis."""
        self.set_text("left", self.unit())
        y = self.y(arrays.decode_tok_s)
        self.decode_curve.setData(arrays.t_wall_s, y, connect="finite")
        request_y = self.y(arrays.request_tok_s)
        exact = arrays.request_exact
        self.exact_points.setData(arrays.request_t_wall_s[exact], request_y[exact])
        self.estimated_points.setData(arrays.request_t_wall_s[~exact], request_y[~exact])

        ceiling = ceiling_tok_s
        if ceiling is None:
            finite = arrays.ceiling_tok_s[np.isfinite(arrays.ceiling_tok_s)]
            ceiling = float(finite[-1]) if finite.size else None
        self._draw_ceiling(ceiling, calibrated_efficiency, peer_band)
        self._draw_recorded_ceiling(arrays, now_s)
        self._draw_bench(bench_tok_s)
        self._draw_references()

        starts = [float(a[0]) for a in (arrays.t_wall_s, arrays.request_t_wall_s) if a.size]
        span = time_span_s(min(starts) if starts else None, now_s, self.window_s)
        self.set_text("title", f"decode {self.unit()}, last {span / 60:.0f} min")
        self.setXRange(now_s - span, now_s + span * RIGHT_PAD, padding=0)
        top = finite_max(y, request_y)
        if self.ms_per_token:  # zoom on the data: a fast model's 2 ms/token must not sit flat on 0
            fastest = 1000 / ceiling if ceiling else 0.0
            floor_ms = 1000 / self.floor_tok_s if self.floor_tok_s > 0 else 1000 / READING_BAND_TOK_S[0]
            limit = max(top or 0.0, fastest) * HEADROOM or floor_ms * HEADROOM
        else:
            limit = max(top or 0.0, ceiling or 0.0, READING_BAND_TOK_S[1]) * HEADROOM
        self.setYRange(0, limit, padding=0)
        return int(np.isfinite(arrays.decode_tok_s).sum()), len(arrays.decode_tok_s)

    def _draw_ceiling(
        self,
        ceiling: float | None,
        calibrated_efficiency: float | None = None,
        peer_band: PeerBand | None = None,
    ) -> None:
        if not ceiling:
            self.ceiling_line.hide()
            self.realistic_band.hide()
            return
        # Shown before they move: a pyqtgraph line label ignores moves while hidden (stale text).
        self.ceiling_line.show()
        self.realistic_band.show()
        low_share, high_share = healthy_band_shares(calibrated_efficiency)
        name = "realistic" if usable_calibration(calibrated_efficiency) is None else "benched"
        text = f"{name} {band_text(calibrated_efficiency)}"
        if usable_calibration(calibrated_efficiency) is None and peer_band is not None:
            low_share, high_share, text = peer_band.low_share, peer_band.high_share, peer_band.label
        low, high = ceiling * low_share, ceiling * high_share
        self.realistic_label.setFormat(text)
        if self.ms_per_token:
            self.ceiling_line.setValue(1000 / ceiling)
            self.realistic_band.setRegion((1000 / high, 1000 / low))
        else:
            self.ceiling_line.setValue(ceiling)
            self.realistic_band.setRegion((low, high))
        self.ceiling_line.label.setFormat(
            "fastest {value:.1f} ms/token" if self.ms_per_token else "ceiling {value:.0f}"
        )

    def _draw_recorded_ceiling(self, arrays: SeriesArrays, now_s: float) -> None:
        """The ceilings the samples recorded, as a step line; the ceiling line keeps only its label
        (today's value) while there is one, and draws across the plot when no sample recorded one."""
        x, y = step_xy(arrays.t_wall_s, self.y(arrays.ceiling_tok_s), now_s)
        recorded = bool(np.isfinite(y).any())
        self.recorded_ceiling.setData(x if recorded else [], y if recorded else [], connect="finite")
        pen = pg.mkPen(None) if recorded else self._ceiling_pen
        if self.ceiling_line.pen != pen:
            self.ceiling_line.setPen(pen)

    def _draw_bench(self, bench_tok_s: float | None) -> None:
        if not bench_tok_s:
            self.bench_line.hide()
            return
        self.bench_line.show()  # before it moves (a hidden line's label keeps stale text)
        self.bench_line.setValue(1000 / bench_tok_s if self.ms_per_token else bench_tok_s)
        unit = "bench {value:.1f} ms/token" if self.ms_per_token else "bench {value:.0f}"
        self.bench_line.label.setFormat(unit)

    def _draw_references(self) -> None:
        """Reading band and floor, in the current unit (a floor of 0 is no line)."""
        if self.ms_per_token:
            self.reading_band.setRegion((1000 / READING_BAND_TOK_S[1], 1000 / READING_BAND_TOK_S[0]))
        else:
            self.reading_band.setRegion(READING_BAND_TOK_S)
        if self.floor_tok_s <= 0:
            self.floor_line.hide()
            return
        self.floor_line.show()  # before it moves: a hidden line's label keeps stale text
        self.floor_line.setValue(1000 / self.floor_tok_s if self.ms_per_token else self.floor_tok_s)
        self.floor_line.label.setFormat(floor_label(self.floor_tok_s, self.ms_per_token))
