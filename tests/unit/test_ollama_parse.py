"""Ollama parsing against the fixtures (shape: ollama/ollama v0.32.15), plus child matching."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.paths import FIXTURES_DIR
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.processes import ChildServer, parse_server_args
from trayapp.sources.servers.ollama import (
    blob_digest,
    match_children,
    parse_parameter_size,
    parse_ps,
    parse_ps_digests,
    parse_show,
    parse_show_model_path,
    parse_tags_sizes,
    parse_version,
)

FIXTURES = FIXTURES_DIR / "ollama"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def gpu_percent(size: int, size_vram: int) -> int:
    """`ollama ps` PROCESSOR column, GPU part (cmd/cmd.go ListRunningHandler)."""
    cpu = round((size - size_vram) / size * 100)
    return 100 - cpu


def test_api_version_gives_the_version_string() -> None:
    assert parse_version(load("api_version.json")) == "0.32.15"
    assert parse_version({"nope": 1}) is None
    assert parse_version("garbage") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8.0B", 8_000_000_000), ("30.5B", 30_500_000_000), ("270M", 270_000_000), ("1.5T", 1_500_000_000_000)],
)
def test_parameter_size_text_becomes_a_count(text: str, expected: int) -> None:
    assert parse_parameter_size(text) == expected


@pytest.mark.parametrize("text", ["", "big", "B8", None, 8])
def test_unparseable_parameter_size_gives_none(text: object) -> None:
    assert parse_parameter_size(text) is None


def test_a_dense_model_fully_on_gpu_reports_size_context_and_quant() -> None:
    models = {m.name: m for m in parse_ps(load("api_ps.json"))}
    llama = models["llama3.1:8b"]
    assert llama.loaded is True
    assert llama.size_bytes == llama.vram_bytes == 6294446080
    assert llama.context_length == 8192
    assert llama.quantization == "Q4_K_M"
    assert llama.parameter_count == 8_000_000_000
    assert llama.architecture == "llama"
    assert llama.expires_at == "2026-09-30T14:42:07.118240113+02:00"


def test_ps_moe_partial_offload_is_48_percent_gpu() -> None:
    qwen = {m.name: m for m in parse_ps(load("api_ps.json"))}["qwen3:30b"]
    assert qwen.size_bytes == 22187335680
    assert qwen.vram_bytes == 10649920512
    assert qwen.context_length == 32768
    assert qwen.parameter_count == 30_500_000_000
    assert qwen.vram_bytes is not None and qwen.size_bytes is not None
    assert gpu_percent(qwen.size_bytes, qwen.vram_bytes) == 48
    assert qwen.vram_bytes / qwen.size_bytes == pytest.approx(0.48, abs=0.005)


def test_no_loaded_models_give_an_empty_list_and_digests_are_kept() -> None:
    assert parse_ps(load("api_ps_empty.json")) == []
    digests = parse_ps_digests(load("api_ps.json"))
    assert digests["qwen3:30b"] == "5aeddff9a7b8d1acb705ab15933a12aee63f7397b78e4169ffbc05457427b119"


@pytest.mark.parametrize("bad", [[], {"models": "x"}, "garbage", None, {"model": []}])
def test_ps_wrong_shape_is_a_clear_error(bad: object) -> None:
    with pytest.raises(UnexpectedAnswer, match="/api/ps"):
        parse_ps(bad)


def test_broken_ps_entries_are_skipped() -> None:
    data = {"models": [{"size": 1}, "x", {"name": "ok:1b", "size": "big", "details": None}]}
    [only] = parse_ps(data)
    assert only.name == "ok:1b"
    assert only.size_bytes is None


def test_tags_give_each_models_size_on_disk() -> None:
    sizes = parse_tags_sizes(load("api_tags.json"))
    assert sizes == {"qwen3:30b": 18556701111, "llama3.1:8b": 4920753328}


def test_show_gives_estimated_facts_of_a_dense_model() -> None:
    facts = parse_show(load("api_show.json"), size_bytes=4920753328)
    assert facts is not None
    assert facts.exact is False  # the tensor list in /api/show is truncated
    assert facts.source == "ollama-show"
    assert facts.architecture == "llama"
    assert facts.parameter_count == 8030261312
    assert facts.weights_bytes == 4920753328
    assert facts.bytes_per_token == facts.weights_bytes  # dense: every weight read per token
    assert facts.context_train == 131072
    assert facts.kv is not None
    # 32 layers × 8 KV heads × (128 + 128) (key length = 4096 / 32 heads)
    assert facts.kv.full_elems_per_token == 32 * 8 * 256


def test_show_without_a_size_estimates_weights_from_the_quantization() -> None:
    facts = parse_show(load("api_show.json"))
    assert facts is not None
    # 8.03e9 params × ~4.9 bits ÷ 8 ≈ 4.9 GB
    assert 4.5e9 < facts.weights_bytes < 5.3e9


def test_show_gives_active_parameters_and_experts_of_a_moe_model() -> None:
    facts = parse_show(load("api_show_moe.json"), size_bytes=18556701111)
    assert facts is not None
    assert facts.architecture == "qwen3moe"
    assert facts.expert_count == 128
    assert facts.expert_used_count == 8
    assert facts.parameter_count == 30532122624
    # Qwen3-30B-A3B: about 3.3 B of 30.5 B parameters are read per token.
    assert facts.active_parameter_count is not None
    assert 3.0e9 < facts.active_parameter_count < 3.6e9
    assert facts.bytes_per_token < facts.weights_bytes * 0.15
    assert facts.kv is not None
    # 48 layers × 4 KV heads × (128 + 128)
    assert facts.kv.full_elems_per_token == 48 * 4 * 256
    assert facts.context_train == 40960


def test_show_of_unexpected_shape_is_an_error_or_no_facts() -> None:
    with pytest.raises(UnexpectedAnswer):
        parse_show(["not", "an", "object"])
    assert parse_show({"model_info": {}, "details": {}}) is None  # nothing to go on


def test_show_names_the_gguf_blob_and_its_digest() -> None:
    path = parse_show_model_path(load("api_show.json"))
    assert path == (
        "/usr/share/ollama/.ollama/models/blobs/"
        "sha256-42cc205ac66108acd6c5cd62228a59d62f2e495df649f28d88784b0f78a88524"
    )
    assert blob_digest(path) == "42cc205ac66108acd6c5cd62228a59d62f2e495df649f28d88784b0f78a88524"
    assert blob_digest("/models/gemma.gguf") is None
    assert parse_show_model_path({"modelfile": "no from line"}) is None


BLOB_A = "/o/blobs/sha256-" + "a" * 64
BLOB_B = "/o/blobs/sha256-" + "b" * 64


def test_match_children_by_blob_digest() -> None:
    children = [
        ChildServer(pid=11, port=40001, model_path=BLOB_B, parent_pid=1),
        ChildServer(pid=10, port=40000, model_path=BLOB_A, parent_pid=1),
    ]
    models = [("m-a", "f" * 64, BLOB_A), ("m-b", "e" * 64, BLOB_B)]
    matched = match_children(models, children)
    assert matched["m-a"].pid == 10
    assert matched["m-b"].pid == 11


def test_match_children_by_manifest_digest_when_no_show() -> None:
    children = [ChildServer(pid=10, port=40000, model_path=BLOB_A, parent_pid=1)]
    matched = match_children([("m", "a" * 64, None), ("other", "c" * 64, None)], children)
    assert matched == {"m": children[0]}


def test_one_model_and_one_child_are_paired_without_a_digest_match() -> None:
    child = ChildServer(pid=10, port=40000, model_path="/elsewhere/model.gguf", parent_pid=1)
    assert match_children([("m", "c" * 64, BLOB_A)], [child]) == {"m": child}
    # two models, one unmatched child: no guessing
    assert match_children([("m", None, BLOB_A), ("n", None, BLOB_B)], [child]) == {}
    # a child without a port cannot be read
    assert match_children([("m", None, None)], [ChildServer(1, None, None, 1)]) == {}


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["llama-server", "--model", "/b/sha256-x", "--port", "40123", "--no-webui"], (40123, "/b/sha256-x")),
        (["llama-server", "--port=5", "-m", "/m.gguf"], (5, "/m.gguf")),
        (["llama-server", "--model=/m.gguf", "--port", "bad"], (None, "/m.gguf")),
        (["llama-server", "--port"], (None, None)),
        (["llama-server"], (None, None)),
    ],
)
def test_child_command_line_gives_port_and_model_path(
    cmdline: list[str], expected: tuple[int | None, str | None]
) -> None:
    assert parse_server_args(cmdline) == expected
