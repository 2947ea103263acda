"""The RAM bandwidth cache file: one best-of figure per machine, keyed by a hardware fingerprint,
re-read and replaced under a lock by every process (`RamBandwidthKeeper` in `ram_bandwidth.py` keeps it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from trayapp.config.files import PRIVATE_PERMISSIONS, atomic_write_text
from trayapp.core.hardware_readings import RamBandwidthChange

__all__ = [
    "RamBandwidth",
    "load_cached",
    "write_cached",
]

log = logging.getLogger(__name__)

Confidence = Literal["quiet", "provisional", "suspect"]
LOCK_TIMEOUT_S = 2.0  # the cache lock is held for milliseconds: longer means a stuck holder
RAM_TOTAL_TOLERANCE = 0.03  # RAM totals this close are the same RAM (the kernel's reserve varies)
REASON_FIRST_QUIET = "first quiet measurement"
REASON_HARDWARE = "hardware changed"
REASON_CONTRADICTED = "decode faster than the ceiling allowed"
REASON_HIGHER = "a higher measurement"
Fingerprint = dict[str, object]


@dataclass(frozen=True)
class RamBandwidth:
    """The RAM bandwidth figure as cached: what, when, and how far to trust it."""

    gbps: float
    measured_at_wall_s: float
    confidence: Confidence
    busy_cpu_pct: float | None = None
    runs: int | None = None
    attempted_at_wall_s: float | None = None  # the last try (a busy machine postpones it)
    change: RamBandwidthChange | None = None  # the figure's last change: from what, when, why


def hardware_fingerprint() -> Fingerprint:
    """What a stored measurement belongs to: a new CPU or more RAM invalidates it."""
    return {
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": int(psutil.virtual_memory().total),
    }


def same_hardware(stored: object, present: Fingerprint) -> bool:
    """Whether a stored fingerprint is this hardware: same CPU architecture and core count, and RAM
    totals within RAM_TOTAL_TOLERANCE (a kernel update reserves a few MB more or less)."""
    if not isinstance(stored, dict):
        return False
    if stored.get("machine") != present.get("machine") or stored.get("cpu_count") != present.get("cpu_count"):
        return False
    ram_a, ram_b = stored.get("ram_total_bytes"), present.get("ram_total_bytes")
    if not isinstance(ram_a, int) or not isinstance(ram_b, int) or isinstance(ram_a, bool):
        return bool(ram_a == ram_b)
    return abs(ram_a - ram_b) <= RAM_TOTAL_TOLERANCE * max(ram_a, ram_b)


def _finite(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) else None


def _change_from(data: object) -> RamBandwidthChange | None:
    """A stored change, or None when absent or malformed (a change only explains: never fatal)."""
    if not isinstance(data, dict):
        return None
    try:
        previous, gbps, at = (_finite(data.get(k)) for k in ("previous_gbps", "gbps", "changed_at_wall_s"))
    except (ValueError, TypeError):
        return None
    reason = data.get("reason")
    if previous is None or gbps is None or at is None or not isinstance(reason, str):
        return None
    return RamBandwidthChange(previous, gbps, at, reason)


def read_cache(cache_path: Path) -> tuple[RamBandwidth, object] | None:
    """(the stored figure, the fingerprint stored with it), or None when missing or corrupt (logged).

    A file from before confidence was recorded loads as "provisional", so it is measured again.
    """
    try:
        text = cache_path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        cached = json.loads(text)
        gbps = _finite(cached["gbps"])
        measured_s = _finite(cached.get("measured_at_wall_s", cached.get("measured_wall_s")))
        if gbps is None or gbps <= 0 or measured_s is None:
            raise ValueError(f"gbps {cached['gbps']!r}, measured at {measured_s!r}")
        confidence = cached.get("confidence", "provisional")
        if confidence not in ("quiet", "provisional", "suspect"):
            raise ValueError(f"confidence {confidence!r}")
        record = RamBandwidth(
            gbps=gbps,
            measured_at_wall_s=measured_s,
            confidence=confidence,
            busy_cpu_pct=_finite(cached.get("busy_cpu_pct")),
            runs=int(cached["runs"]) if isinstance(cached.get("runs"), int) else None,
            attempted_at_wall_s=_finite(cached.get("attempted_at_wall_s")),
            change=_change_from(cached.get("change")),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("RAM bandwidth cache %s is unreadable (%s): measuring again", cache_path, exc)
        return None
    return record, cached.get("fingerprint")


def load_cached(cache_path: Path, fingerprint: Fingerprint | None = None) -> RamBandwidth | None:
    """The stored figure, or None when missing, corrupt (logged) or from other hardware.

    It never expires: a quiet figure is measured again only on evidence (see RamBandwidthKeeper).
    """
    entry = read_cache(cache_path)
    present = fingerprint if fingerprint is not None else hardware_fingerprint()
    if entry is None or not same_hardware(entry[1], present):
        return None
    return entry[0]


def _latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _merge(stored: RamBandwidth | None, same: bool, new: RamBandwidth) -> RamBandwidth:
    """What to store when `new` meets the `stored` figure (`same`: of this hardware): best-of.

    A busy machine only ever measures lower, so the higher figure stays, unless the hardware changed;
    a quiet measurement makes the kept figure trusted. A raised figure records why it changed.
    """
    if stored is None:
        return new
    if not same or new.gbps > stored.gbps:
        if new.change is not None and new.change.gbps == new.gbps:
            return new  # it already says how it came to be (a figure adopted or restored)
        if not same:
            reason = REASON_HARDWARE
        elif stored.confidence == "suspect":
            reason = REASON_CONTRADICTED
        elif stored.confidence == "provisional" and new.confidence == "quiet":
            reason = REASON_FIRST_QUIET
        else:
            reason = REASON_HIGHER
        if new.gbps == stored.gbps:
            return dataclasses.replace(new, change=None)
        change = RamBandwidthChange(stored.gbps, new.gbps, new.measured_at_wall_s, reason)
        return dataclasses.replace(new, change=change)
    attempted = _latest(stored.attempted_at_wall_s, new.attempted_at_wall_s)
    if new.gbps == stored.gbps:  # the same figure re-marked (suspect) or re-tried (postponed)
        return dataclasses.replace(new, change=new.change or stored.change, attempted_at_wall_s=attempted)
    confidence: Confidence = "quiet" if new.confidence == "quiet" else stored.confidence
    return dataclasses.replace(stored, confidence=confidence, attempted_at_wall_s=attempted)


@contextlib.contextmanager
def _cache_lock(cache_path: Path) -> Iterator[None]:
    """An exclusive, blocking lock on `<cache>.lock` beside the cache (flock; msvcrt on Windows; the
    OS drops it when its holder dies), so re-reading and replacing the figure is one step for every
    process and thread. Held for a read and a write of a small file; waits at most LOCK_TIMEOUT_S
    (then raises OSError)."""
    fd = os.open(cache_path.with_name(f"{cache_path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if sys.platform == "win32":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries for 10 s, then raises OSError
            try:
                yield
            finally:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            deadline_s = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline_s:  # a holder that hangs must not hang the tick
                        raise TimeoutError(f"{cache_path} stayed locked for {LOCK_TIMEOUT_S:g} s") from None
                    time.sleep(0.005)
            yield  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def _write_atomic(cache_path: Path, record: RamBandwidth, fingerprint: Fingerprint) -> None:
    data: dict[str, object] = dataclasses.asdict(record)
    data["source"] = "measured"
    data["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.measured_at_wall_s))
    data["fingerprint"] = fingerprint
    atomic_write_text(cache_path, json.dumps(data, indent=1), permissions=PRIVATE_PERMISSIONS)


def write_cached(
    cache_path: Path, record: RamBandwidth, fingerprint: Fingerprint | None = None
) -> RamBandwidth:
    """Merge `record` into the cache (best-of, see `_merge`) and return what the cache now holds.

    Re-read and replaced under a lock, written atomically (temp file + `os.replace`), so of several
    processes writing at once none loses the higher figure. An unwritable cache only costs a
    measurement next time (logged; `record` is returned).
    """
    present = fingerprint if fingerprint is not None else hardware_fingerprint()
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        with _cache_lock(cache_path):
            entry = read_cache(cache_path)
            stored, same = (entry[0], same_hardware(entry[1], present)) if entry else (None, False)
            merged = _merge(stored, same, record)
            if merged != stored or not same:
                _write_atomic(cache_path, merged, present)
            return merged
    except OSError as exc:
        log.warning("cannot write the RAM bandwidth cache %s: %s", cache_path, exc)
        return record
