"""A session's and a day's energy from stored request rows (#21): only measured requests count, the rest
are counted apart with their reason; the dashboard's energy line. Values worked by hand."""

from __future__ import annotations

import pytest

from trayapp.core.energy_summary import energy_by_day, energy_line, energy_text, energy_totals
from trayapp.core.energy_types import EnergyStatus

DAY1 = 1_764_633_600.0  # 2025-12-02 00:00:00 UTC
DAY2 = DAY1 + 86_400.0

ROWS = [
    {"finished_wall_s": DAY1 + 10, "energy_prefill_j": 120.0, "energy_decode_j": 600.0, "decode_tokens": 300,
     "energy_estimated": 0, "energy_reason": None},
    {"finished_wall_s": DAY1 + 50, "energy_prefill_j": None, "energy_decode_j": 1080.0, "decode_tokens": 500,
     "energy_estimated": 0, "energy_reason": "prefill: its duration is unknown"},
    {"finished_wall_s": DAY2 + 5, "energy_prefill_j": None, "energy_decode_j": None, "decode_tokens": 100,
     "energy_estimated": 0, "energy_reason": "no RAPL package counters in /sys/class/powercap"},
]  # fmt: skip


def test_session_totals_count_only_measured_requests() -> None:
    totals = energy_totals(ROWS)
    assert (totals.requests, totals.measured) == (3, 2)
    assert totals.wh == pytest.approx((120.0 + 600.0 + 1080.0) / 3600)  # 1800 J = 0.5 Wh
    assert totals.j_per_token == pytest.approx((600.0 + 1080.0) / (300 + 500))  # 2.1 J/token
    assert energy_text(totals) == "0.5 Wh · 2.1 J/token (2 of 3 requests measured)"


def test_per_day_watt_hours_by_utc_date() -> None:
    days = energy_by_day(ROWS)
    assert [day for day, _ in days] == ["2025-12-02", "2025-12-03"]
    assert days[0][1].wh == pytest.approx(0.5)
    assert days[1][1].wh is None  # nothing measured: no 0 Wh
    assert energy_text(days[1][1]) == "not measured: no RAPL package counters in /sys/class/powercap"


def test_the_dashboard_line_says_power_idle_or_why_not() -> None:
    assert energy_line(EnergyStatus(power_w=212.4, idle_w=48.0)) == "Power 212 W · idle 48 W"
    assert energy_line(EnergyStatus(power_w=95.0, idle_w=None, estimated=True)) == (
        "Power ~95 W · idle draw not measured yet"
    )
    assert energy_line(EnergyStatus(None, None, reason="no RAPL")) == "Energy not measured: no RAPL"
    assert energy_line(None) == ""
