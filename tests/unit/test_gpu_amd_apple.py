"""AmdSysfsProbe on a fake sysfs tree; AppleProbe on recorded-looking command outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.fake_gpu_machines import GIB, RX_7900_XTX, FakeMac, host_memory, make_card
from trayapp.sources.gpu import AppleProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe

HWMON = {"temp1_input": "64000", "power1_average": "285000000", "power1_cap": "355000000"}


def test_amdgpu_card_readings(tmp_path: Path) -> None:
    make_card(tmp_path, "card1", "amdgpu", RX_7900_XTX, HWMON)
    (tmp_path / "class" / "drm" / "card1-DP-1").mkdir()  # connectors are not cards
    probe = AmdSysfsProbe(tmp_path)
    (gpu,) = probe.read()
    assert probe.reason is None
    assert gpu.vendor == "amd"
    assert gpu.name == "AMD Radeon RX 7900 XTX"
    assert gpu.vram_total_bytes == 24 * GIB
    assert gpu.vram_used_bytes == 3 * GIB + 512
    assert gpu.util_gpu_pct == 87
    assert gpu.util_mem_pct == 41
    assert gpu.temperature_c == 64.0  # m°C -> °C
    assert gpu.power_w == pytest.approx(285.0)  # µW -> W
    assert gpu.bandwidth_gbps == 960
    assert gpu.bandwidth_source == "table"
    assert (gpu.pcie_max_gen, gpu.pcie_max_width) == (4, 16)
    assert not gpu.unified_memory


def test_other_drivers_are_skipped_and_cards_are_numbered(tmp_path: Path) -> None:
    make_card(tmp_path, "card0", "i915", {"vendor": "0x8086"})
    make_card(tmp_path, "card2", "nvidia", {"vendor": "0x10de"})
    no_name = {k: v for k, v in RX_7900_XTX.items() if k != "product_name"}
    make_card(tmp_path, "card1", "amdgpu", no_name)
    (gpu,) = AmdSysfsProbe(tmp_path).read()
    assert gpu.index == 0
    assert gpu.name == "AMD GPU 0x744c"  # consumer cards carry no product_name
    assert gpu.bandwidth_gbps is None and gpu.bandwidth_source == "unknown"
    assert gpu.temperature_c is None and gpu.power_w is None  # no hwmon directory


def test_power_input_is_used_when_there_is_no_average(tmp_path: Path) -> None:
    make_card(tmp_path, "card0", "amdgpu", RX_7900_XTX, {"power1_input": "120500000"})
    (gpu,) = AmdSysfsProbe(tmp_path).read()
    assert gpu.power_w == pytest.approx(120.5)


def test_garbage_and_missing_files_give_none(tmp_path: Path) -> None:
    files = dict(RX_7900_XTX, gpu_busy_percent="", mem_info_vram_used="n/a", max_link_speed="Unknown")
    del files["mem_busy_percent"]
    make_card(tmp_path, "card0", "amdgpu", files)
    (gpu,) = AmdSysfsProbe(tmp_path).read()
    assert gpu.util_gpu_pct is None
    assert gpu.util_mem_pct is None
    assert gpu.vram_used_bytes is None
    assert gpu.pcie_max_gen is None
    assert gpu.vram_total_bytes == 24 * GIB


def test_no_drm_directory_means_no_amd_gpu(tmp_path: Path) -> None:
    probe = AmdSysfsProbe(tmp_path)
    assert probe.read() == ()
    assert probe.reason == "no AMD GPU in sysfs"


def test_real_sysfs_does_not_raise() -> None:
    probe = AmdSysfsProbe()
    gpus = probe.read()
    assert all(g.vendor == "amd" for g in gpus)
    assert (probe.reason is None) == bool(gpus)


# --------------------------------------------------------------------------- Apple Silicon


def mac_probe(brand: str, memsize: int, cores: int | None) -> AppleProbe:
    return AppleProbe(FakeMac(brand, memsize, cores), platform="darwin", host_memory=host_memory)


def test_m4_max_40_core_with_64_gb() -> None:
    mac = FakeMac("Apple M4 Max", 64 * GIB, 40)
    probe = AppleProbe(mac, platform="darwin", host_memory=host_memory)
    (gpu,) = probe.read()
    assert gpu.vendor == "apple"
    assert gpu.bandwidth_gbps == 546
    assert gpu.bandwidth_source == "table"
    assert gpu.vram_total_bytes == 64 * GIB  # this Mac's memory, not the largest configuration (128)
    assert gpu.vram_used_bytes == 20 * GIB
    assert gpu.unified_memory
    assert gpu.util_gpu_pct == 23
    assert "M4 Max" in gpu.name and "40-core" in gpu.name
    assert probe.reason is None


def test_binned_m4_max_32_core() -> None:
    (gpu,) = mac_probe("Apple M4 Max", 36 * GIB, 32).read()
    assert gpu.bandwidth_gbps == 410
    assert gpu.vram_total_bytes == 36 * GIB


def test_chip_is_identified_once() -> None:
    mac = FakeMac("Apple M3 Pro", 18 * GIB, 18)
    probe = AppleProbe(mac, platform="darwin", host_memory=host_memory)
    for _ in range(3):
        (gpu,) = probe.read()
        assert gpu.bandwidth_gbps == 150
    assert mac.calls.count(("sysctl", "-n", "hw.memsize")) == 1


def test_missing_core_count_takes_the_unbinned_figure() -> None:
    (gpu,) = mac_probe("Apple M4 Max", 128 * GIB, None).read()
    assert gpu.bandwidth_gbps == 546
    assert gpu.name == "Apple M4 Max"


def test_intel_mac_has_no_apple_gpu() -> None:
    probe = AppleProbe(FakeMac("Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz", 16 * GIB, None), platform="darwin")
    assert probe.read() == ()
    assert probe.reason is not None and "not Apple Silicon" in probe.reason


def test_commands_that_fail_or_are_missing_do_not_raise() -> None:
    def broken(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if argv[0] == "ioreg":
            raise subprocess.TimeoutExpired(argv, 5)
        raise FileNotFoundError(argv[0])

    probe = AppleProbe(broken, platform="darwin", host_memory=host_memory)
    assert probe.read() == ()
    assert probe.reason is not None


def test_unknown_apple_chip_still_reports_memory() -> None:
    (gpu,) = mac_probe("Apple M9 Hyper", 256 * GIB, 80).read()
    assert gpu.bandwidth_gbps is None and gpu.bandwidth_source == "unknown"
    assert gpu.vram_total_bytes == 256 * GIB


def test_not_macos_runs_nothing() -> None:
    def never(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise AssertionError("no command may run off macOS")

    probe = AppleProbe(never, platform="linux")
    assert probe.read() == ()
    assert probe.reason is None
