"""Episode rules: confirmation window, one alert per episode, hysteresis, peak, severity."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from trayapp.core.episodes import EpisodeTracker, alerts_now
from trayapp.core.model import Alert, Finding

WALL0 = 1_750_000_000.0
SERVER = "http://127.0.0.1:11434"


def finding(
    kind: str = "below_floor",
    *,
    model: str | None = "llama3.1:8b",
    severity: str = "warning",
    score: float = 1.0,
    message: str = "slow",
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,  # type: ignore[arg-type]
        server=SERVER,
        model=model,
        message=message,
        fix="do something",
        evidence={"score": score},
        score=score,
    )


class Clock:
    def __init__(self, tracker: EpisodeTracker) -> None:
        self.tracker = tracker
        self.t = 0.0

    def step(
        self, findings: Sequence[Finding], dt: float = 1.0
    ) -> tuple[tuple[Alert, ...], tuple[Alert, ...]]:
        """Advance by `dt` and feed this tick's findings (mono 0 = wall WALL0)."""
        self.t += dt
        return self.tracker.update(findings, self.t, WALL0 + self.t)


def test_rate_kinds_need_the_confirmation_window() -> None:
    clock = Clock(EpisodeTracker(confirm_s=5.0, clear_s=20.0))
    seen = [clock.step([finding()])[0] for _ in range(5)]  # t = 1..5: held 0..4 s
    assert all(active == () for active in seen)
    (alert,) = clock.step([finding()])[0]  # t = 6: held 5 s
    assert alert.kind == "below_floor" and alert.model == "llama3.1:8b"
    assert alert.since_wall_s == WALL0 + 1.0  # since it was first seen, not since confirmed


@pytest.mark.parametrize(
    "kind", ["offload", "context_full", "vram_pressure", "draft_acceptance", "regression"]
)
def test_state_kinds_are_alerts_at_once(kind: str) -> None:
    clock = Clock(EpisodeTracker(confirm_s=5.0, clear_s=20.0))
    active, ended = clock.step([finding(kind)])
    assert [a.kind for a in active] == [kind] and ended == ()


def test_a_finding_that_vanishes_before_confirmation_leaves_no_trace() -> None:
    clock = Clock(EpisodeTracker(confirm_s=5.0, clear_s=20.0))
    for _ in range(3):
        assert clock.step([finding()]) == ((), ())
    assert clock.step([]) == ((), ())
    # Back again: the window starts over.
    for _ in range(5):
        assert clock.step([finding()])[0] == ()
    (alert,) = clock.step([finding()])[0]
    assert alert.since_wall_s == WALL0 + 5.0


def test_one_alert_per_episode_with_a_stable_id_refreshed_numbers_and_the_peak() -> None:
    clock = Clock(EpisodeTracker(confirm_s=0.0, clear_s=20.0))
    alerts = []
    for score in (0.3, 0.5, 0.4, 0.45):
        (alert,) = clock.step([finding("offload", score=score, message=f"{score * 100:.0f} % on the CPU")])[0]
        alerts.append(alert)
    assert len({a.id for a in alerts}) == 1
    assert len({a.since_wall_s for a in alerts}) == 1
    last = alerts[-1]
    assert last.message == "45 % on the CPU" and last.evidence == {"score": 0.45}  # the latest numbers
    assert last.peak == 0.5  # the worst it got


def test_hysteresis_a_short_gap_keeps_the_episode_and_the_clear_window_ends_it() -> None:
    clock = Clock(EpisodeTracker(confirm_s=5.0, clear_s=20.0))
    for _ in range(6):
        active, _ = clock.step([finding()])
    (alert,) = active
    # A one-tick gap (a flickering rate): still the same alert, nothing ended.
    active, ended = clock.step([])
    assert [a.id for a in active] == [alert.id] and ended == ()
    active, ended = clock.step([finding()])
    assert [a.id for a in active] == [alert.id] and ended == ()
    last_seen_t = clock.t

    # Absent for less than clear_s: still listed.
    for _ in range(19):
        active, ended = clock.step([])
        assert [a.id for a in active] == [alert.id] and ended == ()
    # clear_s of absence: it ends, once, dated when it was last seen.
    active, ended = clock.step([])
    assert active == ()
    assert [a.id for a in ended] == [alert.id]
    assert ended[0].ended_wall_s == WALL0 + last_seen_t
    assert clock.step([]) == ((), ())

    # The same condition later is a new episode with a new id, after a new confirmation.
    for _ in range(5):
        assert clock.step([finding()])[0] == ()
    (again,) = clock.step([finding()])[0]
    assert again.id != alert.id and again.since_wall_s > alert.since_wall_s


def test_severity_escalates_and_never_drops_back_within_an_episode() -> None:
    clock = Clock(EpisodeTracker(confirm_s=0.0, clear_s=20.0))
    (first,) = clock.step([finding("offload", severity="warning")])[0]
    (worse,) = clock.step([finding("offload", severity="critical")])[0]
    (later,) = clock.step([finding("offload", severity="warning")])[0]
    assert (first.severity, worse.severity, later.severity) == ("warning", "critical", "critical")
    assert first.id == worse.id == later.id


def test_episodes_are_per_kind_server_and_model() -> None:
    clock = Clock(EpisodeTracker(confirm_s=0.0, clear_s=20.0))
    active, _ = clock.step(
        [
            finding("offload", model="a"),
            finding("offload", model="b"),
            finding("context_full", model="a"),
            finding("vram_pressure", model=None),
        ]
    )
    assert len(active) == 4 and len({a.id for a in active}) == 4
    active, _ = clock.step([finding("offload", model="a")])
    assert len(active) == 4  # the others are within their clear window


def test_alerts_now_reports_every_finding_of_a_snapshot() -> None:
    findings = [finding("below_floor", score=-2.0), finding("offload", score=0.52)]
    alerts = alerts_now(findings, WALL0)
    assert [a.kind for a in alerts] == ["below_floor", "offload"]  # no window for a one-shot view
    assert all(a.since_wall_s == WALL0 and a.ended_wall_s is None for a in alerts)
    assert [a.peak for a in alerts] == [-2.0, 0.52]
    assert len({a.id for a in alerts}) == 2
    assert all(a.id.startswith(f"{a.kind}-") for a in alerts)
    assert alerts_now([], WALL0) == ()
