"""Screenshots compared with ImageMagick (`convert`, `compare`), for the tray icon tests in tests/e2e/."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _magick(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    return (result.stdout + result.stderr).strip()


def std_dev(image: Path) -> float:
    """Standard deviation of the pixels (0 for a uniform, empty crop: nothing drawn)."""
    return float(_magick("convert", str(image), "-format", "%[fx:standard_deviation]", "info:"))


def differing_pixels(a: Path, b: Path) -> int:
    """Pixels that differ between two same-sized images (ImageMagick `compare -metric AE`)."""
    out = _magick("compare", "-metric", "AE", "-fuzz", "3%", str(a), str(b), "null:")
    return int(float(out.split()[0]))
