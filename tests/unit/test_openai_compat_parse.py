"""vLLM / SGLang `/metrics` and OpenAI `/v1/models` parsing against the fixtures."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import FIXTURES_DIR
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers.openai_compat import (
    metrics_model_names,
    parse_openai_models,
    parse_sglang_metrics,
    parse_version_body,
    parse_vllm_metrics,
)

FIXTURES = FIXTURES_DIR
VLLM = (FIXTURES / "vllm" / "metrics.txt").read_text(encoding="utf-8")
SGLANG = (FIXTURES / "sglang" / "metrics.txt").read_text(encoding="utf-8")


def test_vllm_metrics_give_token_request_kv_and_ttft_counters() -> None:
    c = parse_vllm_metrics(VLLM)
    assert c.tokens_predicted_total == 284117.0
    assert c.prompt_tokens_total == 918432.0
    assert c.requests_running == 3.0
    assert c.requests_waiting == 1.0
    assert c.kv_usage_ratio == pytest.approx(0.3127)
    assert c.ttft_sum_s == pytest.approx(219.8811)
    assert c.ttft_count == 1332.0
    assert c.requests_total == 1288 + 41 + 3 + 0  # summed over finished_reason


def test_vllm_draft_counters_give_acceptance_and_mean_length() -> None:
    c = parse_vllm_metrics(VLLM)
    assert c.spec_draft_tokens_total == 285642.0
    assert c.spec_accepted_tokens_total == 188855.0
    assert c.spec_drafts_total == 95214.0
    assert c.spec_accepted_tokens_total is not None and c.spec_draft_tokens_total is not None
    assert c.spec_drafts_total is not None
    acceptance = c.spec_accepted_tokens_total / c.spec_draft_tokens_total
    mean_length = 1 + c.spec_accepted_tokens_total / c.spec_drafts_total
    assert acceptance == pytest.approx(0.661, abs=1e-3)
    assert mean_length == pytest.approx(2.98, abs=0.01)


def test_vllm_metrics_name_the_served_model() -> None:
    assert metrics_model_names(VLLM) == ["Qwen/Qwen3-8B"]


def test_vllm_counters_are_per_model_and_summed_over_engines() -> None:
    two = (
        'vllm:generation_tokens_total{model_name="a",engine="0"} 10\n'
        'vllm:generation_tokens_total{model_name="a",engine="1"} 5\n'
        'vllm:generation_tokens_total{model_name="b",engine="0"} 7\n'
        'vllm:gpu_cache_usage_perc{model_name="a",engine="0"} 0.5\n'
        'vllm:request_decode_time_seconds_sum{model_name="a",engine="0"} 2.5\n'
    )
    assert metrics_model_names(two) == ["a", "b"]
    a = parse_vllm_metrics(two, model_name="a")
    assert a.tokens_predicted_total == 15  # both engines
    assert a.kv_usage_ratio == 0.5  # older vLLM gauge name
    assert a.tokens_predicted_seconds_total == 2.5
    assert parse_vllm_metrics(two, model_name="b").tokens_predicted_total == 7


def test_vllm_metrics_without_drafts_or_garbage_give_unknowns() -> None:
    c = parse_vllm_metrics("garbage\n# HELP nothing\nvllm:num_requests_running 0\n")
    assert c.requests_running == 0
    assert c.spec_draft_tokens_total is None
    assert c.tokens_predicted_total is None
    assert parse_vllm_metrics("") == type(c)()


def test_sglang_metrics_give_counters_and_acceptance_only_when_drafting() -> None:
    c = parse_sglang_metrics(SGLANG)
    assert c.tokens_predicted_total == pytest.approx(7.557572e6)  # exponent notation
    assert c.prompt_tokens_total == pytest.approx(8.128902e6)
    assert c.requests_running == 12.0
    assert c.requests_waiting == 0.0
    assert c.kv_usage_ratio == pytest.approx(0.28)  # token_usage
    assert metrics_model_names(SGLANG) == ["Qwen/Qwen3-8B"]
    assert c.spec_accept_rate == pytest.approx(0.6366)  # speculative decoding on (accept length 2.91)
    spec_off = SGLANG.replace(
        'spec_accept_length{model_name="Qwen/Qwen3-8B"} 2.91',
        'spec_accept_length{model_name="Qwen/Qwen3-8B"} 0',
    )
    assert 'spec_accept_length{model_name="Qwen/Qwen3-8B"} 0' in spec_off
    assert parse_sglang_metrics(spec_off).spec_accept_rate is None  # off: the gauges read 0


def test_openai_models_give_ids_and_context_lengths() -> None:
    data = {
        "object": "list",
        "data": [
            {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "max_model_len": 32768},
            {"id": "plain", "object": "model"},
            {"id": "", "object": "model"},
            "junk",
        ],
    }
    models = parse_openai_models(data)
    assert [(m.name, m.context_length) for m in models] == [("Qwen/Qwen3-8B", 32768), ("plain", None)]


def test_openai_models_read_llama_server_context_from_meta() -> None:
    data = json.loads((FIXTURES / "llama-server" / "v1_models.json").read_text(encoding="utf-8"))
    [model] = parse_openai_models(data)
    assert model.context_length == data["data"][0]["meta"]["n_ctx"]


@pytest.mark.parametrize("bad", [{}, [], "x", {"data": "x"}])
def test_openai_models_of_unexpected_shape_are_an_error(bad: object) -> None:
    with pytest.raises(UnexpectedAnswer, match="/v1/models"):
        parse_openai_models(bad)


def test_version_endpoint_gives_the_version_string() -> None:
    assert parse_version_body({"version": "0.11.0"}) == "0.11.0"
    assert parse_version_body([]) is None
