"""LM Studio parsing against the fixtures (LM Studio 0.4.x docs, lms CLI, lmstudio-js types)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.paths import FIXTURES_DIR
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers.lmstudio import (
    parse_chat_stats,
    parse_lms_log_line,
    parse_lms_ps,
    parse_models_v0,
    parse_models_v1,
    parse_params_string,
)

FIXTURES = FIXTURES_DIR / "lmstudio"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def test_v0_models_list_only_loaded_llms_with_loaded_context() -> None:
    models = {m.name: m for m in parse_models_v0(load("api_v0_models.json"))}
    assert set(models) == {"qwen3-30b-a3b", "qwen3-0.6b"}  # not-loaded ones are left out
    qwen = models["qwen3-30b-a3b"]
    assert qwen.loaded is True
    assert qwen.context_length == 16384  # loaded_context_length, not max_context_length
    assert qwen.quantization == "Q4_K_M"
    assert qwen.architecture == "qwen3moe"


def test_v0_model_without_loaded_context_has_unknown_context() -> None:
    data = {
        "object": "list",
        "data": [{"id": "m", "type": "llm", "state": "loaded", "max_context_length": 9}],
    }
    [only] = parse_models_v0(data)
    assert only.context_length is None  # the trained maximum is not the loaded context


def test_v1_models_give_one_reading_per_loaded_instance() -> None:
    [qwen] = parse_models_v1(load("api_v1_models.json"))
    assert qwen.name == "qwen/qwen3-30b-a3b"
    assert qwen.context_length == 16384
    assert qwen.size_bytes == 18556701111
    assert qwen.weights_bytes == 18556701111
    assert qwen.quantization == "Q4_K_M"
    assert qwen.architecture == "qwen3moe"
    assert qwen.parameter_count == 30_000_000_000


def test_two_instances_of_one_model_are_two_readings() -> None:
    data = load("api_v1_models.json")
    entry = data["models"][0]
    entry["loaded_instances"].append({"id": "qwen/qwen3-30b-a3b:2", "config": {"context_length": 4096}})
    names = {m.name: m.context_length for m in parse_models_v1(data)}
    assert names == {"qwen/qwen3-30b-a3b": 16384, "qwen/qwen3-30b-a3b:2": 4096}


@pytest.mark.parametrize("bad", [{"data": []}, [], "x", None])
def test_models_of_unexpected_shape_are_an_error(bad: object) -> None:
    with pytest.raises(UnexpectedAnswer):
        parse_models_v1(bad)
    if not (isinstance(bad, dict) and "data" in bad):
        with pytest.raises(UnexpectedAnswer):
            parse_models_v0(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30B-A3B", (30_000_000_000, 3_000_000_000)), ("8B", (8_000_000_000, None)), (None, (None, None))],
)
def test_params_string_gives_total_and_active_parameters(
    text: str | None, expected: tuple[int | None, int | None]
) -> None:
    assert parse_params_string(text) == expected


def test_lms_ps_status_says_whether_a_model_is_busy() -> None:
    [qwen] = parse_lms_ps(load("lms_ps.json"))  # the embedding model is left out
    assert qwen.name == "qwen/qwen3-30b-a3b"
    assert qwen.busy is True  # status "generating"
    assert qwen.context_length == 16384
    assert qwen.model_path == "qwen/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"
    data = load("lms_ps.json")
    data[0]["status"] = "processingPrompt"
    assert parse_lms_ps(data)[0].busy is True
    data[0]["status"] = "idle"
    assert parse_lms_ps(data)[0].busy is False
    del data[0]["status"]  # lms < 0.3.27
    assert parse_lms_ps(data)[0].busy is None
    with pytest.raises(UnexpectedAnswer):
        parse_lms_ps({"not": "a list"})


def test_chat_stats_draft_counts_in_usage() -> None:
    record = parse_chat_stats(load("api_v0_chat_completion.json"))
    assert record.model == "qwen3-30b-a3b"
    assert record.prompt_tokens == 29
    assert record.decode_tokens == 241
    assert record.decode_tok_s == pytest.approx(71.342, abs=1e-3)
    assert record.ttft_s == pytest.approx(0.184)
    assert record.draft_tokens == 228
    assert record.draft_accepted == 157
    assert record.context_tokens == 270
    assert record.finished_wall_s == pytest.approx(1790771832 + 0.184 + 3.378)


def test_chat_stats_draft_counts_in_stats() -> None:
    record = parse_chat_stats(load("api_v0_chat_completion_draft_in_stats.json"))
    assert record.draft_tokens == 228
    assert record.draft_accepted == 157


def test_chat_stats_without_drafts_and_from_the_v1_api() -> None:
    plain = parse_chat_stats(load("api_v0_chat_completion_plain.json"))
    assert plain.draft_tokens is None and plain.draft_accepted is None
    assert plain.decode_tokens == 53
    v1 = parse_chat_stats(load("api_v1_chat.json"), finished_wall_s=1790771900.0)
    assert v1.model == "qwen/qwen3-30b-a3b"
    assert v1.prompt_tokens == 27
    assert v1.decode_tokens == 188
    assert v1.ttft_s == pytest.approx(0.213)
    assert v1.finished_wall_s == 1790771900.0
    with pytest.raises(UnexpectedAnswer, match="finished_wall_s"):
        parse_chat_stats(load("api_v1_chat.json"))  # no `created` to derive a time from


def test_chat_stats_never_keep_the_completion_text() -> None:
    for name in ("api_v0_chat_completion.json", "api_v0_chat_completion_plain.json"):
        data = load(name)
        text = data["choices"][0]["message"]["content"]
        assert text not in repr(parse_chat_stats(data))
    with pytest.raises(UnexpectedAnswer):
        parse_chat_stats({"choices": []})


def test_an_lms_log_output_event_gives_a_finished_request() -> None:
    lines = (FIXTURES / "lms_log_stream.ndjson").read_text(encoding="utf-8").splitlines()
    assert parse_lms_log_line(lines[0]) is None  # the input event
    record = parse_lms_log_line(lines[1])
    assert record is not None
    assert record.model == "qwen/qwen3-30b-a3b"
    assert record.finished_wall_s == pytest.approx(1790771835.412)
    assert record.decode_tok_s == pytest.approx(71.342, abs=1e-3)
    assert record.ttft_s == pytest.approx(0.184)
    assert record.prompt_tokens == 29
    assert record.decode_tokens == 241
    assert record.context_tokens == 270
    assert record.draft_tokens == 228
    assert record.draft_accepted == 157
    assert record.source == "lms-log"


def test_lms_log_prompt_and_completion_text_is_never_kept() -> None:
    lines = (FIXTURES / "lms_log_stream.ndjson").read_text(encoding="utf-8").splitlines()
    prompt = json.loads(lines[0])["data"]["input"]
    completion = json.loads(lines[1])["data"]["output"]
    results = [parse_lms_log_line(line) for line in lines]
    everything = repr(results)
    assert "Why is the sky blue" not in everything
    assert prompt not in everything
    assert completion not in everything
    assert "skylight" not in everything


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not json",
        "[1, 2]",
        '{"timestamp": 1, "data": {"type": "server.log", "content": "x", "level": "info"}}',
        '{"timestamp": 1, "data": {"type": "llm.prediction.output", "output": "hi"}}',  # no stats
        b'{"data": "weird"}',
    ],
)
def test_other_lms_log_lines_give_nothing(line: str | bytes) -> None:
    assert parse_lms_log_line(line) is None


def test_lms_ps_queued_counts_the_requests_being_served_too() -> None:
    """`queued` includes the current predictions (reference/backends.md, `lms ps --json`): generating
    with 2 queued and 4 parallel slots, nothing waits; with 1 slot, 1 waits; idle, all of them wait
    for nothing (0 queued); before lms 0.3.27 there is no count."""
    data = load("lms_ps.json")
    assert parse_lms_ps(data)[0].queued_requests == 0  # 2 queued, both among the 4 being served
    data[0]["parallel"] = None  # one at a time: one served, one waiting
    assert parse_lms_ps(data)[0].queued_requests == 1
    data[0]["queued"], data[0]["status"] = 0, "idle"
    assert parse_lms_ps(data)[0].queued_requests == 0
    del data[0]["status"], data[0]["queued"]
    assert parse_lms_ps(data)[0].queued_requests is None
