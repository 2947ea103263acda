"""Findings over time → alert episodes.

A finding becomes an alert after it has held for a confirmation window (state
facts such as an offload need none), stays *one* alert while it lasts — same
id, message and numbers refreshed, peak kept — and ends only after it has been
absent for a clear window (hysteresis), so a flickering rate never makes a
storm of notifications.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

from trayapp.core.alert_kinds import is_instant
from trayapp.core.model import SEVERITIES, Alert, Finding, Severity


@dataclass
class _Episode:
    first_seen_wall_s: float
    first_seen_mono_s: float
    last_seen_mono_s: float
    last_seen_wall_s: float
    finding: Finding
    alert: Alert | None = None
    peak: float = 0.0


Key = tuple[str, str, str | None]


class EpisodeTracker:
    def __init__(self, confirm_s: float = 5.0, clear_s: float = 20.0) -> None:
        self.confirm_s = confirm_s
        self.clear_s = clear_s
        self._episodes: dict[Key, _Episode] = {}

    def update(
        self,
        findings: Iterable[Finding],
        now_mono_s: float,
        now_wall_s: float,
        resolved: Collection[Key] = (),
    ) -> tuple[tuple[Alert, ...], tuple[Alert, ...]]:
        """Feed this tick's findings; returns (active alerts, alerts that ended now). An episode in
        `resolved` (its cause is certainly gone, e.g. a fresh conversation after a KV slowdown) and
        not found now ends at once, without the clear window."""
        seen: set[Key] = set()
        for finding in findings:
            key: Key = (finding.kind, finding.server, finding.model)
            seen.add(key)
            episode = self._episodes.get(key)
            if episode is None:
                episode = _Episode(
                    now_wall_s, now_mono_s, now_mono_s, now_wall_s, finding, peak=finding.score
                )
                self._episodes[key] = episode
            episode.last_seen_mono_s = now_mono_s
            episode.last_seen_wall_s = now_wall_s
            episode.finding = finding
            episode.peak = max(episode.peak, finding.score)
            confirm = 0.0 if is_instant(finding.kind) else self.confirm_s
            if episode.alert is None and now_mono_s - episode.first_seen_mono_s >= confirm:
                episode.alert = _new_alert(finding, episode.first_seen_wall_s, episode.peak)
            elif episode.alert is not None:
                episode.alert = replace(
                    episode.alert,
                    severity=_worse(episode.alert.severity, finding.severity),
                    message=finding.message,
                    fix=finding.fix,
                    fix_commands=finding.fix_commands,
                    evidence=finding.evidence,
                    cause=finding.cause,
                    peak=episode.peak,
                )

        ended: list[Alert] = []
        for key, episode in list(self._episodes.items()):
            if key in seen:
                continue
            if episode.alert is None:
                del self._episodes[key]  # never confirmed: leaves no trace
            elif key in resolved or now_mono_s - episode.last_seen_mono_s >= self.clear_s:
                # It ended when it was last seen, not when the clear window ran out.
                ended.append(replace(episode.alert, ended_wall_s=episode.last_seen_wall_s))
                del self._episodes[key]
        active = tuple(e.alert for e in self._episodes.values() if e.alert is not None)
        return active, tuple(ended)


def _new_alert(finding: Finding, since_wall_s: float, peak: float) -> Alert:
    digest = hashlib.sha1(
        f"{finding.kind}|{finding.server}|{finding.model}|{since_wall_s:.3f}".encode()
    ).hexdigest()[:12]
    return Alert(
        id=f"{finding.kind}-{digest}",
        kind=finding.kind,
        severity=finding.severity,
        server=finding.server,
        model=finding.model,
        message=finding.message,
        fix=finding.fix,
        fix_commands=finding.fix_commands,
        since_wall_s=since_wall_s,
        evidence=finding.evidence,
        cause=finding.cause,
        peak=peak,
    )


_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}  # info 0, warning 1, critical 2


def _worse(a: Severity, b: Severity) -> Severity:
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


def alerts_now(findings: Iterable[Finding], now_wall_s: float) -> tuple[Alert, ...]:
    """One-shot view (`status`): every finding that holds in this snapshot is an alert."""
    return tuple(_new_alert(f, now_wall_s, f.score) for f in findings)
