"""llama-server payload parsers against the hand-built and the captured fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trayapp.core.model import SlotReading
from trayapp.sources.servers.llamacpp_parse import (
    ModelMeta,
    PropsInfo,
    parse_metrics,
    parse_props,
    parse_slots,
    parse_timings,
    parse_v1_models,
)


@pytest.fixture
def llama_dir(fixtures_dir: Path) -> Path:
    return fixtures_dir / "llama-server"


def load(directory: Path, name: str) -> Any:
    return json.loads((directory / name).read_text())


# --------------------------------------------------------------------------- /props


def test_props_give_model_quantization_context_slots_and_draft_types(llama_dir: Path) -> None:
    props = parse_props(load(llama_dir, "props.json"))
    assert props == PropsInfo(
        model_path="/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        model_alias="Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        model_ftype="Q4_K - Medium",
        quantization="Q4_K_M",
        n_ctx=32768,
        total_slots=4,
        build_info="b11434-3f2a9c1d8",
        endpoint_slots=True,
        endpoint_metrics=True,
        is_sleeping=False,
        speculative_types=("draft-simple",),
    )
    assert props.speculative
    assert props.model_name == "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"


def test_a_model_alias_that_is_the_path_is_shown_as_the_file_name(llama_dir: Path) -> None:
    props = parse_props(load(llama_dir / "captured", "props.json"))
    assert props.model_alias == props.model_path == "/models/gemma-3-270m-q4_k_m.gguf"
    assert props.model_name == "gemma-3-270m-q4_k_m.gguf"  # the file name, not the whole path
    assert props.quantization == "Q4_K_M"
    assert props.n_ctx == 8192
    assert props.total_slots == 4
    assert props.build_info == "b0-unknown"
    assert props.speculative_types == ("none",)
    assert not props.speculative


def test_props_report_sleep_disabled_endpoints_and_speculative_types() -> None:
    props = parse_props(
        {
            "model_path": "/m/x.gguf",
            "endpoint_slots": False,
            "endpoint_metrics": False,
            "is_sleeping": True,
            "default_generation_settings": {"params": {"speculative.types": "none,draft-mtp"}},
        }
    )
    assert props.is_sleeping and not props.endpoint_slots and not props.endpoint_metrics
    assert props.speculative_types == ("none", "draft-mtp") and props.speculative
    assert props.n_ctx is None and props.quantization is None


@pytest.mark.parametrize("garbage", [None, [], "text", 3, {"model_path": 7, "total_slots": "4"}])
def test_props_of_unexpected_shape_give_unknowns(garbage: Any) -> None:
    props = parse_props(garbage)
    assert props.model_path is None and props.total_slots is None
    assert props.model_name == "unknown"


# --------------------------------------------------------------------------- /slots


def test_an_idle_slot_keeps_the_counts_of_its_previous_task(llama_dir: Path) -> None:
    slots = parse_slots(load(llama_dir, "slots_idle.json"))
    assert len(slots) == 4
    assert slots[0] == SlotReading(
        slot_id=0,
        is_processing=False,
        task_id=412,
        n_decoded=355,
        context_tokens=1893,
        prompt_tokens_processed=117,
        prompt_tokens_cached=1421,
        n_ctx=32768,
        speculative=True,
        spec_type="draft-simple",  # the fixture's params: "speculative.types": "draft-simple"
    )
    assert slots[1] == SlotReading(slot_id=1, is_processing=False, n_ctx=32768, speculative=True)


def test_a_processing_slot_reports_decoded_tokens_and_context_depth(llama_dir: Path) -> None:
    slots = parse_slots(load(llama_dir, "slots_busy.json"))
    generating, prefilled = slots[0], slots[1]
    assert generating.is_processing and generating.n_decoded == 319 and generating.context_tokens == 2604
    assert prefilled.is_processing and prefilled.n_decoded == 0 and prefilled.prompt_tokens_processed == 6144
    assert [s.is_processing for s in slots] == [True, True, False, False]


def test_real_slots_before_during_and_after_a_request(llama_dir: Path) -> None:
    fresh = parse_slots(load(llama_dir / "captured", "slots_fresh.json"))
    assert [s.slot_id for s in fresh] == [0, 1, 2, 3]
    assert all(not s.is_processing and s.task_id is None and s.n_decoded is None for s in fresh)
    assert all(s.n_ctx == 8192 and not s.speculative for s in fresh)

    busy = parse_slots(load(llama_dir / "captured", "slots_busy.json"))[3]
    assert busy.is_processing and busy.task_id == 2
    assert busy.n_decoded == 115 and busy.context_tokens == 125  # prompt 10 + generated 115
    assert busy.prompt_tokens_processed == 10 and busy.prompt_tokens_cached == 0

    after = parse_slots(load(llama_dir / "captured", "slots_after.json"))[3]
    assert not after.is_processing and after.context_tokens == 309 and after.task_id == 2


def test_a_slot_with_a_draft_model_is_marked_speculative(llama_dir: Path) -> None:
    (slot,) = parse_slots(load(llama_dir / "captured", "slots_spec_idle.json"))
    assert slot.speculative and slot.n_ctx == 4096 and slot.context_tokens == 78


def test_prompt_and_completion_text_in_debug_slots_is_never_kept(llama_dir: Path) -> None:
    data = load(llama_dir / "captured", "slots_busy.json")
    secret_prompt = "MY-SECRET-PROMPT tell me about the launch codes"
    secret_output = "MY-SECRET-COMPLETION the codes are 0000"
    data[3]["prompt"] = secret_prompt  # what LLAMA_SERVER_SLOTS_DEBUG adds
    data[3]["generated"] = secret_output
    slots = parse_slots(data)
    assert slots[3].n_decoded == 115
    text = repr(slots)
    assert "SECRET" not in text and "launch codes" not in text and "0000" not in text


@pytest.mark.parametrize("garbage", [None, {}, "x", [1, "two", None]])
def test_slots_of_unexpected_shape_give_no_slots(garbage: Any) -> None:
    assert parse_slots(garbage) == ()


# --------------------------------------------------------------------------- /metrics


def test_metrics_give_token_time_and_draft_counters_and_start_time(llama_dir: Path) -> None:
    counters = parse_metrics(
        (llama_dir / "metrics.txt").read_text(), {"Process-Start-Time-Unix": "1790771000"}
    )
    assert counters.tokens_predicted_total == 21544
    assert counters.tokens_predicted_seconds_total == pytest.approx(241.337)
    assert counters.prompt_tokens_total == 48213
    assert counters.prompt_seconds_total == pytest.approx(31.874)
    assert counters.spec_draft_tokens_total == 14208
    assert counters.spec_accepted_tokens_total == 9518
    assert counters.spec_drafts_total == 3552
    assert counters.spec_accepted_tokens_total / counters.spec_draft_tokens_total == pytest.approx(
        0.67, abs=0.005
    )
    assert counters.requests_running == 1 and counters.requests_waiting == 0
    assert counters.process_start_s == 1790771000.0


def test_metrics_in_g_format_and_a_lowercase_start_header_are_read(llama_dir: Path) -> None:
    counters = parse_metrics(
        (llama_dir / "metrics_no_spec.txt").read_text(), {"process-start-time-unix": "1.79e+09"}
    )
    assert counters.prompt_tokens_total == 1284610.0  # printed as 1.28461e+06
    assert counters.tokens_predicted_total == 402117
    assert counters.spec_draft_tokens_total == 0
    assert counters.requests_running == 0
    assert counters.process_start_s == 1.79e9


@pytest.mark.parametrize(
    ("name", "predicted", "seconds", "drafts", "accepted"),
    [
        ("metrics_fresh.txt", 0, 0.0, 0, 0),
        ("metrics_after.txt", 300, 3.69638, 0, 0),
        ("metrics_spec_draft_simple.txt", 180, 3.66785, 133, 133),
        ("metrics_spec_low_acceptance.txt", 120, 6.16456, 222, 43),
    ],
)
def test_real_metrics_give_decoded_tokens_seconds_and_drafts(
    llama_dir: Path, name: str, predicted: float, seconds: float, drafts: float, accepted: float
) -> None:
    counters = parse_metrics((llama_dir / "captured" / name).read_text(), {})
    assert counters.tokens_predicted_total == predicted
    assert counters.tokens_predicted_seconds_total == pytest.approx(seconds)
    assert counters.spec_draft_tokens_total == drafts
    assert counters.spec_accepted_tokens_total == accepted
    assert counters.process_start_s is None


def test_metrics_that_are_not_prometheus_text_give_unknowns() -> None:
    counters = parse_metrics("<html>not metrics</html>\nllamacpp:tokens_predicted_total abc\n", None)
    assert counters.tokens_predicted_total is None and counters.prompt_tokens_total is None


def test_an_unparseable_start_time_header_is_ignored(llama_dir: Path) -> None:
    counters = parse_metrics((llama_dir / "metrics.txt").read_text(), {"Process-Start-Time-Unix": "soon"})
    assert counters.process_start_s is None and counters.tokens_predicted_total == 21544


# --------------------------------------------------------------------------- /v1/models


def test_v1_models_meta_gives_weights_size_and_parameter_count(llama_dir: Path) -> None:
    (meta,) = parse_v1_models(load(llama_dir, "v1_models.json"))
    assert meta == ModelMeta(
        id="Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        size_bytes=4912898304,
        parameter_count=8030261312,
        n_ctx_train=131072,
        n_ctx=32768,
        n_vocab=128256,
        n_embd=4096,
        ftype="Q4_K - Medium",
    )


def test_real_v1_models_give_the_served_model_size(llama_dir: Path) -> None:
    (meta,) = parse_v1_models(load(llama_dir / "captured", "v1_models.json"))
    assert meta.id == "/models/gemma-3-270m-q4_k_m.gguf"
    assert meta.size_bytes == 246587904 and meta.parameter_count == 268098176
    assert meta.n_ctx_train == 32768 and meta.n_vocab == 262144


def test_v1_models_without_meta_while_loading_give_only_the_id() -> None:
    (meta,) = parse_v1_models({"data": [{"id": "m", "meta": None}]})
    assert meta == ModelMeta(id="m")
    assert parse_v1_models({"object": "list"}) == ()
    assert parse_v1_models("nope") == ()


# --------------------------------------------------------------------------- timings


def test_completion_timings_give_rates_ttft_cached_and_draft_counts(llama_dir: Path) -> None:
    done = parse_timings(load(llama_dir, "completion_final.json"), finished_wall_s=100.0)
    assert done is not None
    assert done.model == "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
    assert done.finished_wall_s == 100.0
    assert done.decode_tokens == 355
    assert done.decode_tok_s == pytest.approx(104.52, abs=0.01)
    assert done.prompt_tok_s == pytest.approx(1902.995, abs=0.01)
    assert done.ttft_s == pytest.approx(0.061482)
    assert done.prompt_tokens == 117 + 1421 and done.cached_tokens == 1421
    assert done.context_tokens == 1538 + 355
    assert done.draft_tokens == 412 and done.draft_accepted == 281
    assert "Rayleigh" not in repr(done)  # no completion or prompt text


def test_chat_timings_without_a_draft_model_have_no_draft_counts(llama_dir: Path) -> None:
    done = parse_timings(load(llama_dir, "chat_completion.json"), finished_wall_s=1.0)
    assert done is not None
    assert done.draft_tokens is None and done.draft_accepted is None
    assert done.decode_tok_s == pytest.approx(87.785, abs=0.01)
    assert "sky" not in repr(done)


def test_timings_from_the_last_stream_chunk_or_a_bare_object(llama_dir: Path) -> None:
    chunk = load(llama_dir, "chat_stream_last_chunk.json")
    done = parse_timings(chunk, finished_wall_s=1.0, model="override", source="proxy")
    assert done is not None and done.model == "override" and done.source == "proxy"
    assert done.draft_accepted == 281
    bare = parse_timings(chunk["timings"], finished_wall_s=1.0)
    assert bare is not None and bare.decode_tokens == 355 and bare.model == "unknown"


@pytest.mark.parametrize(
    ("name", "tok_s", "drafts", "accepted"),
    [
        ("completion.json", 70.103, None, None),
        ("completion_spec_draft_simple.json", 49.443, 44, 44),
        ("completion_spec_low_acceptance.json", 19.304, 222, 43),
        ("chat_completion.json", 79.939, None, None),
    ],
)
def test_real_completion_timings_give_decode_rate_and_drafts(
    llama_dir: Path, name: str, tok_s: float, drafts: int | None, accepted: int | None
) -> None:
    data = load(llama_dir / "captured", name)
    done = parse_timings(data, finished_wall_s=5.0)
    assert done is not None
    assert done.decode_tok_s == pytest.approx(tok_s, abs=0.001)
    assert done.draft_tokens == drafts and done.draft_accepted == accepted
    assert done.ttft_s == pytest.approx(data["timings"]["prompt_ms"] / 1000)
    assert done.model == "/models/gemma-3-270m-q4_k_m.gguf"


def test_a_response_without_timings_gives_no_record() -> None:
    assert parse_timings({"choices": []}, finished_wall_s=0.0) is None
    assert parse_timings("garbage", finished_wall_s=0.0) is None
    assert parse_timings({"timings": None}, finished_wall_s=0.0) is None


def test_one_generated_token_is_no_decode_rate() -> None:
    """llama-server build 11434's log of a 1-token request (TTFT runs, prefill-only requests):
    `eval time = 0.00 ms / 1 tokens (… 0.00 tokens per second)` — its timings say 0.0 tok/s,
    which is no measurement: stored as a rate it would plot an 'exact' 0 tok/s point."""
    timings = {
        "prompt_n": 3511, "prompt_ms": 44593.88, "prompt_per_second": 78.73,
        "predicted_n": 1, "predicted_ms": 0.0, "predicted_per_second": 0.0,
    }  # fmt: skip
    done = parse_timings({"timings": timings}, finished_wall_s=1.0)
    assert done is not None
    assert done.decode_tokens == 1 and done.decode_tok_s is None
    assert done.prompt_tok_s == pytest.approx(78.73) and done.ttft_s == pytest.approx(44.59388)
    two = parse_timings({"timings": {**timings, "predicted_n": 2, "predicted_per_second": 25.0}})
    assert two is not None and two.decode_tok_s == 25.0
