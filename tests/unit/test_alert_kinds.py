"""The alert-kind table is read, not just written: every kind has a row, `suppressed_by` is the one
root-cause rule (per model, and across models for the GPU-wide `vram_pressure`), the default mutes
come from `muted_by_default` while a user's list is kept, and a remote agent's unknown kind is
left out rather than breaking its machine's document."""

from __future__ import annotations

from typing import get_args

import pytest

from trayapp.config.settings import parse_settings
from trayapp.core.alert_kinds import ALERT_KINDS, DEFAULT_MUTED_KINDS, AlertKindName
from trayapp.core.diagnose import without_explained
from trayapp.core.diagnosis_tracker import DiagnosisTracker, ServerDiagnosisInput
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.machine import Machine
from trayapp.core.model import Finding, ModelStatus, ServerStatus
from trayapp.core.remote_snapshot import snapshot_from_json
from trayapp.core.thresholds import Thresholds

GB = 10**9
GPU = Machine("Test GPU", 1000.0, 24 * GB, 50.0, has_gpu=True)


def test_every_kind_name_has_its_row() -> None:
    assert list(ALERT_KINDS) == list(get_args(AlertKindName))
    assert all(name == kind.name for name, kind in ALERT_KINDS.items())


def finding(kind: AlertKindName, model: str | None = "m") -> Finding:
    return Finding(kind, "warning", "http://127.0.0.1:8080", model, "message", "fix")


@pytest.mark.parametrize(
    ("found", "kept"),
    [
        # An offload explains "slow", "inefficient" and "slower than its baseline".
        (
            {"offload", "below_floor", "low_efficiency", "regression", "context_full"},
            {"offload", "context_full"},
        ),
        # A drafter that costs speed explains "slow" and "inefficient", not a regression.
        (
            {"draft_acceptance", "below_floor", "low_efficiency", "regression"},
            {"draft_acceptance", "regression"},
        ),
        ({"below_floor", "low_efficiency", "regression"}, {"below_floor", "low_efficiency", "regression"}),
    ],
)
def test_one_root_cause_per_model(found: set[AlertKindName], kept: set[str]) -> None:
    findings = [finding(kind) for kind in sorted(found)]
    assert {f.kind for f in without_explained(findings, found)} == kept


def spilled_model_and_a_full_gpu(local: bool) -> set[str]:
    """A model half on the CPU (an offload), on this machine or another, while this machine's GPU
    has 0.5 of 24 GB free (2 %, under the 5 % mark)."""
    model = ModelStatus(name="m", phase="idle", gpu_fraction=0.5, size_bytes=30 * GB, vram_bytes=15 * GB)
    server = ServerStatus(kind="ollama", url="http://box:11434", status="ok", models=(model,))
    gpu = GpuReading(0, "Test GPU", "nvidia", 24 * GB, 24 * GB - GB // 2, 1000.0)
    hardware = HardwareSnapshot(gpus=(gpu,), host=HostReading(None, None, 50.0))
    tracker = DiagnosisTracker(Thresholds())
    inputs = [ServerDiagnosisInput(server, (), GPU, local)]
    diagnosis = tracker.update(inputs, hardware, {}, now_wall_s=1_000_000.0)
    return {f.kind for f in diagnosis.findings}


def test_a_local_offload_explains_the_full_gpu_a_remote_one_does_not() -> None:
    assert spilled_model_and_a_full_gpu(local=True) == {"offload"}
    assert spilled_model_and_a_full_gpu(local=False) == {"offload", "vram_pressure"}


def test_default_mutes_come_from_the_table_and_a_users_list_is_kept() -> None:
    assert DEFAULT_MUTED_KINDS == ()  # no kind is muted by default today
    default, errors = parse_settings({})
    assert errors == [] and default.notifications.muted_kinds == DEFAULT_MUTED_KINDS
    chosen, errors = parse_settings({"notifications": {"muted_kinds": ["cold_load", "offload"]}})
    assert errors == [] and chosen.notifications.muted_kinds == ("cold_load", "offload")


def test_a_remote_alert_of_an_unknown_kind_is_left_out() -> None:
    alert = {"id": "a-1", "severity": "warning", "server": "http://x:8080", "since": "2026-11-30T09:16:53Z"}
    doc = {
        "schema": 1,
        "t": 1_800_000_000.0,
        "servers": [],
        "hardware": {"gpus": []},
        "alerts": [{**alert, "kind": "offload"}, {**alert, "id": "b-1", "kind": "truncation"}],
    }
    (kept,) = snapshot_from_json(doc).alerts
    assert (kept.id, kept.kind) == ("a-1", "offload")
