"""One ceiling rule (`placement.ceiling_for`): `llm-tray ceiling`, `status --json` and the dashboard's
`ModelStatus` give the same ceiling for the same model on the same unified-memory machine, where a
GPU share (reported by a server, or given on the command line) does not apply: one memory."""

from __future__ import annotations

import json

import pytest

from trayapp.cli.ceiling import build_ceiling_report
from trayapp.cli.main import main
from trayapp.core.hardware_readings import HardwareProfile, HardwareSnapshot, HostReading
from trayapp.core.jsonview import snapshot_json
from trayapp.core.machine import Machine, resolve_machine
from trayapp.core.model import ModelFacts, ModelReading, ModelStatus, ServerReading, SlotReading
from trayapp.core.modelfacts import facts_from_params, kv_layout_from_metadata
from trayapp.core.pipeline import Pipeline
from trayapp.sources.hwtable import gpu_lookup

URL = "http://127.0.0.1:8080"
WALL0 = 1_800_000_000.0
# `llm-tray ceiling --gpu "Apple M2 Max" --vram-gb 32 --ram-bandwidth-gbps 60`: the machine the CLI
# builds from its options, with no probe (the GPU table gives the M2 Max's 400 GB/s, Apple's figure).
M2_MAX = HardwareProfile(gpu_name="Apple M2 Max", vram_bytes=32 * 10**9, ram_bandwidth_gbps=60.0)
NO_GPU_READ = HardwareSnapshot(gpus=(), host=HostReading(None, None, 60.0, "given"))
# A llama-8B-like layout: 32 layers × 8 KV heads × 128 dims × (K + V) × 2 bytes (f16) = 131,072 B/token.
LLAMA_KV = kv_layout_from_metadata(
    {
        "general.architecture": "llama",
        "llama.block_count": 32,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.embedding_length": 4096,
    }
)


def live_status(facts: ModelFacts, machine: Machine, context_tokens: int) -> tuple[ModelStatus, dict]:
    """The model as the tray shows it (the dashboard's `ModelStatus`) and as `status --json` prints it:
    a server that reports half the model in GPU memory (size 6 GB, 3 GB of it in VRAM), decoding at
    `context_tokens`."""
    slot = SlotReading(0, True, task_id=1, n_decoded=8, context_tokens=context_tokens, n_ctx=8192)
    model = ModelReading(
        name="m", facts=facts, size_bytes=6 * 10**9, vram_bytes=3 * 10**9, context_length=8192, slots=(slot,)
    )
    reading = ServerReading(kind="llamacpp", url=URL, status="ok", models=(model,))
    snapshot = Pipeline(one_shot=True).process([reading], NO_GPU_READ, {}, machine, 1.0, WALL0).snapshot
    (status,) = snapshot.servers[0].models
    (entry,) = snapshot_json(snapshot)["servers"][0]["models"]
    return status, entry


def test_the_ceiling_command_status_json_and_the_dashboard_agree_on_unified_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["ceiling", "--weights-gb", "4.9", "--gpu", "Apple M2 Max", "--vram-gb", "32"]
    argv += ["--ram-bandwidth-gbps", "60", "--gpu-fraction", "0.5", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    command = report["ceiling_tok_s"]
    assert report["gpu_fraction"] == 1.0  # not "50 % on the GPU, the rest in RAM"

    machine = resolve_machine(NO_GPU_READ, M2_MAX, gpu_lookup)
    assert machine.unified_memory and machine.fast_bandwidth_gbps == 400.0
    status, entry = live_status(facts_from_params(None, weights_gb=4.9), machine, 4096)
    assert status.gpu_fraction == 0.5  # what the server says; one memory all the same

    full = 400e9 / 4.9e9  # 81.63 tok/s: all bytes at 400 GB/s (no KV layout known: weights only)
    assert command == pytest.approx(full)
    assert status.ceiling_tok_s == pytest.approx(full)
    assert entry["ceiling_tok_s"] == pytest.approx(full, abs=0.005)  # the JSON rounds to 0.01


def test_with_a_kv_layout_the_three_agree_at_the_live_context() -> None:
    facts = ModelFacts(
        weights_bytes=4_900_000_000, bytes_per_token=4_900_000_000, exact=True, source="gguf", kv=LLAMA_KV
    )
    machine = resolve_machine(NO_GPU_READ, M2_MAX, gpu_lookup)
    status, entry = live_status(facts, machine, 4096)
    report = build_ceiling_report(facts, machine, context_tokens=4096, gpu_fraction=0.5)

    at_4096 = 400e9 / (4.9e9 + 4096 * 131_072)  # 73.57 tok/s: weights + 512 MiB of KV per token
    assert report["ceiling_tok_s"] == pytest.approx(at_4096)
    assert status.context_tokens == 4096
    assert status.ceiling_tok_s == pytest.approx(at_4096)
    assert entry["ceiling_tok_s"] == pytest.approx(at_4096, abs=0.005)
