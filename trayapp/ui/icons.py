"""The tray icon, drawn with QPainter from an `IconState` (see trayapp.core.glance).

Readable at 16 px on light and dark panels: a dark disc with a light rim carries
the ring and the number, so the icon brings its own contrast. Health is told by
colour *and* shape:

* ok        green continuous ring (share of the ceiling), number
* degraded  amber ring broken into segments, number
* alert     red rounded square (a different silhouette) with the number or "!"
* idle      grey track, a short dash (or the last request's share, faintly)
* none      hollow circle with a slash, no fill
* offload   a blue corner notch (bottom right), on top of any of the above
* queued    an orange dot (top left): requests wait for a slot
* paused    two bars

The macOS template variant draws the same shapes in black with alpha only,
so the menu bar can tint it. Rendered pixmaps are cached by (state, size, ratio).
"""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QIcon, QPainter, QPainterPath, QPen, QPixmap

from trayapp.core.glance import IconState

HEALTH_COLOURS: dict[str, QColor] = {
    "ok": QColor(46, 160, 67),
    "degraded": QColor(227, 160, 8),
    "alert": QColor(218, 54, 51),
    "idle": QColor(139, 148, 158),
    "none": QColor(139, 148, 158),
}
OFFLOAD_COLOUR = QColor(56, 139, 253)
QUEUED_COLOUR = QColor(240, 136, 62)
PREFILL_COLOUR = QColor(163, 113, 247)  # reading a prompt: the ring is prompt progress, not the ceiling
DISC_COLOUR = QColor(28, 31, 36, 240)
RIM_COLOUR = QColor(255, 255, 255, 190)
TEXT_COLOUR = QColor(255, 255, 255)
ICON_SIZES = (16, 20, 22, 24, 32, 48, 64)


class _Palette:
    """Colours for one variant: full colour, or black-with-alpha for a template (mask) icon."""

    def __init__(self, template: bool) -> None:
        self.template = template

    def colour(self, colour: QColor, alpha: float = 1.0) -> QColor:
        if self.template:
            return QColor(0, 0, 0, round(255 * alpha))
        result = QColor(colour)
        result.setAlphaF(colour.alphaF() * alpha)
        return result


def _round_pen(colour: QColor, width: float) -> QPen:
    return QPen(colour, width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap, Qt.PenJoinStyle.RoundJoin)


def _halo(p: QPainter, path: QPainterPath, pen: QPen, pal: _Palette) -> None:
    """Separate a shape from what lies under it: a contrasting outline, or (template) a cleared gap."""
    if pal.template:
        p.setCompositionMode(QPainter.CompositionMode.CompositionMode_Clear)
        p.strokePath(path, pen)
        p.setCompositionMode(QPainter.CompositionMode.CompositionMode_SourceOver)
    else:
        p.strokePath(path, pen)


def _fit_font(text: str, max_width: float, max_height: float) -> QFont:
    font = QFont()
    font.setBold(True)
    font.setStretch(QFont.Stretch.SemiCondensed)
    font.setHintingPreference(QFont.HintingPreference.PreferFullHinting)
    size = max_height
    while size > 4:
        font.setPixelSize(max(round(size), 1))
        metrics = QFontMetricsF(font)
        if metrics.horizontalAdvance(text) <= max_width and metrics.capHeight() <= max_height * 0.8:
            break
        size -= 0.5
    return font


def _text_path(text: str, rect: QRectF) -> QPainterPath:
    font = _fit_font(text, rect.width(), rect.height())
    metrics = QFontMetricsF(font)
    path = QPainterPath()
    width = metrics.horizontalAdvance(text)
    baseline = rect.center().y() + metrics.capHeight() / 2
    path.addText(QPointF(rect.center().x() - width / 2, baseline), font, text)
    return path


def _draw_text(p: QPainter, text: str, rect: QRectF, pal: _Palette, halo: QColor) -> None:
    """Text with a halo so it stays readable over the ring."""
    path = _text_path(text, rect)
    _halo(p, path, _round_pen(halo, max(rect.height() * 0.16, 1.2)), pal)
    p.fillPath(path, QBrush(pal.colour(TEXT_COLOUR)))


def _draw_ring(p: QPainter, state: IconState, rect: QRectF, stroke: float, pal: _Palette) -> None:
    colour = PREFILL_COLOUR if state.prefill and state.health == "ok" else HEALTH_COLOURS[state.health]
    track = QPen(pal.colour(colour, 0.35), stroke)
    track.setCapStyle(Qt.PenCapStyle.FlatCap)
    segmented = state.health == "degraded"
    if segmented:  # a broken ring: shape, not only colour, says "degraded"
        circumference = 3.14159 * rect.width()
        dash = circumference / 8 / stroke
        track.setDashPattern([dash * 0.62, dash * 0.38])
    p.setPen(track)
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawEllipse(rect)
    if state.ring is None or state.ring <= 0:
        return
    arc = QPen(pal.colour(colour, 0.8 if state.ring_faint else 1.0), stroke)
    arc.setCapStyle(Qt.PenCapStyle.FlatCap)
    if segmented:
        arc.setDashPattern(track.dashPattern())
    p.setPen(arc)
    p.drawArc(rect, 90 * 16, -round(state.ring * 360 * 16))


def _draw_disc(p: QPainter, rect: QRectF, pal: _Palette, rim: float) -> None:
    if pal.template:
        return
    p.setPen(QPen(RIM_COLOUR, rim))
    p.setBrush(DISC_COLOUR)
    p.drawEllipse(rect)


