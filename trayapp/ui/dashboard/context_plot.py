"""The rate-vs-context plot: decode tok/s (or ms/token) against context depth, with the KV model's
expected ceiling curve. Its series are made once and fed with `setData`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from trayapp.core.history import SeriesArrays, expected_ceiling_curve
from trayapp.core.model import ModelStatus
from trayapp.ui.dashboard.plotting import (
    READING_BAND_TOK_S,
    STATIC_ITEM,
    Plot,
    add_legend,
    add_points,
    finite_max,
)

CONTEXT_HEADROOM = 1.4  # y range above the data: room for the one-row legend on this (shorter) plot


class RateContextPlot(Plot):
    """Decode rate against context depth for one model; `clear_model()` empties it."""

    def __init__(self) -> None:
        super().__init__()
        self.setTitle("tok/s vs context depth")
        self.setLabel("bottom", "context tokens")
        add_legend(self, 3)
        self.expected_curve = self.plot(
            name="ceiling (KV model)",
            pen=pg.mkPen((200, 200, 200), width=1.5, style=Qt.PenStyle.DashLine),
            **STATIC_ITEM,
        )
        self.context_points = add_points(self, "polled", 5, (255, 190, 60, 190))
        self.context_exact_points = add_points(self, "finished requests", 7, (255, 255, 255))

    def clear_model(self) -> None:
        self.set_text("left", self.unit())
        for item in (self.expected_curve, self.context_points, self.context_exact_points):
            item.setData([], [])

    def show_model(
        self,
        arrays: SeriesArrays,
        model: ModelStatus | None,
        kv_type: str,
        ceiling_points: Sequence[tuple[float, float]],
    ) -> None:
        """Draw one model; `ceiling_points`: the ceilings seen at each depth, for when the model's
        facts are unknown (no KV curve to compute)."""
        self.set_text("left", self.unit())
        polled = np.isfinite(arrays.decode_tok_s) & np.isfinite(arrays.context_tokens)
        polled_y = self.y(arrays.decode_tok_s[polled])
        self.context_points.setData(arrays.context_tokens[polled], polled_y)
        done = np.isfinite(arrays.request_context_tokens)
        done_y = self.y(arrays.request_tok_s[done])
        self.context_exact_points.setData(arrays.request_context_tokens[done], done_y)
        curve: Sequence[tuple[float, float]] = []
        if model is not None:
            seen = arrays.context_tokens[np.isfinite(arrays.context_tokens)]
            deepest = float(seen.max()) if seen.size else 0.0
            limit = model.context_length or int(deepest * 1.25) or 8192
            curve = [(float(c), r) for c, r in expected_ceiling_curve(model, int(limit), kv_type)]
        if not curve:
            curve = ceiling_points
        xs = np.array([c for c, _ in curve], dtype=float)
        ys = self.y(np.array([r for _, r in curve], dtype=float))
        self.expected_curve.setData(xs, ys)
        top = finite_max(ys, polled_y, done_y)
        self.setYRange(0, (top or READING_BAND_TOK_S[1]) * CONTEXT_HEADROOM, padding=0)
