"""Regenerate the application icons in resources/icons/ from the QPainter drawing the tray uses.

QT_QPA_PLATFORM=offscreen python resources/make_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.core.glance import IconState
from trayapp.ui.icons import render_icon

SIZES = (16, 22, 32, 48, 64, 128, 256)


def main() -> None:
    app = QApplication.instance() or QApplication(sys.argv)  # noqa: F841 (QPixmap needs an application)
    out = Path(__file__).resolve().parent / "icons"
    out.mkdir(exist_ok=True)
    state = IconState("ok", ring=0.7)
    for size in SIZES:
        render_icon(state, size).save(str(out / f"llm-tray-{size}.png"))
    render_icon(state, 32, template=True).save(str(out / "llm-tray-template.png"))  # macOS menu bar
    render_icon(state, 32, device_pixel_ratio=2.0, template=True).save(str(out / "llm-tray-template@2x.png"))
    print(f"wrote {len(SIZES) + 2} icons to {out}")


if __name__ == "__main__":
    main()