def _draw_alert(p: QPainter, state: IconState, s: float, pal: _Palette) -> None:
    """Alert: a rounded square (another silhouette than the circle), red rim, number or '!'."""
    rim = max(s / 16, 1.0)
    stroke = max(s * 0.13, 2.0)
    outer = QRectF(rim / 2, rim / 2, s - rim, s - rim)
    radius = s * 0.18
    red = HEALTH_COLOURS["alert"]
    if not pal.template:
        p.setPen(QPen(RIM_COLOUR, rim))
        p.setBrush(QColor(90, 16, 16, 245))
        p.drawRoundedRect(outer, radius, radius)
    inner = outer.adjusted(
        stroke / 2 + rim / 2, stroke / 2 + rim / 2, -stroke / 2 - rim / 2, -stroke / 2 - rim / 2
    )
    p.setPen(QPen(pal.colour(red), stroke))
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawRoundedRect(inner, radius * 0.7, radius * 0.7)
    text = state.text or "!"
    text_rect = QRectF(stroke * 0.55, s * 0.2, s - stroke * 1.1, s * 0.6)
    _draw_text(p, text, text_rect, pal, QColor(90, 16, 16))


def _draw_none(p: QPainter, s: float, pal: _Palette) -> None:
    """No server: a hollow circle with a slash, dark line on a light halo (works on any panel)."""
    rect = QRectF(s * 0.14, s * 0.14, s * 0.72, s * 0.72)
    width = max(s * 0.09, 1.5)
    shapes = QPainterPath()
    shapes.addEllipse(rect)
    slash = QPainterPath()
    slash.moveTo(rect.topRight() + QPointF(-s * 0.1, s * 0.1))
    slash.lineTo(rect.bottomLeft() + QPointF(s * 0.1, -s * 0.1))
    for path in (shapes, slash):
        if not pal.template:
            p.strokePath(path, _round_pen(RIM_COLOUR, width + max(s / 10, 1.5)))
    for path in (shapes, slash):
        p.strokePath(path, _round_pen(pal.colour(QColor(70, 76, 84)), width))


def _draw_offload(p: QPainter, s: float, pal: _Palette) -> None:
    """A corner notch in a second colour: part of the model sits in system RAM."""
    leg = s * 0.46
    tri = QPainterPath()
    tri.moveTo(s, s - leg)
    tri.lineTo(s, s)
    tri.lineTo(s - leg, s)
    tri.closeSubpath()
    _halo(p, tri, QPen(DISC_COLOUR, max(s / 8, 2.0)), pal)
    p.fillPath(tri, pal.colour(OFFLOAD_COLOUR))


def _draw_queued(p: QPainter, s: float, pal: _Palette) -> None:
    """A dot in the top left corner: requests wait for a slot."""
    dot = QPainterPath()
    dot.addEllipse(QRectF(0, 0, s * 0.36, s * 0.36))
    _halo(p, dot, QPen(DISC_COLOUR, max(s / 8, 2.0)), pal)
    p.fillPath(dot, pal.colour(QUEUED_COLOUR))


def _draw_idle_mark(p: QPainter, s: float, pal: _Palette, paused: bool) -> None:
    colour = pal.colour(QColor(200, 205, 212))
    if paused:
        w, h = s * 0.12, s * 0.38
        for x in (s * 0.5 - w * 1.6, s * 0.5 + w * 0.6):
            p.fillRect(QRectF(x, s * 0.5 - h / 2, w, h), colour)
    else:
        p.fillRect(QRectF(s * 0.32, s * 0.5 - s * 0.055, s * 0.36, s * 0.11), colour)


def _paint(p: QPainter, state: IconState, s: float, pal: _Palette) -> None:
    if state.health == "none" and not state.paused:
        _draw_none(p, s, pal)
    elif state.health == "alert":
        _draw_alert(p, state, s, pal)
    else:
        rim = max(s / 16, 1.0)
        disc = QRectF(rim / 2, rim / 2, s - rim, s - rim)
        _draw_disc(p, disc, pal, rim)
        stroke = max(s * 0.14, 2.0)
        ring = disc.adjusted(
            stroke / 2 + rim / 2, stroke / 2 + rim / 2, -stroke / 2 - rim / 2, -stroke / 2 - rim / 2
        )
        _draw_ring(p, state, ring, stroke, pal)
        if state.text:
            text_rect = QRectF(stroke * 0.45, s * 0.2, s - stroke * 0.9, s * 0.6)
            _draw_text(p, state.text, text_rect, pal, DISC_COLOUR)
        elif state.health == "idle" or state.paused:
            _draw_idle_mark(p, s, pal, state.paused)
    if state.offload:
        _draw_offload(p, s, pal)
    if state.queued:
        _draw_queued(p, s, pal)


@lru_cache(maxsize=256)
def render_icon(
    state: IconState, size_px: int, device_pixel_ratio: float = 1.0, template: bool = False
) -> QPixmap:
    """A `size_px` (logical) pixmap of the icon; physical size is size_px × device_pixel_ratio.

    Cached: an unchanged state costs no drawing. Do not modify the returned pixmap.
    """
    physical = max(round(size_px * device_pixel_ratio), 1)
    pixmap = QPixmap(physical, physical)
    pixmap.setDevicePixelRatio(device_pixel_ratio)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    try:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        _paint(painter, state, float(size_px), _Palette(template))
    finally:
        painter.end()
    return pixmap


@lru_cache(maxsize=64)
def make_icon(state: IconState, template: bool = False, device_pixel_ratio: float = 1.0) -> QIcon:
    """A QIcon with pixmaps for the usual tray sizes (template: set as a mask on macOS)."""
    icon = QIcon()
    for size in ICON_SIZES:
        icon.addPixmap(render_icon(state, size, device_pixel_ratio, template))
    if template:
        icon.setIsMask(True)
    return icon


def app_icon() -> QIcon:
    """The application's window icon: a healthy ring at 70 %, no number."""
    return make_icon(IconState("ok", ring=0.7))
