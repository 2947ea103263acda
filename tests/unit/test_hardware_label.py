"""The hardware label sessions, baselines and benches are compared on: the machine, not a
measurement of it. A CPU-only machine's RAM bandwidth is measured, and measured again (a quieter
moment, another process's higher figure); when the figure was part of the label, each new figure
orphaned every baseline and bench stored under the earlier one, and `regression` went silent (two
CI runs on a busy host: a bench baseline lost mid-session, a regression never raised)."""

from __future__ import annotations

from tests.support.snapshots import hardware_snapshot, rtx4090
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.machine import CPU_ONLY_LABEL, resolve_machine
from trayapp.core.pipeline import hardware_label


def test_a_cpu_machine_keeps_its_label_when_its_ram_bandwidth_is_measured_again() -> None:
    busy = resolve_machine(hardware_snapshot(ram_bandwidth_gbps=20.3, ram_bandwidth_source="measured"))
    quiet = resolve_machine(hardware_snapshot(ram_bandwidth_gbps=33.9, ram_bandwidth_source="measured"))
    assert busy.fast_bandwidth_gbps == 20.3 and quiet.fast_bandwidth_gbps == 33.9  # the ceiling follows it
    assert hardware_label(busy) == hardware_label(quiet) == "CPU (system RAM)" == CPU_ONLY_LABEL


def test_a_given_or_table_bandwidth_is_part_of_the_label() -> None:
    profile = HardwareProfile(ram_bandwidth_gbps=90.0)
    given = resolve_machine(hardware_snapshot(ram_bandwidth_gbps=20.3), profile)
    assert hardware_label(given) == "CPU (system RAM) @ 90 GB/s"  # the user's description of it
    gpu = resolve_machine(hardware_snapshot(rtx4090(bandwidth_source="table")))
    assert hardware_label(gpu) == "NVIDIA GeForce RTX 4090 @ 1008 GB/s"
    described = resolve_machine(None, HardwareProfile(gpu_name="given box", bandwidth_gbps=400.0))
    assert hardware_label(described) == "given box @ 400 GB/s"
