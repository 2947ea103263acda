"""The build that made it slower (issue #22): a regression across two real llama-server sessions
recorded under different builds names both, and `llm-tray sessions --by build` sets them side by side.

The server here is one build (its `/props` says `build_info` "b0-unknown": PyPI's sdist has no git
tag), so the baseline session's stored build is rewritten in the store to an earlier one, as if the
server had been updated between the sessions. Speeds are the server's own timings on this host.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

import pytest

from tests.integration.test_alerts_real import (  # noqa: F401  (start_server: the fixture)
    DECODE_S,
    StartServer,
    _model,
    _session,
    start_server,
)
from tests.support.cli import run_cli
from tests.support.llama import alerts_of
from trayapp.config import paths
from trayapp.core.diagnose import ESTIMATE_MARGIN_PCT
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_rate

pytestmark = pytest.mark.llamacpp

EARLIER_BUILD = "b11400-0123abc"  # what the baseline session is rewritten to have run on
SLOW_SHARE = 0.25  # the second session runs at about this share of the first's own rate


@pytest.mark.timeout(600)  # two sessions; ~10 s each here, minutes on a host 10x slower
def test_a_regression_across_builds_names_both(start_server: StartServer) -> None:  # noqa: F811
    """Session 1 at full speed (the baseline), its build rewritten to EARLIER_BUILD; session 2 on a
    fresh server and Monitor slowed to ~25 % of session 1's own rate: `regression` says "slower
    since llama.cpp EARLIER_BUILD → <the server's build>: A → B tok/s" with A and B its evidence,
    B within the tolerance of the server's own timings. ~30-60 s."""
    base_snaps, base_timings = _session(start_server, DECODE_S)
    (base_session,) = {_model(s).session_id for s in base_snaps if _model(s).session_id}
    build = base_snaps[-1].servers[0].version
    assert build and build != EARLIER_BUILD  # what /props' build_info says
    with sqlite3.connect(paths.store_file()) as conn:
        changed = conn.execute(
            "UPDATE sessions SET server_version = ? WHERE session_id = ?", (EARLIER_BUILD, base_session)
        ).rowcount
    assert changed == 1

    base_tok_s = base_timings["predicted_per_second"]
    # decoding longer than the baseline: three slow rates, then the alert's confirmation time, with room
    slow_s = DECODE_S + 3 * Thresholds().confirm_s
    slow_snaps, slow_timings = _session(start_server, slow_s, slow_to_tok_s=SLOW_SHARE * base_tok_s)
    server_drop_pct = (1 - slow_timings["predicted_per_second"] / base_tok_s) * 100
    assert server_drop_pct >= Thresholds().regression_pct + ESTIMATE_MARGIN_PCT + 10, "not slowed enough"
    assert slow_snaps[-1].servers[0].version == build

    alerts = alerts_of(slow_snaps, "regression")
    assert len(alerts) == 1, (
        alerts,
        [(m.decode_tok_s, m.decode_exact) for s in slow_snaps for m in s.servers[0].models],
    )
    alert = next(iter(alerts.values()))
    evidence: Mapping[str, Any] = alert.evidence
    assert evidence["baseline_session"] == base_session
    assert (evidence["baseline_version"], evidence["version"], evidence["engine"]) == (
        EARLIER_BUILD,
        build,
        "llama.cpp",
    )
    assert evidence["baseline_tok_s"] == pytest.approx(base_tok_s, rel=0.15)
    assert evidence["decode_tok_s"] == pytest.approx(slow_timings["predicted_per_second"], rel=0.5)
    rates = f"{format_rate(evidence['baseline_tok_s'])} → {format_rate(evidence['decode_tok_s'])} tok/s"
    assert f"slower since llama.cpp {EARLIER_BUILD} → {build}: {rates}" in alert.message
    assert EARLIER_BUILD in alert.fix

    listed = run_cli("sessions", "--by", "build", "--json")
    assert listed.returncode == 0, listed.stderr
    groups = {g["build"]: g for g in json.loads(listed.stdout)}
    assert set(groups) == {EARLIER_BUILD, build}
    assert all(g["sessions"] == 1 and g["engine"] == "llama.cpp" for g in groups.values())
    assert groups[build]["mean_decode_tok_s"] < groups[EARLIER_BUILD]["mean_decode_tok_s"]
    table = run_cli("sessions", "--by", "build")
    assert table.returncode == 0 and EARLIER_BUILD in table.stdout and build in table.stdout
