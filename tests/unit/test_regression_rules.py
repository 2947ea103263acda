"""The `regression` detector's evidence rules (issues #24, #26's busy host): like with like, whole
requests where the server shows them, and no alert from one noisy tick or one short request.
Expected values are hand arithmetic on the default 20 % mark and the 10-point estimate margin
(`ESTIMATE_MARGIN_PCT`)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.support import snapshots
from trayapp.core.diagnose import (
    ESTIMATE_MARGIN_PCT,
    REGRESSION_EVIDENCE_S,
    ModelView,
    TrendPoint,
    diagnose_model,
)
from trayapp.core.machine import resolve_machine
from trayapp.core.model import Baseline
from trayapp.core.thresholds import Thresholds

EXACT_BASE = Baseline(
    decode_tok_s=100.0, context_tokens=500, server_version="b1", session_id="s0", exact=True
)
POLLED_BASE = Baseline(decode_tok_s=100.0, context_tokens=500, server_version="b1", session_id="s0")


def ticks(rates: Sequence[float], exact: bool = False) -> list[TrendPoint]:
    """Polled rates, one a tick."""
    return [TrendPoint(500, rate, exact) for rate in rates]


def requests(rates: Sequence[float], exact: bool, decode_s: float = 8.0) -> list[TrendPoint]:
    """Finished requests' own rates, each over `decode_s` of decoding."""
    return [TrendPoint(500, rate, exact, request=True, decode_s=decode_s) for rate in rates]


def _regression(
    baseline: Baseline, trend: Sequence[TrendPoint], kind: str = "llamacpp"
) -> dict[str, object] | None:
    model = snapshots.model(phase="decoding", rate=trend[-1].decode_tok_s)
    view = ModelView(
        server=snapshots.server(model, kind=kind),
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
    evidence = _regression(EXACT_BASE, requests([75.0, 76.0, 74.0], exact=True))  # 24-26 % below 100
    assert evidence is not None
    assert evidence["exact"] is True and evidence["needed_pct"] == 20.0
    # one request that decoded 8 s is the evidence alone (≥ 3 s): its 74
    assert evidence["decode_tok_s"] == 74.0 and evidence["drop_pct"] == 26.0


@pytest.mark.parametrize("baseline", [EXACT_BASE, POLLED_BASE], ids=["exact-base", "polled-base"])
def test_anything_estimated_needs_ten_points_more(baseline: Baseline) -> None:
    assert _regression(baseline, requests([75.0], exact=False)) is None  # 25 % < 30 %
    evidence = _regression(baseline, requests([65.0], exact=False))  # 35 % ≥ 30 %
    assert evidence is not None and evidence["exact"] is False and evidence["needed_pct"] == 30.0
    assert _regression(baseline, ticks([75.0, 76.0, 74.0]), kind="vllm") is None  # polled ticks alike
    assert _regression(baseline, ticks([65.0, 66.0, 64.0]), kind="vllm") is not None


def test_a_polled_baseline_makes_exact_rates_estimated_too() -> None:
    assert _regression(POLLED_BASE, requests([75.0], exact=True)) is None


def test_a_busy_hosts_ticks_are_not_judged_where_the_request_shows_its_own_rate() -> None:
    """cc63, beside a busy loop: the server's own average for the request was 18.7 % below the
    baseline, three polled ticks during it 33-44 % below. llama-server shows each finished request's
    rate, so its ticks raise nothing; the request, once finished, is judged (18.7 % < 20 %: nothing)."""
    busy_ticks = ticks([67.0, 56.0, 60.0])
    assert _regression(EXACT_BASE, busy_ticks) is None
    assert _regression(EXACT_BASE, [*busy_ticks, *requests([81.3], exact=True)]) is None
    # vLLM shows no request's own rate without the proxy: there, the ticks are the evidence
    assert _regression(EXACT_BASE, busy_ticks, kind="vllm") is not None
    # once a request's own rate has come (vLLM through the proxy), requests are judged there too
    assert _regression(EXACT_BASE, [*requests([81.3], exact=True), *busy_ticks], kind="vllm") is None


def test_one_noisy_tick_raises_nothing() -> None:
    """A momentary dip to 2 tok/s (98 % below) among normal rates: the fastest of the newest three is
    normal. Two dips still leave the fastest at 99."""
    assert _regression(EXACT_BASE, ticks([99.0, 101.0, 100.0, 99.0, 2.0], exact=True), kind="vllm") is None
    assert _regression(EXACT_BASE, ticks([99.0, 101.0, 99.0, 2.0, 3.0], exact=True), kind="vllm") is None
    evidence = _regression(EXACT_BASE, ticks([99.0, 101.0, 3.0, 2.0, 3.0], exact=True), kind="vllm")
    assert evidence is not None and evidence["decode_tok_s"] == 3.0  # it stayed slow


def test_short_requests_are_judged_three_at_a_time() -> None:
    """Requests that decoded 1 s each: the newest three are judged (3 s together, as long as three
    1 s ticks); one slow short request after normal ones raises nothing, three do."""
    short = REGRESSION_EVIDENCE_S / 3
    assert _regression(EXACT_BASE, requests([99.0, 101.0, 40.0], exact=True, decode_s=short)) is None
    assert _regression(EXACT_BASE, requests([99.0, 40.0, 41.0], exact=True, decode_s=short)) is None
    evidence = _regression(EXACT_BASE, requests([99.0, 40.0, 41.0, 42.0], exact=True, decode_s=short))
    assert evidence is not None and evidence["decode_tok_s"] == 41.0  # the median of 40, 41, 42
    # one slow request that decoded 8 s after normal ones is evidence enough on its own
    long_slow = requests([40.0], exact=True)
    assert _regression(EXACT_BASE, [*requests([99.0, 101.0], exact=True), *long_slow]) is not None


def test_a_real_five_percent_drop_is_no_regression() -> None:
    assert _regression(EXACT_BASE, requests([95.0, 94.0, 96.0, 95.0], exact=True)) is None
    assert _regression(POLLED_BASE, ticks([95.0, 94.0, 96.0, 95.0]), kind="vllm") is None


def test_too_little_is_no_evidence() -> None:
    assert _regression(EXACT_BASE, ticks([10.0, 10.0], exact=True), kind="vllm") is None  # two ticks
    assert _regression(EXACT_BASE, requests([10.0, 10.0], exact=True, decode_s=1.0)) is None  # 2 s


def test_the_message_shows_the_evidences_own_figures_at_a_rounding_edge() -> None:
    """A median of 15.4999 tok/s read "15" in the message and 15.5 ("16") in the evidence (seen in
    cc64); the figure is rounded once and both show it."""
    model = snapshots.model(phase="decoding", rate=15.4999)
    view = ModelView(
        server=snapshots.server(model),
        model=model,
        machine=resolve_machine(None),
        trend=requests([15.4, 15.4999, 15.6], exact=True, decode_s=1.0),
        baseline=EXACT_BASE,
    )
    (finding,) = [f for f in diagnose_model(view, Thresholds()) if f.kind == "regression"]
    assert finding.evidence["decode_tok_s"] == 15.5
    assert "100 → 16 tok/s, 84 % below" in finding.message  # 1 − 15.5 / 100
