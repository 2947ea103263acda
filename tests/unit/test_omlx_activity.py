"""oMLX's `/admin/api/activity` parsed from its documented shape (tests/fixtures/omlx/: the idle answer
recorded from oMLX 0.7.0 and a busy one built from the fields `_build_active_models_data` writes, as
Codenotch's oMLX plan lists them). Expected values are the fixtures' own numbers or hand arithmetic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trayapp.core.model import ServerReading
from trayapp.core.rates import RateTracker
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers.omlx import OmlxMemory, OmlxRequest, parse_omlx_activity

MODEL = "Qwen3.8-27B-oQ8e-mtp"


def _load(fixtures_dir: Path, name: str) -> Any:
    return json.loads((fixtures_dir / "omlx" / name).read_text())


def test_idle_the_loaded_model_with_its_resident_bytes_and_no_requests(fixtures_dir: Path) -> None:
    activity = parse_omlx_activity(_load(fixtures_dir, "admin_api_activity_idle.json"))
    (model,) = activity.models
    assert (model.name, model.loaded, model.loading, model.size_bytes) == (MODEL, True, False, 30203498392)
    assert model.slots == () and model.busy is False
    assert model.counters is not None and model.counters.requests_waiting == 0
    assert activity.requests == () and activity.waiting_total == 0
    assert activity.memory == OmlxMemory("ok", 35344391664, 79716224548, 84144903690)


def test_busy_queue_position_prefill_progress_and_generation_rate(fixtures_dir: Path) -> None:
    activity = parse_omlx_activity(_load(fixtures_dir, "admin_api_activity_busy.json"))
    busy, loading = activity.models
    assert busy.busy and busy.counters is not None
    assert (busy.counters.requests_running, busy.counters.requests_waiting) == (2, 1)
    # A model still loading: not yet loaded, its estimated size (it holds nothing resident yet).
    assert (loading.name, loading.loaded, loading.loading, loading.size_bytes) == (
        "gemma-4-12b-oQ4", False, True, 7516192768
    )  # fmt: skip
    prefill, generating = busy.slots
    assert prefill.n_decoded == 0
    assert (prefill.prompt_tokens_processed, prefill.prompt_tokens_total) == (6144, 28000)
    assert (generating.n_decoded, generating.context_tokens) == (412, 2534 + 412)
    by_phase = {r.phase: r for r in activity.requests}
    assert by_phase["waiting"] == OmlxRequest(
        MODEL, "req-c3", "waiting", queue_position=1, waited_s=3.1, prompt_tokens=1200
    )
    reading = by_phase["prefilling"]
    assert (reading.prompt_tokens_done, reading.prompt_tokens, reading.prompt_tok_s) == (6144, 28000, 850.0)
    # oMLX's ETA is the tokens left over its speed: (28000 - 6144) / 850 = 25.7 s.
    assert reading.prompt_eta_s == pytest.approx((28000 - 6144) / 850, abs=0.05)
    answer = by_phase["generating"]
    assert (answer.generated_tokens, answer.decode_tok_s, answer.max_tokens) == (412, 40.0, 32768)
    assert activity.waiting_total == 1
    assert activity.memory is not None and activity.memory.level == "soft"
    assert activity.memory.soft_bytes is not None and activity.memory.current_bytes is not None
    assert activity.memory.current_bytes > activity.memory.soft_bytes  # what "soft" pressure says


def test_the_rates_stage_reads_the_slots_like_any_server(fixtures_dir: Path) -> None:
    """Two polls 2 s apart, the answer at 412 then 492 tokens: (492 - 412) / 2 = 40 tok/s, estimated."""
    doc = _load(fixtures_dir, "admin_api_activity_busy.json")
    tracker = RateTracker()
    for t, generated in ((10.0, 412), (12.0, 492)):
        doc["active_models"]["models"][0]["generating"][0]["generated_tokens"] = generated
        models = parse_omlx_activity(doc).models
        estimate = tracker.update(ServerReading("openai", "http://127.0.0.1:8000", "ok", models=models), t, t)
    busy = estimate.models[MODEL]
    assert busy.phase == "decoding" and busy.decode_exact is False
    assert busy.decode_tok_s == pytest.approx(40.0)
    assert busy.prefill is not None
    assert (busy.prefill.tokens_done, busy.prefill.tokens_total) == (6144, 28000)


def test_an_answer_of_another_shape_is_unexpected() -> None:
    with pytest.raises(UnexpectedAnswer):
        parse_omlx_activity({"detail": "Admin authentication required"})
