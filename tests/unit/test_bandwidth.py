"""The physics check on the RAM bandwidth: a CPU decode rate × bytes per token never exceeds it."""

from __future__ import annotations

import math

import pytest

from trayapp.core.bandwidth import bandwidth_contradicted, contradicting_model, ram_bandwidth_note
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.model import ModelStatus, ServerStatus, Snapshot

HALF_GB = 500_000_000


@pytest.mark.parametrize(
    ("tok_s", "bytes_per_token", "gbps", "expected"),
    [
        (40.0, HALF_GB, 13.0, True),  # 40 × 0.5 GB = 20 GB/s > 13 × 1.1 = 14.3 GB/s
        (30.0, HALF_GB, 13.0, True),  # 15 GB/s > 14.3 GB/s
        (27.0, HALF_GB, 13.0, False),  # 13.5 GB/s: above 13, inside the 10 % tolerance (14.3)
        (24.0, HALF_GB, 13.0, False),  # 12 GB/s < 13 GB/s: physically fine
        (40.0, HALF_GB, 20.0, False),  # exactly the bandwidth
        (None, HALF_GB, 13.0, False),
        (40.0, None, 13.0, False),
        (40.0, HALF_GB, None, False),
        (0.0, HALF_GB, 13.0, False),
        (math.nan, HALF_GB, 13.0, False),
        (40.0, HALF_GB, math.inf, False),
    ],
)
def test_contradiction_rule(
    tok_s: float | None, bytes_per_token: float | None, gbps: float | None, expected: bool
) -> None:
    assert bandwidth_contradicted(tok_s, bytes_per_token, gbps) is expected


def test_tolerance_can_be_tightened() -> None:
    # 13.5 GB/s against 13 GB/s: contradicted once no tolerance is allowed
    assert bandwidth_contradicted(27.0, HALF_GB, 13.0, tolerance=1.0)


def _model(**kw: object) -> ModelStatus:
    fields: dict[str, object] = {
        "name": "qwen-0.5b",
        "phase": "decoding",
        "gpu_fraction": 0.0,
        "bytes_per_token": HALF_GB,
        "bytes_per_token_exact": True,
        "decode_tok_s": 40.0,
    }
    fields.update(kw)
    return ModelStatus(**fields)  # type: ignore[arg-type]


def _snapshot(
    model: ModelStatus, url: str = "http://127.0.0.1:8080", gpus: tuple[GpuReading, ...] = ()
) -> Snapshot:
    server = ServerStatus(kind="llamacpp", url=url, status="ok", models=(model,))
    host = HostReading(ram_total_bytes=None, ram_available_bytes=None, ram_bandwidth_gbps=13.0)
    return Snapshot(t_wall_s=0.0, t_mono_s=0.0, servers=(server,), hardware=HardwareSnapshot(gpus, host))


GPU = GpuReading(0, "RTX 4090", "nvidia", 24 * 2**30, 2**30, 1008.0, "nvml")


def test_a_cpu_model_decoding_too_fast_contradicts_the_figure() -> None:
    model = _model()
    assert contradicting_model(_snapshot(model), 13.0) is model
    assert contradicting_model(_snapshot(model), 20.0) is None  # 20 GB/s needed, 20 measured


def test_the_last_rate_counts_while_idle() -> None:
    model = _model(phase="idle", decode_tok_s=None, last_decode_tok_s=40.0)
    assert contradicting_model(_snapshot(model), 13.0) is model


@pytest.mark.parametrize(
    ("model", "url", "gpus"),
    [
        (_model(gpu_fraction=0.5), "http://127.0.0.1:8080", (GPU,)),  # half on a GPU: not a RAM bound
        (_model(gpu_fraction=None), "http://127.0.0.1:8080", (GPU,)),  # split unknown
        (_model(bytes_per_token_exact=False), "http://127.0.0.1:8080", ()),  # a size estimate may overstate
        (_model(draft_acceptance=0.7), "http://127.0.0.1:8080", ()),  # several tokens per weight read
        (_model(), "http://192.168.1.20:8080", ()),  # another machine's RAM
    ],
)
def test_only_true_lower_bounds_count(model: ModelStatus, url: str, gpus: tuple[GpuReading, ...]) -> None:
    assert contradicting_model(_snapshot(model, url, gpus), 13.0) is None


def test_no_gpu_means_the_model_runs_from_ram_whatever_its_split() -> None:
    model = _model(gpu_fraction=None)
    assert contradicting_model(_snapshot(model), 13.0) is model


def test_ram_bandwidth_note_says_when_and_how_far_to_trust() -> None:
    # 1,000,000 s after the epoch = 11 days 13:46:40 → 1970-01-12 13:46 UTC
    host = HostReading(
        None,
        None,
        13.2,
        "measured",
        ram_bandwidth_measured_wall_s=1_000_000.0,
        ram_bandwidth_confidence="provisional",
    )
    assert ram_bandwidth_note(host) == "measured 1970-01-12 13:46 UTC, provisional: the machine was busy"
    quiet = HostReading(
        None, None, 13.2, "measured", ram_bandwidth_measured_wall_s=0.0, ram_bandwidth_confidence="quiet"
    )
    assert ram_bandwidth_note(quiet) == "measured 1970-01-01 00:00 UTC, quiet"
    assert ram_bandwidth_note(HostReading(None, None, 60.0, "given")) == "given"
