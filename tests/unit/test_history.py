"""Dashboard history (pure): gaps, bounds, finished requests, the expected KV curve."""

from __future__ import annotations

import math

import pytest

from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.history import History, expected_ceiling_curve
from trayapp.core.model import KvLayout, ModelFacts, ModelStatus, RequestRecord, ServerStatus, Snapshot

URL = "http://127.0.0.1:8080"
KEY = (URL, "m")
HW = HardwareSnapshot(gpus=(), host=HostReading(None, None, None))


def snap(t: float, phase: str | None = "decoding", rate: float | None = 40.0, **kw: object) -> Snapshot:
    models = (
        ()
        if phase is None
        else (
            ModelStatus(
                name="m",
                phase=phase,
                decode_tok_s=rate,
                ceiling_tok_s=60.0,
                context_tokens=int(100 * t),
                **kw,
            ),
        )
    )  # type: ignore[arg-type]
    return Snapshot(
        t_wall_s=t, t_mono_s=t, servers=(ServerStatus("llamacpp", URL, "ok", models=models),), hardware=HW
    )


def test_idle_is_a_gap_not_a_zero_and_stall_is_zero() -> None:
    history = History()
    for t, phase in enumerate(["decoding", "idle", "stalled", "decoding"]):
        history.add(snap(float(t), phase, rate=40.0 if phase == "decoding" else None))
    y = history.arrays(KEY).decode_tok_s
    assert y[0] == 40.0 and math.isnan(y[1]) and y[2] == 0.0 and y[3] == 40.0


def test_a_model_that_disappears_or_a_long_silence_breaks_the_line() -> None:
    history = History(gap_s=15.0)
    history.add(snap(0.0))
    history.add(snap(1.0, phase=None))  # the model unloaded
    history.add(snap(2.0))
    history.add(snap(60.0))  # after a pause of monitoring
    arrays = history.arrays(KEY)
    assert [not math.isnan(v) for v in arrays.decode_tok_s] == [True, False, True, False, True]


def test_bounded_by_time_and_count_and_forgets_gone_models() -> None:
    history = History(window_s=100.0, max_points=50)
    for t in range(300):
        history.add(snap(float(t)))
    arrays = history.arrays(KEY)
    assert len(arrays.t_wall_s) == 50 and arrays.t_wall_s[0] == 250.0
    for t in range(300, 420):
        history.add(snap(float(t), phase=None))
    assert history.model_keys() == []


def test_finished_requests_are_kept_apart() -> None:
    history = History()
    record = RequestRecord(
        server=URL,
        server_kind="llamacpp",
        model="m",
        finished_wall_s=5.0,
        session_id=None,
        exact=True,
        decode_tok_s=41.5,
        context_tokens=900,
    )
    snapshot = snap(5.0)
    history.add(
        Snapshot(t_wall_s=5.0, t_mono_s=5.0, servers=snapshot.servers, hardware=HW, requests=(record,))
    )
    arrays = history.arrays(KEY)
    assert list(arrays.request_tok_s) == [41.5] and list(arrays.request_exact) == [True]
    assert list(arrays.request_context_tokens) == [900.0]


def test_ceiling_points_by_depth() -> None:
    history = History()
    history.add(snap(3.0))
    history.add(snap(1.0))
    assert history.ceiling_points(KEY) == [(100.0, 60.0), (300.0, 60.0)]


def test_expected_curve_is_anchored_on_the_live_ceiling() -> None:
    facts = ModelFacts(
        weights_bytes=10**9,
        bytes_per_token=10**9,
        exact=True,
        source="gguf",
        kv=KvLayout(full_elems_per_token=1000),
    )  # 2000 bytes/token at f16
    model = ModelStatus(name="m", phase="decoding", ceiling_tok_s=50.0, context_tokens=100_000, facts=facts)
    curve = expected_ceiling_curve(model, 200_000, points=3)
    assert [c for c, _ in curve] == [0, 100_000, 200_000]
    at_live = dict(curve)[100_000]
    assert at_live == pytest.approx(50.0)
    assert dict(curve)[0] == pytest.approx(50.0 * 1.2e9 / 1e9)  # no KV to read at empty context
    assert dict(curve)[200_000] == pytest.approx(50.0 * 1.2e9 / 1.4e9)
    assert expected_ceiling_curve(ModelStatus(name="m", phase="idle"), 8192) == []
