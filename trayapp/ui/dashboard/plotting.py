"""What both dashboard plots share: series options, the legend, scatter series, ms/token, text caching."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

# Series are re-set on each redraw anyway: no recomputing them on every view-range change (by default
# pyqtgraph re-filters each series whenever the y range moves, for its dynamic range limit).
STATIC_ITEM: dict[str, object] = {"dynamicRangeLimit": None}
READING_BAND_TOK_S = (5.0, 10.0)  # human reading speed


def ms_per_token(values: np.ndarray) -> np.ndarray:
    """tok/s → ms/token; nan where the rate is nan or not positive."""
    out = np.full(values.shape, np.nan)
    positive = np.isfinite(values) & (values > 0)
    np.divide(1000.0, values, out=out, where=positive)
    return out


def finite_max(*arrays: np.ndarray) -> float | None:
    values = [float(a[np.isfinite(a)].max()) for a in arrays if a.size and np.isfinite(a).any()]
    return max(values) if values else None


def add_legend(plot: pg.PlotWidget, columns: int) -> None:
    """A one-row legend at the top right on a dark, opaque-enough box (curves pass under it)."""
    plot.addLegend(
        offset=(-8, 4),
        colCount=columns,
        brush=pg.mkBrush(16, 16, 16, 215),
        pen=pg.mkPen(70, 70, 70),
        horSpacing=14,
    )


def add_points(
    plot: pg.PlotWidget, name: str, size: float, brush: object, pen: object = None
) -> pg.PlotDataItem:
    """A scatter series; its look is also set on the scatter now, so the legend draws it right
    before the first data arrives (pyqtgraph copies symbol options only with data)."""
    item = plot.plot(
        name=name, pen=None, symbol="o", symbolSize=size, symbolBrush=brush, symbolPen=pen, **STATIC_ITEM
    )
    item.scatter.setSize(size)
    item.scatter.setBrush(pg.mkBrush(brush))
    item.scatter.setPen(pg.mkPen(pen))
    return item


class Plot(pg.PlotWidget):
    """A PlotWidget that sets its title and axis labels only when they change (each set re-lays out
    rich text), and shows rates as tok/s or ms/token."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.ms_per_token = False
        self._texts: dict[str, str] = {}

    def set_text(self, where: str, text: str) -> None:
        """`where`: "title", or an axis ("left", "bottom")."""
        if self._texts.get(where) == text:
            return
        self._texts[where] = text
        if where == "title":
            self.setTitle(text)
        else:
            self.setLabel(where, text)

    def y(self, tok_s: np.ndarray) -> np.ndarray:
        """Rates as this plot shows them now."""
        return ms_per_token(tok_s) if self.ms_per_token else tok_s

    def unit(self) -> str:
        return "ms/token" if self.ms_per_token else "tok/s"

    def apply_ranges(self) -> None:
        """Apply the new view ranges now: left to the paint, they would schedule a second paint."""
        self.getViewBox().updateMatrix()
