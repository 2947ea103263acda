"""The drawn icon: states look different (not only by colour), HiDPI, the macOS template variant."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from PySide6.QtGui import QColor, QImage, QPixmap
from pytestqt.qtbot import QtBot

from trayapp.core.glance import IconState
from trayapp.ui import icons
from trayapp.ui.icons import make_icon, render_icon

STATES = {
    "ok": IconState("ok", "42", 0.7),
    "degraded": IconState("degraded", "42", 0.7),
    "alert": IconState("alert", "42", 0.7),
    "idle": IconState("idle"),
    "none": IconState("none"),
    "offload": IconState("ok", "42", 0.7, offload=True),
    "queued": IconState("ok", "42", 0.7, queued=True),
    "paused": IconState("idle", paused=True),
}


def _image(pixmap: QPixmap) -> QImage:
    return pixmap.toImage().convertToFormat(QImage.Format.Format_ARGB32)


def _alpha_mask(image: QImage) -> list[bool]:
    return [image.pixelColor(x, y).alpha() > 96 for y in range(image.height()) for x in range(image.width())]


def _grey(image: QImage) -> list[int]:
    return [image.pixelColor(x, y).lightness() for y in range(image.height()) for x in range(image.width())]


def _differing(a: list[int] | list[bool], b: list[int] | list[bool], tolerance: int = 0) -> int:
    if isinstance(a[0], bool):
        return sum(x != y for x, y in zip(a, b, strict=True))
    return sum(abs(int(x) - int(y)) > tolerance for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("size", [16, 32])
def test_every_state_looks_different(qtbot: QtBot, size: int) -> None:
    images = {name: _image(render_icon(state, size)) for name, state in STATES.items()}
    for (a, ia), (b, ib) in itertools.combinations(images.items(), 2):
        assert ia.size().width() == size
        assert ia != ib, f"{a} and {b} render the same at {size} px"


@pytest.fixture
def one_colour(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every health, offload and queued colour replaced by the same grey: only shapes remain."""
    grey = QColor(128, 128, 128)
    monkeypatch.setattr(icons, "HEALTH_COLOURS", dict.fromkeys(icons.HEALTH_COLOURS, grey))
    monkeypatch.setattr(icons, "OFFLOAD_COLOUR", grey)
    monkeypatch.setattr(icons, "QUEUED_COLOUR", grey)
    icons.render_icon.cache_clear()
    yield
    icons.render_icon.cache_clear()


@pytest.mark.parametrize("size", [16, 32])
def test_health_is_told_by_shape_not_only_colour(qtbot: QtBot, size: int, one_colour: None) -> None:
    images = {name: _image(render_icon(state, size)) for name, state in STATES.items()}
    minimum = max(size // 4, 3)  # a visible number of pixels, not anti-aliasing noise
    for (a, ia), (b, ib) in itertools.combinations(images.items(), 2):
        assert _differing(_grey(ia), _grey(ib), tolerance=40) >= minimum, f"{a} vs {b} at {size} px"
    silhouettes = {name: _alpha_mask(images[name]) for name in ("ok", "alert", "none")}
    assert _differing(silhouettes["ok"], silhouettes["alert"]) >= minimum  # circle vs rounded square
    assert _differing(silhouettes["ok"], silhouettes["none"]) >= minimum  # filled vs hollow


def test_number_and_ring_change_the_picture(qtbot: QtBot) -> None:
    base = _image(render_icon(IconState("ok", "42", 0.7), 32))
    assert base != _image(render_icon(IconState("ok", "43", 0.7), 32))
    assert base != _image(render_icon(IconState("ok", "42", 0.3), 32))


def test_hidpi_pixmap_is_twice_as_large(qtbot: QtBot) -> None:
    pixmap = render_icon(STATES["ok"], 22, device_pixel_ratio=2.0)
    assert (pixmap.width(), pixmap.height()) == (44, 44)
    assert pixmap.devicePixelRatio() == 2.0
    assert pixmap.deviceIndependentSize().width() == 22
    low = _image(render_icon(STATES["ok"], 22))
    high = _image(pixmap).scaled(22, 22)
    assert _differing(_alpha_mask(low), _alpha_mask(high)) < 22 * 22 * 0.1  # the same drawing, finer


def test_template_variant_is_monochrome_alpha(qtbot: QtBot) -> None:
    for state in STATES.values():
        image = _image(render_icon(state, 22, template=True))
        rgba = {image.pixelColor(x, y).getRgb() for y in range(22) for x in range(22)}
        opaque = [c for c in rgba if c[3] > 0]
        assert opaque, "the template must draw something"
        assert all(c[:3] == (0, 0, 0) for c in opaque)
        assert len({c[3] for c in opaque}) > 1  # shading lives in alpha
    assert make_icon(STATES["ok"], template=True).isMask()


def test_icons_are_cached_per_state(qtbot: QtBot) -> None:
    first = render_icon(IconState("ok", "42", 0.7, tooltip_lines=("a",)), 16)
    again = render_icon(IconState("ok", "42", 0.7, tooltip_lines=("b",)), 16)  # tooltip is not drawn
    assert first is again
    assert render_icon(IconState("ok", "43", 0.7), 16) is not first
    icon = make_icon(STATES["alert"])
    assert not icon.isNull() and 16 in [s.width() for s in icon.availableSizes()]
