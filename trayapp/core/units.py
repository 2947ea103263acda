"""Units and number formatting, decided once for every view (CLI, tray, dashboard, alerts, report)."""

from __future__ import annotations

import math

# The one decimal gigabyte (10^9 B): GPU bandwidth (GB/s) and sizes as vendors and servers state them.
# tests/unit/test_vocabularies.py fails on another spelling of it (1e9, 10**9) anywhere in trayapp/.
GB = 1_000_000_000
MB = 1_000_000
KB = 1_000
MIB = 1024 * 1024
GIB = 1024 * MIB


def as_float(value: object) -> float | None:
    """Any JSON or SQLite number as a float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def format_gb(n_bytes: float | None, digits: int = 1) -> str:
    """'6.4 GB' (`digits` decimals), '—' when unknown (None or not finite)."""
    if n_bytes is None or not math.isfinite(n_bytes):
        return "—"
    return f"{n_bytes / GB:.{digits}f} GB"


def format_gb_of(used_bytes: float, total_bytes: float) -> str:
    """Memory in use of a capacity: '18.0/24 GB' (the capacity is a round marketing figure)."""
    return f"{used_bytes / GB:.1f}/{total_bytes / GB:.0f} GB"


def format_bytes(n_bytes: float | None) -> str:
    """A size in the unit that suits it: '4.9 GB', '131.1 MB', '2.0 kB', '512 B'; '—' when unknown."""
    if n_bytes is None or not math.isfinite(n_bytes):
        return "—"
    for unit, name in ((GB, "GB"), (MB, "MB"), (KB, "kB")):
        if n_bytes >= unit:
            return f"{n_bytes / unit:.1f} {name}"
    return f"{n_bytes:.0f} B"


def format_tokens(count: int | None) -> str:
    """Token counts for humans: 850, '6.1k', '16.9k', '8k' (power-of-two sizes stay round), '128k', '150k';
    '—' unknown."""
    if count is None:
        return "—"
    if count < 1000:
        return str(count)
    if count % 1024 == 0:
        return f"{count // 1024}k"
    if count < 99_950:
        return f"{count / 1000:.1f}".removesuffix(".0") + "k"
    return f"{count / 1000:.0f}k"


def format_tokens_short(count: int) -> str:
    """A token count in at most 4 characters, for the tray icon: '850', '3k', '12k', '128k', '1M'."""
    if count < 1000:
        return str(max(count, 0))
    if count < 999_500:
        return f"{min(count / 1000, 999):.0f}k"
    return f"{min(count / 1_000_000, 99):.0f}M"


def format_rate(tok_s: float | None) -> str:
    """A rate with sensible precision: '9.4', '42', '142'; '—' when unknown."""
    if tok_s is None:
        return "—"
    return f"{tok_s:.0f}" if tok_s >= 9.95 else f"{max(tok_s, 0.0):.1f}"  # 9.96 → "10", not "10.0"


def format_rate_short(tok_s: float) -> str:
    """A rate in at most 3 characters, for the tray icon: '9.4', '42', '142', '2k'."""
    if tok_s < 9.95:
        return f"{max(tok_s, 0.0):.1f}"
    if tok_s < 999.5:
        return f"{tok_s:.0f}"
    return f"{min(tok_s / 1000, 99):.0f}k"


def format_spill_pct(share: float) -> str:
    """A share as a whole percentage that never rounds a real spill to 0 % or 100 % ('<1 %', '>99 %')."""
    pct = share * 100
    if 0 < pct < 1:
        return "<1 %"
    if 99 < pct < 100:
        return ">99 %"
    return f"{pct:.0f} %"


def format_pct(share: float | None) -> str:
    """A 0..1 share as '42 %'; '—' when unknown."""
    return "—" if share is None else f"{share * 100:.0f} %"


ESTIMATE_MARK = "~"  # before a number that is estimated (from polling, or a derived figure)


def estimate_mark(exact: bool | None) -> str:
    """The one rule for marking a rate, TTFT or count: '~' when `exact` is False (estimated), '' when
    True (the server's or the proxy's own figure) or None (not known: no claim either way)."""
    return ESTIMATE_MARK if exact is False else ""


def format_rate_marked(tok_s: float | None, exact: bool | None, *, short: bool = False) -> str:
    """'42 tok/s' (exact), '~42 tok/s' (estimated), '— tok/s' unknown; `short`: the tray's 3-character
    number ('2k' from 1500)."""
    if tok_s is None:
        return "— tok/s"
    number = format_rate_short(tok_s) if short else format_rate(tok_s)
    return f"{estimate_mark(exact)}{number} tok/s"


def format_ttft(ttft_s: float | None, exact: bool | None) -> str:
    """'TTFT 0.21 s'; '~' marks an estimate (prompt tokens ÷ that prompt's own polled speed); '—' unknown."""
    if ttft_s is None:
        return "TTFT —"
    return f"TTFT {estimate_mark(exact)}{ttft_s:.2f} s"
