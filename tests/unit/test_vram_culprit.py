"""Who took the VRAM (#21): a fake NVIDIA machine where another process holds 5.8 GB while a model loads.

NVML is the real nvidia-ml-py over a fake driver (tests/support/nvml_driver.py): pynvml's own
`c_nvmlProcessInfo_v3_t` arrays, NVML_VALUE_NOT_AVAILABLE and error codes. Every expected figure is
worked by hand below (DOMAIN.md §1–2; the core's planning overhead, physics.py: 0.5 GiB + 2 % of the
weights); none is computed by calling the product code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pynvml
import pytest

from tests.support.nvml_driver import DriverGpu, FakeNvmlDriver
from trayapp.core.hardware_readings import GpuProcess, HardwareSnapshot, HostReading
from trayapp.core.jsonview import alert_json
from trayapp.core.machine import resolve_machine
from trayapp.core.model import Alert, KvLayout, ModelFacts, ModelReading, ServerReading, Snapshot
from trayapp.core.pipeline import Pipeline
from trayapp.core.thresholds import Thresholds
from trayapp.core.vram_holders import OTHER_USER, VramHolder, holders_from_evidence, holders_text
from trayapp.sinks.store import Store
from trayapp.sources.gpu import NvmlProbe

URL = "http://127.0.0.1:8080"
SERVER_PID = 3000  # llama-server
PYTHON_PID = 4121  # someone's PyTorch notebook
XORG_PID = 900
CAPACITY = 12_884_901_888  # RTX 3060 12GB: 12 GiB, as NVML reports it
WALL0 = 1_750_000_000.0
NAMES = {SERVER_PID: "llama-server", PYTHON_PID: "python", XORG_PID: "Xorg"}

# A 40-layer model: 9.0 GB of weights (all read per token), 8 KV heads × (128 + 128) per layer:
# 40 × 8 × 256 = 81_920 KV elements per token, 2 B each in f16 = 163_840 B per token.
FACTS = ModelFacts(
    weights_bytes=9_000_000_000,
    bytes_per_token=9_000_000_000,
    exact=True,
    source="gguf",
    quantization="Q5_K_M",
    parameter_count=12_250_000_000,
    kv=KvLayout(full_elems_per_token=81_920, n_layers=40),
)
CONTEXT = 8192
# What the model needs (the placement's rule): weights 9_000_000_000 + KV 8192 × 163_840 = 1_342_177_280
# + 0.5 GiB 536_870_912 + 2 % of the weights 180_000_000 = 11_059_048_192 B.
# llama-server, placed beside python's 5.8 GB, holds 6_600_000_000 B of it:
# share 6_600_000_000 / 11_059_048_192 = 0.59680 → 0.59680 × 40 = 23.87 → 24 layers on the GPU, 16 on the CPU.
SERVER_HELD = 6_600_000_000
PYTHON_HELD = 5_800_000_000
XORG_HELD = 200_000_000
RAM_GBPS = 60.0
# Ceilings (RTX 3060: 360 GB/s, hardware table; RAM 60 GB/s), empty context:
# now: 1 / (0.59680 × 9e9 / 360e9 + 0.40320 × 9e9 / 60e9) = 1 / (0.014920 + 0.060480) = 13.26 tok/s;
# python closed: capacity 12_884_901_888 − Xorg's 200_000_000 = 12_684_901_888 ≥ 11_059_048_192: all 40 layers
# fit, share 1.0 → 360e9 / 9e9 = 40.0 tok/s.
SPLIT_TOK_S = 13.26
CLOSED_TOK_S = 40.0


def host() -> HostReading:
    return HostReading(64 * 2**30, 40 * 2**30, RAM_GBPS, "measured", cpu_percent=10.0, cpu_count=8)


def reading(loading: bool = False) -> ServerReading:
    model = ModelReading(
        name="Mistral-Nemo-12B-Q5_K_M.gguf",
        loading=loading,
        weights_bytes=FACTS.weights_bytes,
        context_length=CONTEXT,
        quantization="Q5_K_M",
        facts=FACTS,
    )
    return ServerReading(
        kind="llamacpp",
        url=URL,
        status="loading" if loading else "ok",
        version="b6500",
        models=(model,),
        pid=SERVER_PID,
    )


def gpu(compute: Sequence[tuple[int, int | None]], graphics: list[tuple[int, int | None]]) -> DriverGpu:
    used = sum(b or 0 for _, b in [*compute, *graphics]) + 300_000_000  # + the driver's own reserve
    return DriverGpu("NVIDIA GeForce RTX 3060", CAPACITY, used, list(compute), graphics)


def test_the_offload_alert_names_the_process_that_held_the_vram_and_what_closing_it_gives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    desktop: list[tuple[int, int | None]] = [(XORG_PID, XORG_HELD)]
    driver = FakeNvmlDriver([gpu([(SERVER_PID, 2_000_000_000), (PYTHON_PID, PYTHON_HELD)], desktop)])
    driver.install(monkeypatch)
    probe = NvmlProbe(pynvml, name_of_pid=NAMES.get)
    pipeline = Pipeline(Thresholds())
    alerts: list[tuple[Alert, ...]] = []
    snapshots: list[Snapshot] = []

    def tick(t: float, loading: bool = False) -> None:
        hw = HardwareSnapshot(probe.read(), host())
        out = pipeline.process([reading(loading)], hw, {}, resolve_machine(hw), t, WALL0 + t)
        alerts.append(out.snapshot.alerts)
        snapshots.append(out.snapshot)

    tick(1.0, loading=True)  # loading: python already holds 5.8 GB
    driver.gpus = [gpu([(SERVER_PID, SERVER_HELD), (PYTHON_PID, PYTHON_HELD)], desktop)]
    tick(2.0)  # placed: 24 of 40 layers fit beside python
    tick(3.0)
    driver.gpus = [gpu([(SERVER_PID, SERVER_HELD)], desktop)]  # python exits; the model stays spilled
    tick(4.0)

    (offload,) = [a for a in alerts[-1] if a.kind == "offload"]
    # vram_pressure is part of the offload story; cold_load is the load itself.
    assert sorted(a.kind for a in alerts[-1]) == ["cold_load", "offload"]
    # The holders are those of the moment it was placed (tick 2), not of now (python gone):
    # 5_800_000_000 + 200_000_000 = 6.0 GB held by others of 12_884_901_888 (12.9 GB).
    assert offload.cause == (
        "About 16 of 40 layers are on the CPU: 6.0 GB of the 12.9 GB of GPU memory was held by other "
        "processes when it was placed — python (pid 4121) 5.8 GB, Xorg 0.2 GB."
    )
    assert offload.cause in offload.message
    assert offload.fix.startswith(
        "Close python (pid 4121), which holds 5.8 GB, and reload the model: 16 more layers on the GPU "
        "(all 40), a decode ceiling of ~40 tok/s instead of ~13 tok/s"
    )
    ev = offload.evidence
    assert ev["gpu_fraction"] == pytest.approx(0.5968, abs=1e-4)
    assert ev["expected_split_tok_s"] == pytest.approx(SPLIT_TOK_S, abs=0.01)
    assert ev["closing_ceiling_tok_s"] == pytest.approx(CLOSED_TOK_S)
    assert ev["closing_gpu_fraction"] == 1.0
    assert ev["closing_layers_on_gpu"] == 40 and ev["n_layers"] == 40
    assert ev["vram_holders_at_wall_s"] == WALL0 + 2.0
    assert ev["vram_held_by_others_bytes"] == PYTHON_HELD + XORG_HELD
    # status --json carries the holders, and they read back.
    doc = alert_json(offload)
    assert doc["evidence"]["vram_holders"] == [
        {"pid": PYTHON_PID, "name": "python", "used_bytes": PYTHON_HELD, "gpu_index": 0},
        {"pid": XORG_PID, "name": "Xorg", "used_bytes": XORG_HELD, "gpu_index": 0},
    ]
    assert holders_from_evidence(doc["evidence"]) == (
        VramHolder(PYTHON_PID, "python", PYTHON_HELD),
        VramHolder(XORG_PID, "Xorg", XORG_HELD),
    )
    # The store keeps the snapshot with the episode (the alerts row's evidence_json).
    with Store(tmp_path / "store.sqlite3") as store:
        for snapshot in snapshots:
            store.record(snapshot)
        (stored,) = [a for a in store.alerts_between(WALL0, None) if a["kind"] == "offload"]
    assert stored["alert_id"] == offload.id
    evidence = stored["evidence"]
    assert isinstance(evidence, dict) and evidence["vram_holders_at_wall_s"] == WALL0 + 2.0
    assert holders_from_evidence(evidence)[0] == VramHolder(PYTHON_PID, "python", PYTHON_HELD)


def test_wddm_sizes_are_unavailable_never_zero_and_old_cards_fall_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML_VALUE_NOT_AVAILABLE (WDDM) reads as None and shows "unavailable"; a card that does not list
    graphics processes (NVMLError_NotSupported) still lists compute ones; a driver without the _v3
    calls is read through _v2."""
    lacks = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")
    driver = FakeNvmlDriver(
        [
            DriverGpu(
                "NVIDIA GeForce GTX 1080",
                8 * 2**30,
                3 * 2**30,
                [(SERVER_PID, None), (77, 1_500_000_000)],
                None,
            )
        ],
        lacks=lacks,
    )
    driver.install(monkeypatch)
    names = {SERVER_PID: "llama-server.exe", 77: OTHER_USER}
    (reading_,) = NvmlProbe(pynvml, name_of_pid=names.get).read()
    assert reading_.processes == (
        GpuProcess(77, OTHER_USER, 1_500_000_000),
        GpuProcess(SERVER_PID, "llama-server.exe", None),
    )
    text = holders_text([VramHolder(p.pid, p.name, p.used_bytes) for p in reading_.processes])
    assert text == "another user's process (pid 77) 1.5 GB, llama-server.exe unavailable"


