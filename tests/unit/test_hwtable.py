"""The shipped bandwidth table: name matching, binned Apple chips, spec RAM bandwidth."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from trayapp.sources.hwtable import (
    gpu_lookup,
    load_table,
    lookup_gpu,
    parse_udev_properties,
    ram_spec_bandwidth_gbps,
    read_memory_properties,
)

SHIPPED_CSV = Path(__file__).parents[2] / "trayapp" / "data" / "bandwidth.csv"


def _bw(name: str, cores: int | None = None) -> float | None:
    spec = lookup_gpu(name, cores)
    return spec.bandwidth_gbps if spec else None


def test_table_loads_every_device_row_once() -> None:
    with SHIPPED_CSV.open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["vendor"] != "Generic"]
    distinct = {(r["vendor"], r["model"]) for r in rows}
    table = load_table()
    assert len(table) == len(distinct)
    assert len({(s.vendor, s.model) for s in table}) == len(table)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "RTX 4090", "rtx4090", "  geforce  RTX   4090 "])
def test_vendor_words_spacing_and_case_do_not_matter(name: str) -> None:
    spec = lookup_gpu(name)
    assert spec is not None
    assert spec.model == "RTX 4090"
    assert spec.bandwidth_gbps == 1008
    assert spec.memory_type == "GDDR6X"
    assert spec.bus_width_bits == 384
    assert spec.vram_bytes == 24 * 2**30
    assert spec.exact
    assert "NVML-verified" in spec.source


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "RTX 4090 Laptop"),
        ("RTX 4090 D", "RTX 4090 D"),
        ("H100 SXM", "H100 SXM5 80GB"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),  # what NVML calls the SXM board
        ("NVIDIA H100 PCIe", "H100 PCIe 80GB"),
        ("NVIDIA H100 NVL", "H100 NVL 94GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM4"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB (PCIe/SXM4)"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2 16/32GB"),
        ("NVIDIA H200", "H200 SXM 141GB"),
        ("NVIDIA H200 NVL", "H200 NVL 141GB"),
        ("NVIDIA GB10", "GB10 / DGX Spark"),
        ("DGX Spark", "GB10 / DGX Spark"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        (
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "RTX PRO 6000 Blackwell (Workstation / Max-Q / Server)",
        ),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("AMD Radeon RX 7900 XTX", "RX 7900 XTX"),
        ("rx7900xt", "RX 7900 XT"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Intel(R) Arc(TM) B580 Graphics", "Arc B580"),
        ("Ryzen AI Max 390", "Ryzen AI Max+ 395 / Max 390 / Max 385"),
    ],
)
def test_real_driver_names_find_their_row(name: str, model: str) -> None:
    spec = lookup_gpu(name)
    assert spec is not None
    assert spec.model == model


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("RTX 4090", "RTX 4090 Laptop"),
        ("RTX 3060 Ti", "RTX 3060"),
        ("RTX 4070", "RTX 4070 Super"),
        ("H100 SXM", "H100 PCIe"),
        ("H100 SXM", "H100 NVL"),
        ("H100 PCIe", "H100 NVL"),
        ("L4", "L40"),
        ("A10", "A100"),
        ("RX 7900 XT", "RX 7900 XTX"),
        ("V100 SXM2", "V100S PCIe"),
    ],
)
def test_a_different_part_never_matches(name: str, other: str) -> None:
    a, b = lookup_gpu(name), lookup_gpu(other)
    assert a is not None and b is not None
    assert a.model != b.model


def test_laptop_part_is_not_the_desktop_part() -> None:
    assert _bw("RTX 4090") == 1008
    assert _bw("RTX 4090 Laptop") == 576
    assert _bw("RTX 3060 Ti") != _bw("RTX 3060")


def test_apple_binned_chips_are_separated_by_gpu_cores() -> None:
    assert _bw("Apple M4 Max", 40) == 546
    assert _bw("Apple M4 Max", 32) == 410
    assert _bw("Apple M3 Max", 30) == 300
    assert _bw("Apple M3 Max", 40) == 400
    assert _bw("Apple M5 Max", 40) == 614
    binned = lookup_gpu("Apple M4 Max", 32)
    assert binned is not None and binned.exact


def test_apple_without_core_count_takes_the_unbinned_chip_and_says_so() -> None:
    spec = lookup_gpu("Apple M4 Max")
    assert spec is not None
    assert spec.bandwidth_gbps == 546
    assert not spec.exact
    unknown_bin = lookup_gpu("Apple M4 Max", 36)  # a core count no row has
    assert unknown_bin is not None and unknown_bin.bandwidth_gbps == 546 and not unknown_bin.exact


def test_apple_plain_pro_and_base_chips_are_distinct_and_exact() -> None:
    assert _bw("Apple M4") == 120
    assert _bw("Apple M4 Pro") == 273
    assert _bw("Apple M1 Ultra") == 800
    pro = lookup_gpu("Apple M3 Pro", 18)
    assert pro is not None and pro.bandwidth_gbps == 150 and pro.exact and pro.unified_memory


def test_ambiguous_variants_choose_the_fastest_unless_a_hint_decides() -> None:
    plain = lookup_gpu("NVIDIA GeForce RTX 3060")
    assert plain is not None and plain.bandwidth_gbps == 360 and not plain.exact
    by_size = lookup_gpu("RTX 3060 8GB")
    assert by_size is not None and by_size.bandwidth_gbps == 240 and by_size.exact
    by_vram = lookup_gpu("NVIDIA GeForce RTX 3080", vram_bytes=10 * 2**30 - 300 * 2**20)
    assert by_vram is not None and by_vram.bandwidth_gbps == 760 and by_vram.exact
    by_type = lookup_gpu("RTX 3060 Ti GDDR6X")
    assert by_type is not None and by_type.bandwidth_gbps == 608 and by_type.exact


def test_size_only_variants_are_exact() -> None:
    spec = lookup_gpu("NVIDIA GeForce RTX 4060 Ti")  # 8 GB and 16 GB both run at 288 GB/s
    assert spec is not None and spec.bandwidth_gbps == 288 and spec.exact


@pytest.mark.parametrize(
    "name", ["", "   ", "NVIDIA", "Quadro RTX 6000", "RTX 9999", "Matrox G200", "DDR5-5600 2ch"]
)
def test_unknown_names_give_none(name: str) -> None:
    assert lookup_gpu(name) is None
    assert gpu_lookup(name) is None


def test_gpu_lookup_has_the_shape_resolve_machine_expects() -> None:
    assert gpu_lookup("RTX 4090") == (1008.0, 24 * 2**30)
    assert gpu_lookup("GB10") == (273.0, 128 * 2**30)  # one memory size: capacity is known
    # Apple memory is chosen at purchase: the table's figure is only the largest configuration.
    assert gpu_lookup("Apple M4 Max") == (546.0, None)


# --------------------------------------------------------------------------- spec RAM bandwidth

DESKTOP_DDR5 = """\
MEMORY_ARRAY_LOCATION=System Board Or Motherboard
MEMORY_ARRAY_NUM_DEVICES=4
MEMORY_DEVICE_0_PRESENT=0
MEMORY_DEVICE_0_LOCATOR=DIMM_A1
MEMORY_DEVICE_1_DATA_WIDTH=64
MEMORY_DEVICE_1_SIZE=17179869184
MEMORY_DEVICE_1_TYPE=DDR5
MEMORY_DEVICE_1_SPEED_MTS=6000
MEMORY_DEVICE_1_CONFIGURED_SPEED_MTS=5600
MEMORY_DEVICE_1_LOCATOR=DIMM_A2
MEMORY_DEVICE_2_PRESENT=0
MEMORY_DEVICE_3_DATA_WIDTH=64
MEMORY_DEVICE_3_SIZE=17179869184
MEMORY_DEVICE_3_TYPE=DDR5
MEMORY_DEVICE_3_SPEED_MTS=6000
MEMORY_DEVICE_3_CONFIGURED_SPEED_MTS=5600
MEMORY_DEVICE_3_LOCATOR=DIMM_B2
"""


def test_ram_spec_dual_channel_ddr5_uses_the_configured_speed() -> None:
    props = parse_udev_properties(DESKTOP_DDR5.splitlines())
    assert ram_spec_bandwidth_gbps(props) == pytest.approx(89.6)


def test_ram_spec_four_dimms_are_still_dual_channel() -> None:
    lines = []
    for n in range(4):
        lines += [f"E:MEMORY_DEVICE_{n}_SIZE=8589934592", f"E:MEMORY_DEVICE_{n}_TYPE=DDR4"]
        lines += [f"E:MEMORY_DEVICE_{n}_SPEED_MTS=3200"]
    assert ram_spec_bandwidth_gbps(parse_udev_properties(lines)) == pytest.approx(51.2)


def test_ram_spec_lpddr_sums_the_package_widths() -> None:
    lines = []
    for n in range(8):
        lines += [f"MEMORY_DEVICE_{n}_SIZE=2147483648", f"MEMORY_DEVICE_{n}_TYPE=LPDDR5"]
        lines += [f"MEMORY_DEVICE_{n}_DATA_WIDTH=16", f"MEMORY_DEVICE_{n}_CONFIGURED_SPEED_MTS=7500"]
    assert ram_spec_bandwidth_gbps(parse_udev_properties(lines)) == pytest.approx(120.0)


def test_ram_spec_unknown_without_memory_devices() -> None:
    assert ram_spec_bandwidth_gbps({}, read=lambda: None) is None
    assert ram_spec_bandwidth_gbps(read=lambda: None) is None
    assert ram_spec_bandwidth_gbps({"MEMORY_DEVICE_0_SIZE": "0"}) is None


def test_read_memory_properties_prefers_the_udev_database(tmp_path: Path) -> None:
    db = tmp_path / "+dmi:id"
    db.write_text("".join(f"E:{line}\n" for line in DESKTOP_DDR5.splitlines()))

    def never_run(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise AssertionError("udevadm must not run when the database has the properties")

    props = read_memory_properties(db, run=never_run)
    assert props is not None and props["MEMORY_DEVICE_1_TYPE"] == "DDR5"


def test_read_memory_properties_falls_back_to_udevadm_and_tolerates_its_absence(tmp_path: Path) -> None:
    missing = tmp_path / "absent"

    def udevadm(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert argv[:2] == ["udevadm", "info"]
        return subprocess.CompletedProcess(argv, 0, stdout=DESKTOP_DDR5, stderr="")

    props = read_memory_properties(missing, run=udevadm)
    assert props is not None and ram_spec_bandwidth_gbps(props) == pytest.approx(89.6)

    def no_udevadm(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(argv[0])

    assert read_memory_properties(missing, run=no_udevadm) is None
