"""The CPU's clock and temperature where the OS lets us read them (a throttled CPU decodes slower).

Frequency through psutil (Linux: /sys/devices/system/cpu/cpu*/cpufreq; a VM often has none or no
maximum); temperature from Linux thermal zones (`/sys/class/thermal/thermal_zone*/temp`, m°C).
"""

from __future__ import annotations

from pathlib import Path

import psutil


def cpu_frequency_mhz() -> tuple[float | None, float | None]:
    """(current, maximum) CPU frequency in MHz; None where not readable (0 means unknown to psutil)."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError):
        return None, None
    if freq is None:
        return None, None
    return (float(freq.current) or None), (float(freq.max) or None)


def thermal_zones(root: Path = Path("/sys")) -> list[Path]:
    """The thermal zones' folders (none where unreadable)."""
    try:
        return sorted((root / "class" / "thermal").glob("thermal_zone*"))
    except OSError:
        return []


def thermal_max_c(root: Path = Path("/sys"), zones: list[Path] | None = None) -> float | None:
    """The hottest thermal zone in °C (of `zones`, found under `root` when not given), or None when
    none can be read."""
    hottest: float | None = None
    for zone in thermal_zones(root) if zones is None else zones:
        try:
            value = int((zone / "temp").read_text(encoding="ascii").strip()) / 1000
        except (OSError, ValueError):
            continue
        hottest = value if hottest is None else max(hottest, value)
    return hottest
