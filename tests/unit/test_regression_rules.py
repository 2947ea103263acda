"""The `regression` detector's evidence rules (issue #24): like with like, and no alert from one
noisy tick. Expected values are hand arithmetic on the default 20 % mark and the 10-point estimate
margin (`ESTIMATE_MARGIN_PCT`)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.support import snapshots
from trayapp.core.diagnose import ESTIMATE_MARGIN_PCT, ModelView, TrendPoint, diagnose_model
from trayapp.core.machine import resolve_machine
from trayapp.core.model import Baseline
from trayapp.core.thresholds import Thresholds

EXACT_BASE = Baseline(
    decode_tok_s=100.0, context_tokens=500, server_version="b1", session_id="s0", exact=True
)
POLLED_BASE = Baseline(decode_tok_s=100.0, context_tokens=500, server_version="b1", session_id="s0")


def _regression(baseline: Baseline, rates: Sequence[float], exact: bool) -> dict[str, object] | None:
    model = snapshots.model(phase="decoding", rate=rates[-1])
    trend = [TrendPoint(500, rate, exact) for rate in rates]
    view = ModelView(
        server=snapshots.server(model),
        model=model,
        machine=resolve_machine(None),
        trend=trend,
        baseline=baseline,
    )
    found = [f for f in diagnose_model(view, Thresholds()) if f.kind == "regression"]
    return found[0].evidence if found else None


def test_the_margin_is_ten_points() -> None:
    assert ESTIMATE_MARGIN_PCT == 10.0  # the figure the README quotes for the regression alert


def test_exact_against_exact_needs_the_mark_only() -> None:
    evidence = _regression(EXACT_BASE, [75.0, 76.0, 74.0], exact=True)  # 24-26 % below 100
    assert evidence is not None
    assert evidence["exact"] is True and evidence["needed_pct"] == 20.0
    assert evidence["decode_tok_s"] == 75.0 and evidence["drop_pct"] == 25.0  # median of 74, 75, 76


@pytest.mark.parametrize("baseline", [EXACT_BASE, POLLED_BASE], ids=["exact-base", "polled-base"])
def test_anything_estimated_needs_ten_points_more(baseline: Baseline) -> None:
    assert _regression(baseline, [75.0, 76.0, 74.0], exact=False) is None  # 25 % < 30 %
    evidence = _regression(baseline, [65.0, 66.0, 64.0], exact=False)  # 34-36 % ≥ 30 %
    assert evidence is not None and evidence["exact"] is False and evidence["needed_pct"] == 30.0


def test_a_polled_baseline_makes_exact_rates_estimated_too() -> None:
    assert _regression(POLLED_BASE, [75.0, 76.0, 74.0], exact=True) is None


def test_one_noisy_tick_raises_nothing() -> None:
    """A momentary dip to 2 tok/s (98 % below) among normal rates: the fastest of the newest three is
    normal. Two dips still leave the fastest at 99."""
    assert _regression(EXACT_BASE, [99.0, 101.0, 100.0, 99.0, 2.0], exact=True) is None
    assert _regression(EXACT_BASE, [99.0, 101.0, 99.0, 2.0, 3.0], exact=True) is None
    evidence = _regression(EXACT_BASE, [99.0, 101.0, 3.0, 2.0, 3.0], exact=True)  # it stayed slow
    assert evidence is not None and evidence["decode_tok_s"] == 3.0


def test_a_real_five_percent_drop_is_no_regression() -> None:
    assert _regression(EXACT_BASE, [95.0, 94.0, 96.0, 95.0], exact=True) is None
    assert _regression(POLLED_BASE, [95.0, 94.0, 96.0, 95.0], exact=False) is None


def test_fewer_than_three_rates_are_no_evidence() -> None:
    assert _regression(EXACT_BASE, [10.0, 10.0], exact=True) is None


def test_the_message_shows_the_evidences_own_figures_at_a_rounding_edge() -> None:
    """A median of 15.4999 tok/s read "15" in the message and 15.5 ("16") in the evidence (seen in
    cc64); the figure is rounded once and both show it."""
    model = snapshots.model(phase="decoding", rate=15.4999)
    view = ModelView(
        server=snapshots.server(model),
        model=model,
        machine=resolve_machine(None),
        trend=[TrendPoint(500, rate, True) for rate in (15.4, 15.4999, 15.6)],
        baseline=EXACT_BASE,
    )
    (finding,) = [f for f in diagnose_model(view, Thresholds()) if f.kind == "regression"]
    assert finding.evidence["decode_tok_s"] == 15.5
    assert "100 → 16 tok/s, 84 % below" in finding.message  # 1 − 15.5 / 100
