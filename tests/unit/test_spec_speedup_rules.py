"""Speculative decoding's speed-up against the plain-decode baseline (#11): the one rule
(`pipeline.spec_speedup`), what `draft_acceptance` makes of it, and the store's like-for-like baselines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.support import snapshots
from tests.support.store_records import T0, model, session, snapshot
from trayapp.core.diagnose import ModelView, diagnose_model
from trayapp.core.machine import resolve_machine
from trayapp.core.model import Baseline, ModelStatus
from trayapp.core.pipeline import spec_speedup
from trayapp.core.rates import RateEstimate
from trayapp.core.thresholds import Thresholds
from trayapp.sinks.store import Store

LABEL = "RTX 4090 (1008 GB/s) + 54 GB/s RAM"  # the sessions' hardware label (tests/support/store_records)
PLAIN = Baseline(decode_tok_s=40.0, context_tokens=500, server_version="b1", session_id="s0")


def test_the_speedup_is_decode_over_the_plain_baseline() -> None:
    rate = RateEstimate(phase="decoding", decode_tok_s=30.0, active_streams=1)
    assert spec_speedup("draft-mtp", rate, PLAIN) == pytest.approx(0.75)  # 30 / 40
    assert spec_speedup(None, rate, PLAIN) is None  # no speculative decoding: nothing to compare
    assert spec_speedup("draft-mtp", rate, None) is None  # no plain session recorded yet
    drafted = replace(PLAIN, spec_type="ngram-cache")
    assert spec_speedup("draft-mtp", rate, drafted) is None  # only a plain session is a reference
    batched = RateEstimate(phase="decoding", decode_tok_s=30.0, active_streams=3)
    assert spec_speedup("draft-mtp", batched, PLAIN) is None  # batching lowers per-stream rates
    idle = RateEstimate(phase="idle", last_decode_tok_s=100.0)
    assert spec_speedup("draft-mtp", idle, PLAIN) == pytest.approx(2.5)  # the last request: 100 / 40


def _view(model: ModelStatus) -> ModelView:
    return ModelView(server=snapshots.server(model), model=model, machine=resolve_machine(None))


@pytest.mark.parametrize(
    ("acceptance", "speedup", "raised"),
    [(0.8, 1.6, False), (0.8, 0.7, True), (0.2, None, True), (None, 0.9, True), (None, 0.97, False)],
)
def test_draft_acceptance_fires_on_few_accepted_drafts_or_a_measured_slowdown(
    acceptance: float | None, speedup: float | None, raised: bool
) -> None:
    drafted = snapshots.model(draft_acceptance=acceptance, spec_speedup=speedup, spec_type="draft-simple")
    findings = [f for f in diagnose_model(_view(drafted), Thresholds()) if f.kind == "draft_acceptance"]
    assert bool(findings) is raised  # the default marks: 50 % accepted, 0.95× plain decode
    if findings and speedup is not None:
        assert findings[0].evidence["speedup"] == speedup
        assert f"{speedup:.2f}× the plain decode" in findings[0].message


def _decoding_session(store: Store, sid: str, start: float, rate: float, spec_type: str | None) -> None:
    ticks = [
        snapshot(start + i, (model(session_id=sid, decode_tok_s=rate, context_tokens=600),)) for i in range(4)
    ]
    for tick in ticks[:-1]:
        store.record(tick)
    store.record(ticks[-1], [session(sid, started_wall_s=start, ended_wall_s=start + 4, spec_type=spec_type)])


def test_baselines_compare_like_with_like(tmp_path: Path) -> None:
    now = T0 + 86400
    with Store(tmp_path / "store.sqlite") as store:
        _decoding_session(store, "plain", now - 3000, 40.0, None)
        _decoding_session(store, "mtp", now - 2000, 70.0, "draft-mtp")
        _decoding_session(store, "ngram", now - 1000, 55.0, "ngram-cache")
        query = {"model": "qwen3:8b", "quantization": "Q4_K_M", "hardware": LABEL, "context_tokens": 600,
                 "before_wall_s": now}  # fmt: skip
        plain = store.baseline(**query, spec_type=None)  # type: ignore[arg-type]
        mtp = store.baseline(**query, spec_type="draft-mtp")  # type: ignore[arg-type]
    assert plain is not None and (plain.session_id, plain.decode_tok_s, plain.spec_type) == (
        "plain",
        40.0,
        None,
    )
    assert mtp is not None and (mtp.session_id, mtp.spec_type) == ("mtp", "draft-mtp")  # not the faster plain


def test_a_drafter_that_costs_speed_is_the_one_root_cause_not_below_floor() -> None:
    """A drafted decode at 2 tok/s (under the 3 tok/s floor) with 16 % acceptance: draft_acceptance
    only. Before the acceptance is known (llama-server counts drafts when a request ends),
    below_floor names the drafter as the suspect."""
    slow = snapshots.model(rate=2.0, draft_acceptance=0.16, spec_type="draft-simple")
    kinds = {f.kind for f in diagnose_model(_view(slow), Thresholds())}
    assert "draft_acceptance" in kinds and "below_floor" not in kinds
    unknown = snapshots.model(rate=2.0, draft_acceptance=None, spec_type="draft-simple")
    (floor,) = [f for f in diagnose_model(_view(unknown), Thresholds()) if f.kind == "below_floor"]
    assert floor.cause is not None and "draft-simple" in floor.cause and "--spec-type none" in floor.fix
    plain = snapshots.model(rate=2.0)
    (floor,) = [f for f in diagnose_model(_view(plain), Thresholds()) if f.kind == "below_floor"]
    assert floor.cause is None
