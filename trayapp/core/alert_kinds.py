"""Every alert kind, decided once: its label, headline, confirmation rule, default mute and the
kinds that explain it away.

Detectors emit these kinds (`Finding.kind` and `Alert.kind` are typed `AlertKindName`, so a
misspelt kind fails mypy); episodes read `instant`; the detectors' root-cause rule reads
`suppressed_by`; the notifier reads `headline`; the settings dialog, the dashboard and the bar read
`label`; the notification settings' default mutes are `DEFAULT_MUTED_KINDS`; JSON and Prometheus
use the kind names. Add a kind here first, then its detector in `diagnose.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AlertKindName = Literal[
    "offload",
    "kv_slowdown",
    "context_full",
    "context_overflow",
    "below_floor",
    "low_efficiency",
    "draft_acceptance",
    "vram_pressure",
    "regression",
    "server_down",
    "cold_load",
]


@dataclass(frozen=True)
class AlertKind:
    name: AlertKindName
    label: str  # what it means, in a few words (settings: per-kind mute)
    headline: str  # notification title; {model} and {cpu_pct} are filled in when known
    instant: bool  # a fact about state: an alert the moment it is seen (no confirmation window)
    muted_by_default: bool = False
    # Kinds whose finding explains this one away (one root cause per model): a finding of this kind
    # is dropped when one of these is found on the same model; for a GPU-wide kind (no model), on
    # any model of this machine.
    suppressed_by: frozenset[AlertKindName] = frozenset()


# The offload message already gives the speed to expect, so "slow", "inefficient" and "slower than
# last week" would only repeat it; a drafter that costs speed (few drafts accepted, or decode
# measured slower than plain) gives the cause and the fix of "slow" and "inefficient".
_SLOW: frozenset[AlertKindName] = frozenset({"offload", "draft_acceptance"})

ALERT_KINDS: dict[AlertKindName, AlertKind] = {
    kind.name: kind
    for kind in (
        AlertKind(
            "offload",
            "part of a model spilled to system RAM",
            "{model} spilled to the CPU ({cpu_pct} %)",
            instant=True,
        ),
        AlertKind(
            "kv_slowdown",
            "decode slows as the context grows",
            "{model} slows as its context grows",
            instant=True,
        ),
        AlertKind(
            "context_full",
            "the context is nearly full",
            "{model}'s context is nearly full",
            instant=True,
            suppressed_by=frozenset({"context_overflow"}),  # it already overflowed: that alert says how far
        ),
        AlertKind(
            "context_overflow",
            "a prompt or an answer did not fit the context",
            "{model}: a request did not fit its context",
            instant=True,
        ),
        AlertKind(
            "below_floor",
            "decode under the usable floor",
            "{model} is below the usable speed",
            instant=False,
            suppressed_by=_SLOW,
        ),
        AlertKind(
            "low_efficiency",
            "fully on GPU yet well under the realistic band",
            "{model} runs far below its ceiling",
            instant=False,
            suppressed_by=_SLOW,
        ),
        AlertKind(
            "draft_acceptance",
            "speculative decoding accepts few drafts",
            "Speculative decoding is not paying off on {model}",
            instant=True,
        ),
        AlertKind(
            "vram_pressure",
            "VRAM nearly full",
            "GPU memory is almost full",
            instant=True,
            suppressed_by=frozenset({"offload"}),  # a local model already spilled: that alert says why
        ),
        AlertKind(
            "regression",
            "slower than this model's baseline",
            "{model} is slower than its baseline",
            instant=True,
            suppressed_by=frozenset({"offload"}),
        ),
        AlertKind(
            "server_down", "a server stopped answering", "An LLM server stopped answering", instant=False
        ),
        AlertKind(
            "cold_load",
            "a request paid for loading the model",
            "{model} waited for a model load",
            instant=True,
        ),
    )
}

DEFAULT_MUTED_KINDS: tuple[AlertKindName, ...] = tuple(
    kind.name for kind in ALERT_KINDS.values() if kind.muted_by_default
)


def alert_kind_name(name: str) -> AlertKindName | None:
    """`name` as a kind this version knows (e.g. read from a remote agent's JSON); None if unknown."""
    for known in ALERT_KINDS:
        if known == name:
            return known
    return None


def alert_label(kind: AlertKindName) -> str:
    return ALERT_KINDS[kind].label


def is_instant(kind: AlertKindName) -> bool:
    return ALERT_KINDS[kind].instant
