"""Every alert kind, decided once: its label, headline, default mute and confirmation rule.

Detectors emit these kinds; episodes read `instant`; the notifier reads `headline`; the
settings dialog and the dashboard read `label`; JSON and Prometheus use the kind names.
Add a kind here first, then its detector in `diagnose.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AlertKindName = Literal[
    "offload",
    "kv_slowdown",
    "context_full",
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


ALERT_KINDS: dict[str, AlertKind] = {
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
            "context_full", "the context is nearly full", "{model}'s context is nearly full", instant=True
        ),
        AlertKind(
            "below_floor", "decode under the usable floor", "{model} is below the usable speed", instant=False
        ),
        AlertKind(
            "low_efficiency",
            "fully on GPU yet well under the realistic band",
            "{model} runs far below its ceiling",
            instant=False,
        ),
        AlertKind(
            "draft_acceptance",
            "speculative decoding accepts few drafts",
            "Speculative decoding is not paying off on {model}",
            instant=True,
        ),
        AlertKind("vram_pressure", "VRAM nearly full", "GPU memory is almost full", instant=True),
        AlertKind(
            "regression",
            "slower than this model's baseline",
            "{model} is slower than its baseline",
            instant=True,
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

# Which findings an offload on the same model explains (one root cause per model): the offload
# message already gives the speed to expect, so "slow", "inefficient" and "slower than last week"
# would only repeat it.
SUPPRESSED_BY_OFFLOAD: frozenset[str] = frozenset({"below_floor", "low_efficiency", "regression"})
# And which a drafter that costs speed explains (draft_acceptance: few drafts accepted, or decode
# measured slower than plain): its message gives the cause and the fix.
SUPPRESSED_BY_DRAFTING: frozenset[str] = frozenset({"below_floor", "low_efficiency"})


def alert_label(kind: str) -> str:
    known = ALERT_KINDS.get(kind)
    return known.label if known else kind


def is_instant(kind: str) -> bool:
    known = ALERT_KINDS.get(kind)
    return known.instant if known else False
