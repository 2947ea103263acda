"""Energy over many requests: a session's or a day's watt-hours and J per token, from stored rows.

A request counts only where its energy was measured; the rest are counted apart, with their reasons,
so a total never passes for the whole when part of it could not be read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from trayapp.core.energy_types import EnergyStatus
from trayapp.core.units import as_float

J_PER_WH = 3600.0


@dataclass(frozen=True)
class EnergyTotals:
    """The measured energy of some requests (above the idle draw) and how many were not measured."""

    requests: int
    measured: int  # requests with prefill or decode energy
    prefill_j: float
    decode_j: float
    decode_tokens: int  # tokens decoded by requests whose decode energy was measured
    estimated: bool  # some of it is power × time
    reasons: tuple[str, ...]  # why the others were not measured (distinct, in order)

    @property
    def wh(self) -> float | None:
        """Watt-hours of the measured requests; None when none was measured."""
        return (self.prefill_j + self.decode_j) / J_PER_WH if self.measured else None

    @property
    def j_per_token(self) -> float | None:
        """Decode joules per decoded token over the measured requests."""
        return self.decode_j / self.decode_tokens if self.decode_tokens else None


def energy_totals(rows: Iterable[Mapping[str, object]]) -> EnergyTotals:
    """Totals over `requests` rows (or `RequestRecord` fields as a mapping)."""
    requests = measured = tokens = 0
    prefill = decode = 0.0
    estimated = False
    reasons: dict[str, None] = {}
    for row in rows:
        requests += 1
        p, d = as_float(row.get("energy_prefill_j")), as_float(row.get("energy_decode_j"))
        if p is None and d is None:
            if row.get("energy_reason"):
                reasons[str(row["energy_reason"])] = None
            continue
        measured += 1
        prefill += p or 0.0
        if d is not None:
            decode += d
            tokens += int(as_float(row.get("decode_tokens")) or 0)
        estimated |= bool(row.get("energy_estimated"))
    return EnergyTotals(requests, measured, prefill, decode, tokens, estimated, tuple(reasons))


def energy_by_day(rows: Iterable[Mapping[str, object]]) -> list[tuple[str, EnergyTotals]]:
    """Totals per UTC day (YYYY-MM-DD), oldest first, from rows with `finished_wall_s`."""
    days: dict[str, list[Mapping[str, object]]] = {}
    for row in rows:
        t = as_float(row.get("finished_wall_s"))
        if t is None:
            continue
        day = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d")
        days.setdefault(day, []).append(row)
    return [(day, energy_totals(day_rows)) for day, day_rows in sorted(days.items())]


def energy_text(totals: EnergyTotals) -> str:
    """One line: "0.42 Wh · 1.3 J/token (12 of 14 requests measured)", or why nothing was measured."""
    if totals.wh is None:
        why = totals.reasons[0] if totals.reasons else "no request recorded"
        return f"not measured: {why}"
    parts = [f"{'~' if totals.estimated else ''}{totals.wh:.3g} Wh"]
    if totals.j_per_token is not None:
        parts.append(f"{totals.j_per_token:.3g} J/token")
    text = " · ".join(parts)
    if totals.measured < totals.requests:
        text += f" ({totals.measured} of {totals.requests} requests measured)"
    return text


def energy_json(energy: EnergyStatus | None) -> dict[str, Any] | None:
    """The machine's energy for `status --json` (docs/json.md): power now, idle draw, per-domain totals."""
    if energy is None:
        return None
    return {
        "power_w": None if energy.power_w is None else round(energy.power_w, 2),
        "idle_w": None if energy.idle_w is None else round(energy.idle_w, 2),
        "estimated": energy.estimated,
        "reason": energy.reason,
        "domains": [
            {"domain": d.domain, "source": d.source, "total_j": round(d.total_j, 3), "estimated": d.estimated}
            for d in energy.domains
        ],
    }


def energy_line(energy: EnergyStatus | None) -> str:
    """The dashboard's energy line: "Power 212 W · idle 48 W", or why energy is not measured."""
    if energy is None:
        return ""
    if energy.power_w is None:
        return f"Energy not measured: {energy.reason}" if energy.reason else ""
    text = f"Power {'~' if energy.estimated else ''}{energy.power_w:.0f} W"
    text += f" · idle {energy.idle_w:.0f} W" if energy.idle_w is not None else " · idle draw not measured yet"
    return text
