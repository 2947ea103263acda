"""The phases a model is in at one tick, which one speaks for several, and what each one means.

A `Phase` is what the pipeline decides a model is doing (core/rates.py); `ModelStatus.phase` carries
it to every view. The tray's menu and its icon, the monitor's polling pace, the sessions and the
bench read the helpers below rather than spelling phases again (tests/unit/test_vocabularies.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

Phase = Literal["unloaded", "idle", "sleeping", "loading", "prefill", "decoding", "stalled"]

PHASES: tuple[Phase, ...] = get_args(Phase)

# Which phase speaks for several models (the tray icon's model, a server's menu line) or for the
# streams of one model: the first of these that any of them is in. What the user is waiting on comes
# first: text being generated, then a prompt being read, then a request stuck mid-answer (still a
# request in flight, and a problem worth seeing), then a model loading (no request is served yet).
# The tray's menu and its icon both read this order (tests/unit/test_vocabularies.py holds them to it).
PHASE_PRIORITY: tuple[Phase, ...] = ("decoding", "prefill", "stalled", "loading")
BUSY_PHASES: frozenset[Phase] = frozenset({"prefill", "decoding", "stalled"})


def is_busy(phase: str) -> bool:
    """A request is being worked on (reading the prompt, generating, or stuck mid-request).

    Loading a model is not "busy": no request is served yet; `is_active` counts it too.
    """
    return phase in BUSY_PHASES


def is_active(phase: str) -> bool:
    """Busy with a request or loading a model: the tray shows activity, the monitor polls faster."""
    return phase == "loading" or is_busy(phase)


def is_ready(phase: str) -> bool:
    """In memory, awake and not loading: idle or busy (not unloaded, asleep or loading)."""
    return phase == "idle" or is_busy(phase)


def is_loaded(phase: str) -> bool:
    """The server holds the model: ready, or asleep (it wakes on the next request); not unloaded,
    not still loading. A model that can be benchmarked."""
    return is_ready(phase) or phase == "sleeping"


def top_phase(phases: Iterable[str]) -> Phase | None:
    """The first phase of `PHASE_PRIORITY` among `phases`; None when none is active."""
    present = set(phases)
    return next((phase for phase in PHASE_PRIORITY if phase in present), None)
