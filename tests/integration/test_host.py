"""Real psutil readings, a real (short) RAM bandwidth measurement, its cache, and HardwareProbe."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trayapp.core.hardware_readings import GpuReading
from trayapp.sources.gpu import AppleProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.hardware import HardwareProbe
from trayapp.sources.host import HostProbe
from trayapp.sources.ram_bandwidth import cached_ram_bandwidth, measure_ram_bandwidth_gbps
from trayapp.sources.rambench import last_level_cache_bytes

GIB = 2**30


def test_host_probe_reads_sane_values() -> None:
    reading = HostProbe().read(54.0, "measured")
    assert reading.ram_total_bytes is not None and reading.ram_total_bytes > 256 * 2**20
    assert (
        reading.ram_available_bytes is not None and 0 < reading.ram_available_bytes <= reading.ram_total_bytes
    )
    assert reading.cpu_count is not None and reading.cpu_count >= 1
    assert reading.cpu_percent is not None and 0 <= reading.cpu_percent <= 100
    assert (reading.ram_bandwidth_gbps, reading.ram_bandwidth_source) == (54.0, "measured")
    unknown = HostProbe().read()
    assert unknown.ram_bandwidth_gbps is None and unknown.ram_bandwidth_source == "unknown"


def test_last_level_cache_is_read_or_defaults(tmp_path: Path) -> None:
    assert last_level_cache_bytes() >= 2**20
    for level, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "32768K")):
        (tmp_path / level).mkdir()
        (tmp_path / level / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 * 2**20
    assert last_level_cache_bytes(tmp_path / "absent") == 32 * 2**20


def test_real_ram_bandwidth_measurement_is_plausible() -> None:
    gbps = measure_ram_bandwidth_gbps(budget_s=0.2)
    assert 1 < gbps < 2000


def test_cache_round_trips_without_measuring_again(tmp_path: Path) -> None:
    cache = tmp_path / "sub" / "ram_bandwidth.json"
    calls: list[int] = []

    def measure() -> float:
        calls.append(1)
        return 54.3

    first = cached_ram_bandwidth(cache, measure=measure, now_s=1_000_000.0)
    assert first == (54.3, "measured", 1_000_000.0)
    stored = json.loads(cache.read_text())
    assert stored["gbps"] == 54.3 and stored["date"].startswith("1970-01-12")
    second = cached_ram_bandwidth(cache, measure=measure, now_s=1_000_000.0 + 3600)
    assert second == (54.3, "measured", 1_000_000.0)
    assert len(calls) == 1


def test_a_week_old_figure_is_not_measured_again(tmp_path: Path) -> None:
    """A stored figure never expires (#24: a ceiling that does not wander): only evidence re-measures."""
    cache = tmp_path / "ram_bandwidth.json"
    cached_ram_bandwidth(cache, measure=lambda: 40.0, now_s=0.0)
    kept = cached_ram_bandwidth(cache, measure=lambda: 50.0, now_s=8 * 86400)
    assert kept == (40.0, "measured", 0.0)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '"54"',
        '{"gbps": "fast", "measured_wall_s": 0}',
        '{"gbps": -3, "measured_wall_s": 0}',
        '{"gbps": NaN, "measured_wall_s": 0}',
        "",
    ],
)
def test_corrupt_cache_is_measured_again(tmp_path: Path, content: str) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    cache.write_text(content)
    assert cached_ram_bandwidth(cache, measure=lambda: 61.0, now_s=100.0) == (61.0, "measured", 100.0)
    assert json.loads(cache.read_text())["gbps"] == 61.0


def test_cache_from_another_machine_is_measured_again(tmp_path: Path) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    cached_ram_bandwidth(cache, measure=lambda: 40.0, now_s=0.0)
    record = json.loads(cache.read_text())
    record["fingerprint"]["cpu_count"] = (os.cpu_count() or 1) + 64
    cache.write_text(json.dumps(record))
    assert cached_ram_bandwidth(cache, measure=lambda: 70.0, now_s=10.0)[0] == 70.0


def test_real_measurement_through_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    gbps, source, _ = cached_ram_bandwidth(cache, measure=lambda: measure_ram_bandwidth_gbps(budget_s=0.1))
    assert source == "measured" and 1 < gbps < 2000
    assert cached_ram_bandwidth(cache, measure=lambda: -1.0)[0] == gbps


# --------------------------------------------------------------------------- HardwareProbe


class FakeGpuProbe:
    def __init__(self, gpus: tuple[GpuReading, ...] = (), reason: str | None = None) -> None:
        self.gpus = gpus
        self.reason = reason
        self.closed = False

    def read(self) -> tuple[GpuReading, ...]:
        return self.gpus

    def close(self) -> None:
        self.closed = True


def _gpu(name: str, vendor: str, index: int = 0) -> GpuReading:
    return GpuReading(index, name, vendor, 24 * GIB, GIB, 1008.0, "nvml")


def test_hardware_probe_combines_gpus_and_host() -> None:
    nvidia = FakeGpuProbe((_gpu("RTX 4090", "nvidia", 0), _gpu("RTX 3090", "nvidia", 1)))
    amd = FakeGpuProbe((_gpu("RX 7900 XTX", "amd", 0),))
    probe = HardwareProbe(nvidia, amd, FakeGpuProbe(), HostProbe())
    snap = probe.read()
    assert [(g.index, g.name) for g in snap.gpus] == [(0, "RTX 4090"), (1, "RTX 3090"), (2, "RX 7900 XTX")]
    assert snap.gpu_reason is None
    assert snap.host.ram_total_bytes and snap.host.ram_bandwidth_gbps is None
    probe.close()
    assert nvidia.closed and amd.closed


def test_hardware_probe_says_why_there_is_no_gpu(tmp_path: Path) -> None:
    nvidia = FakeGpuProbe(reason="NVML library not found: no NVIDIA driver")
    probe = HardwareProbe(nvidia, AmdSysfsProbe(tmp_path), AppleProbe(platform="linux"), HostProbe())
    snap = probe.read()
    assert snap.gpus == ()
    assert snap.gpu_reason == "NVML library not found: no NVIDIA driver; no AMD GPU in sysfs"


def test_ram_bandwidth_is_set_by_the_caller() -> None:
    probe = HardwareProbe(
        FakeGpuProbe(), FakeGpuProbe(), FakeGpuProbe(), HostProbe(), ram_bandwidth_gbps=30.0
    )
    assert probe.read().host.ram_bandwidth_gbps == 30.0
    probe.set_ram_bandwidth(54.2, "measured")
    host = probe.read().host
    assert (host.ram_bandwidth_gbps, host.ram_bandwidth_source) == (54.2, "measured")
    probe.set_ram_bandwidth(89.6, "spec")
    assert probe.read().host.ram_bandwidth_source == "spec"


def test_hardware_probe_with_the_real_probes_on_this_machine() -> None:
    probe = HardwareProbe(ram_bandwidth_gbps=50.0)
    try:
        snap = probe.read()
    finally:
        probe.close()
    assert snap.host.ram_total_bytes and snap.host.ram_bandwidth_gbps == 50.0
    assert bool(snap.gpus) != bool(snap.gpu_reason)
