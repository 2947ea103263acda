"""A tolerant reader of the Prometheus text exposition format.

Servers print numbers in several ways (llama.cpp uses C++ `%g`, so
`1.28461e+06`; prometheus_client prints `+Inf`, `NaN`). Bad lines are
skipped, never fatal: one odd metric must not hide the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    value: float = math.nan


def parse(text: str) -> list[Sample]:
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        labels_text = match.group("labels") or ""
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(labels_text)}
        samples.append(Sample(match.group("name"), labels, value))
    return samples


def first(samples: Iterable[Sample], *names: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of the first sample named like one of `names` (and matching `labels`)."""
    wanted = set(names)
    for sample in samples:
        if sample.name in wanted and (
            not labels or all(sample.labels.get(k) == v for k, v in labels.items())
        ):
            if math.isnan(sample.value):
                return None
            return sample.value
    return None


def total(samples: Iterable[Sample], *names: str) -> float | None:
    """Sum of every sample named like one of `names` (across label sets); None when absent."""
    wanted = set(names)
    found = [s.value for s in samples if s.name in wanted and not math.isnan(s.value)]
    return sum(found) if found else None
