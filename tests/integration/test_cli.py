"""The `llm-tray` command line, run as a real subprocess (what a user types)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.cli import run_cli
from tests.support.fake_servers import FakeOllama


@pytest.mark.parametrize(
    "args",
    [
        ["ceiling", "--params", "abc"],
        ["ceiling", "--params", "8", "--context", "-5"],
        ["ceiling", "--params", "8", "--gpu-fraction", "1.5"],
        ["ceiling", "--params", "8", "--kv-type", "q9_9"],
        ["ceiling", "--params", "8", "--gpu", "RTX 9999 Imaginary"],
        ["ceiling"],
        ["watch", "--interval", "0"],
        ["status", "--endpoint", "not-a-url"],
        ["no-such-command"],
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # argparse adds a usage line; ours is one line
    assert "error" in result.stderr


def test_ceiling_json_for_the_worked_example() -> None:
    result = run_cli("ceiling", "--params", "8", "--quant", "Q4_K_M", "--gpu", "RTX 4090", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in (
        "bytes_per_token", "bandwidth_gbps", "context", "ceiling_tok_s", "split_ceiling_tok_s",
        "expected_tok_s", "fits", "required_bytes", "available_bytes", "quants",
    ):  # fmt: skip
        assert key in report, key
    assert report["bandwidth_gbps"] == pytest.approx(1008, rel=0.01)
    assert report["context"] == 4096
    # 8B at 4.89 bpw ≈ 4.9 GB → ~205 tok/s at empty context; the 4k KV cache costs a little.
    assert 180 <= report["ceiling_tok_s"] <= 210
    low, high = report["expected_tok_s"]
    assert low == pytest.approx(0.60 * report["ceiling_tok_s"], rel=0.01)
    assert high == pytest.approx(0.75 * report["ceiling_tok_s"], rel=0.01)
    assert report["fits"] is True and report["split_ceiling_tok_s"] is None
    quants = {q["quant"]: q for q in report["quants"]}
    assert quants["Q8_0"]["ceiling_tok_s"] < report["ceiling_tok_s"] < quants["Q3_K_M"]["ceiling_tok_s"]


def test_ceiling_for_a_model_that_does_not_fit() -> None:
    result = run_cli(
        "ceiling", "--weights-gb", "40", "--gpu", "RTX 4090", "--ram-bandwidth-gbps", "60", "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["fits"] is False
    assert report["required_bytes"] > report["available_bytes"]
    assert report["split_ceiling_tok_s"] is not None
    assert report["split_ceiling_tok_s"] < report["ceiling_tok_s"] / 3  # the offload cliff


def test_ceiling_human_table_has_units() -> None:
    result = run_cli("ceiling", "--params", "8", "--bandwidth-gbps", "1008", "--vram-gb", "24")
    assert result.returncode == 0, result.stderr
    assert "tok/s" in result.stdout and "GB" in result.stdout


@pytest.fixture
def fake_ollama() -> Iterator[FakeOllama]:
    server = FakeOllama()
    try:
        yield server
    finally:
        server.close()


def test_status_reports_exactly_one_offload_alert(fake_ollama: FakeOllama) -> None:
    """Ollama v0.32.15 /api/ps: qwen3:30b 52 % on CPU, llama3.1:8b fully in VRAM."""
    fake_ollama.load("llama3.1:8b")
    fake_ollama.load("qwen3:30b")
    result = run_cli(
        "status", "--json", "--endpoint", f"ollama={fake_ollama.url}", "--no-discover", "--gpu", "RTX 4090"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    server = data["servers"][0]
    assert server["kind"] == "ollama" and server["status"] == "ok"
    models = {m["name"]: m for m in server["models"]}
    assert models["qwen3:30b"]["gpu_fraction"] == pytest.approx(0.48, abs=0.005)
    assert models["llama3.1:8b"]["gpu_fraction"] == 1.0

    offload = [a for a in data["alerts"] if a["kind"] == "offload"]
    assert len(offload) == 1
    alert = offload[0]
    assert alert["model"] == "qwen3:30b" and alert["server"] == fake_ollama.url
    evidence = alert["evidence"]
    assert evidence["cpu_share"] == pytest.approx(0.52, abs=0.005)
    full, split = evidence["expected_full_gpu_tok_s"], evidence["expected_split_tok_s"]
    assert full and split and split < full / 2
    assert "52 %" in alert["message"]
    # a computed fix: a quantization / context that fits, or what to unload; with its commands (#20)
    assert "fits" in alert["fix"]["text"] and isinstance(alert["fix"]["commands"], list)
    for key in ("id", "severity", "since", "message"):
        assert alert[key]
    assert alert["since"].endswith("Z")


def test_odd_ollama_sizes_give_unknown_placement_and_no_offload_alert(fake_ollama: FakeOllama) -> None:
    """`size == 0` (`ollama ps` shows it as unknown) and `size_vram > size` are no GPU share."""
    fake_ollama.load("llama3.1:8b")
    fake_ollama.load("qwen3:30b")
    fake_ollama.set_sizes("llama3.1:8b", size=0, size_vram=6294446080)
    fake_ollama.set_sizes("qwen3:30b", size=22187335680, size_vram=22187335680 + 1_000_000_000)
    result = run_cli(
        "status", "--json", "--endpoint", f"ollama={fake_ollama.url}", "--no-discover", "--gpu", "RTX 4090"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    models = {m["name"]: m for m in data["servers"][0]["models"]}
    assert models["llama3.1:8b"]["gpu_fraction"] is None
    assert models["qwen3:30b"]["gpu_fraction"] is None
    assert [a for a in data["alerts"] if a["kind"] == "offload"] == []


def test_status_with_nothing_running_says_so() -> None:
    result = run_cli("status", "--endpoint", "http://127.0.0.1:9", "--no-discover")
    assert result.returncode == 0, result.stderr
    assert "unreachable" in result.stdout


def test_tray_without_a_display_says_what_to_use_instead() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "--no-discover"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1
    assert "no graphical display" in result.stderr and "llm-tray agent" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_name_cannot_drive_the_terminal(fake_ollama: FakeOllama) -> None:
    """#25: a server names its model with terminal escapes (retitle, clear, OSC 52 clipboard write)."""
    hostile = "evil\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07"
    fake_ollama.load(hostile, size=1_000_000, size_vram=1_000_000, context_length=4096)
    result = run_cli("status", "--endpoint", f"ollama={fake_ollama.url}", "--no-discover")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "evil\\x1b]0;pwned\\x07" in result.stdout  # shown, not obeyed
