"""Fake GPU machines for tests: a sysfs tree with an amdgpu card, and the commands a Mac answers
(shared by tests/unit/test_gpu_amd_apple.py and tests/unit/test_gpu_processes.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

GIB = 2**30


# --------------------------------------------------------------------------- AMD sysfs


def write_line_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_card(
    root: Path, card: str, driver: str, files: dict[str, str], hwmon: dict[str, str] | None = None
) -> Path:
    """/sys/class/drm/<card>/device/ with a `driver` link, like the kernel's (driver-misc.rst)."""
    drivers = root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    device = root / "devices" / "pci0000:00" / f"0000:03:00.{card[-1]}"
    device.mkdir(parents=True)
    (device / "driver").symlink_to(drivers)
    for name, text in files.items():
        write_line_file(device / name, text)
    for name, text in (hwmon or {}).items():
        write_line_file(device / "hwmon" / "hwmon3" / name, text)
    drm = root / "class" / "drm"
    drm.mkdir(parents=True, exist_ok=True)
    (drm / card).mkdir()
    (drm / card / "device").symlink_to(device)
    return device


RX_7900_XTX = {
    "vendor": "0x1002",
    "device": "0x744c",
    "product_name": "AMD Radeon RX 7900 XTX",
    "mem_info_vram_total": str(24 * GIB),
    "mem_info_vram_used": str(3 * GIB + 512),
    "gpu_busy_percent": "87",
    "mem_busy_percent": "41",
    "max_link_speed": "16.0 GT/s PCIe",
    "max_link_width": "16",
}


# `ioreg -rc AGXAccelerator` on an M4 Max (abridged to the lines around the key).
IOREG_AGX = """\
+-o AGXAcceleratorG16X  <class AGXAcceleratorG16X, id 0x100000451, registered, matched, active>
    {
      "IOClass" = "AGXAcceleratorG16X"
      "gpu-core-count" = 40
      "model" = "Apple M4 Max"
      "IOMatchCategory" = "IOAccelerator"
    }
"""
# `ioreg -r -d 1 -w 0 -c IOAccelerator`
IOREG_STATS = (
    '+-o AGXAcceleratorG16X  <class AGXAcceleratorG16X>\n    {\n      "PerformanceStatistics" = '
    '{"In use system memory (driver)"=0,"Alloc system memory"=9876543210,"Tiler Utilization %"=5,'
    '"Renderer Utilization %"=20,"Device Utilization %"=23,"In use system memory"=3456789012}\n    }\n'
)


class FakeMac:
    """Answers the commands AppleProbe runs, like a Mac would."""

    def __init__(self, brand: str, memsize: int, cores: int | None) -> None:
        self.outputs = {
            ("sysctl", "-n", "machdep.cpu.brand_string"): brand,
            ("sysctl", "-n", "hw.memsize"): str(memsize),
            ("ioreg", "-rc", "AGXAccelerator"): IOREG_AGX.replace("40", str(cores)) if cores else "",
            ("ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"): IOREG_STATS,
        }
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert kwargs.get("timeout"), "every command needs a timeout"
        self.calls.append(tuple(argv))
        out = self.outputs.get(tuple(argv))
        if out is None:
            return subprocess.CompletedProcess(argv, 1, stdout="", stderr="not found")
        return subprocess.CompletedProcess(argv, 0, stdout=out + "\n", stderr="")


def host_memory() -> tuple[int, int]:
    return 64 * GIB, 20 * GIB
