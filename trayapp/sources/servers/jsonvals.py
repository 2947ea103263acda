"""Coercers for values read from a server's JSON: the expected type, or None (or an empty default).

A field of the wrong type counts as missing, so a parser never crashes on a
surprising payload. JSON booleans are never numbers here.
"""

from __future__ import annotations

from typing import Any

from trayapp.core.units import as_float  # one home for it; sources read it here too

__all__ = ["as_bool", "as_dict", "as_float", "as_int", "as_str"]


def as_int(value: object) -> int | None:
    """An integer (a whole float such as `8.0` included), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_str(value: object) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def as_bool(value: object, default: bool = False) -> bool:
    """A JSON boolean, else `default`."""
    return value if isinstance(value, bool) else default


def as_dict(value: object) -> dict[str, Any]:
    """A JSON object, else an empty dict."""
    return value if isinstance(value, dict) else {}