def test_closing_one_of_two_holders_gives_back_part_of_the_model() -> None:
    """closing_gain when what is left still does not hold it all, by hand: python (5.8 GB) closed, a
    second 2.0 GB holder kept: 12_884_901_888 − 2_000_000_000 = 10_884_901_888 B for the model. The
    placement's split rule (physics.auto_gpu_fraction): f × (weights × 1.02 + KV) + 0.5 GiB ≤ room →
    f = (10_884_901_888 − 536_870_912) / (9_180_000_000 + 1_342_177_280) = 10_348_030_976 / 10_522_177_280
    = 0.98345 → 0.98345 × 40 = 39.34 → 39 layers; ceiling 1 / (0.98345 × 9e9 / 360e9 + 0.01655 × 9e9 /
    60e9) = 1 / (0.024586 + 0.002483) = 36.94 tok/s."""
    from trayapp.core.machine import Machine
    from trayapp.core.vram_holders import closing_gain

    machine = Machine("RTX 3060", 360.0, CAPACITY, RAM_GBPS, has_gpu=True)
    gain = closing_gain(FACTS, CONTEXT, None, machine, 0.5968, PYTHON_HELD, PYTHON_HELD + 2_000_000_000)
    assert gain is not None
    assert gain.gpu_fraction == pytest.approx(0.98345, abs=1e-5)
    assert (gain.layers_on_gpu_now, gain.layers_on_gpu, gain.n_layers) == (24, 39, 40)
    assert gain.ceiling_tok_s == pytest.approx(36.94, abs=0.01)
    # Nothing freed, or no better than now: no gain to offer.
    assert closing_gain(FACTS, CONTEXT, None, machine, 0.5968, 0, PYTHON_HELD) is None
    assert closing_gain(FACTS, CONTEXT, None, machine, 1.0, PYTHON_HELD, PYTHON_HELD) is None
