"""AMD GPUs through amdgpu's sysfs files (no ROCm needed; Linux only): `AmdSysfsProbe`, a `GpuProbe`
like the NVIDIA and Apple probes in `gpu.py`."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from trayapp.core.hardware_readings import GpuProcess, GpuReading
from trayapp.sources.gpu_processes import DrmClientReader
from trayapp.sources.hwtable import lookup_gpu
from trayapp.sources.relisted import Relisted

_PCIE_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


class AmdSysfsProbe:
    """AMD GPUs through amdgpu's sysfs files (no ROCm needed; Linux only).

    Reads `/sys/class/drm/card*/device/` where the `driver` link points to
    amdgpu. The name comes from `product_name` (set on workstation and
    datacenter boards) or else the PCI device id; bandwidth comes from the
    table when the name is known. The cards are listed again every
    STATIC_REFRESH_S (a card that appears shows at most that much later) and
    at once when one has gone.
    """

    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        clients: DrmClientReader | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._drm = sysfs_root / "class" / "drm"
        self._clients = clients if clients is not None else DrmClientReader()
        self._devices = Relisted(self._amdgpu_devices, clock)
        self.reason: str | None = None

    def read(self) -> tuple[GpuReading, ...]:
        devices = self._devices.get()
        if not all(device.exists() for device in devices):  # one went away: list them again now
            self._devices.expire()
            devices = self._devices.get()
        clients = self._clients.clients() if devices else []  # one scan of /proc for every card
        only = len(devices) == 1
        readings = tuple(
            self._reading(index, device, self._clients.processes("amdgpu", _link_name(device), only, clients))
            for index, device in enumerate(devices)
        )
        self.reason = None if readings else "no AMD GPU in sysfs"
        return readings

    def close(self) -> None:
        pass

    def _amdgpu_devices(self) -> list[Path]:
        devices = [card / "device" for card in self._cards()]
        return [device for device in devices if _link_name(device / "driver") == "amdgpu"]

    def _cards(self) -> list[Path]:
        try:
            cards = [p for p in self._drm.iterdir() if re.fullmatch(r"card\d+", p.name)]
        except OSError:
            return []
        return sorted(cards, key=lambda p: int(p.name[4:]))

    def _reading(self, index: int, device: Path, processes: tuple[GpuProcess, ...]) -> GpuReading:
        """One card; `processes`: its DRM clients' VRAM (the kernel's fdinfo, matched by PCI address)."""
        total = _read_int(device / "mem_info_vram_total")
        product = _read_text(device / "product_name")
        name = product or f"AMD GPU {_read_text(device / 'device') or '?'}"
        spec = lookup_gpu(product, vram_bytes=total) if product else None
        hwmon = _first_dir(device / "hwmon", "hwmon*")
        temp_mc = _read_int(hwmon / "temp1_input") if hwmon else None
        power_uw = None
        if hwmon:
            power_uw = _read_int(hwmon / "power1_average") or _read_int(hwmon / "power1_input")
        busy = _read_int(device / "gpu_busy_percent")
        mem_busy = _read_int(device / "mem_busy_percent")
        return GpuReading(
            index=index,
            name=name,
            vendor="amd",
            vram_total_bytes=total,
            vram_used_bytes=_read_int(device / "mem_info_vram_used"),
            bandwidth_gbps=spec.bandwidth_gbps if spec else None,
            bandwidth_source="table" if spec else "unknown",
            pcie_max_gen=_pcie_gen(_read_text(device / "max_link_speed")),
            pcie_max_width=_read_int(device / "max_link_width"),
            util_gpu_pct=float(busy) if busy is not None else None,
            util_mem_pct=float(mem_busy) if mem_busy is not None else None,
            temperature_c=temp_mc / 1000 if temp_mc is not None else None,
            power_w=power_uw / 1e6 if power_uw is not None else None,
            processes=processes,
        )


def _link_name(path: Path) -> str | None:
    try:
        return Path(os.readlink(path)).name
    except OSError:
        return None


def _read_text(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return text or None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _first_dir(parent: Path, pattern: str) -> Path | None:
    try:
        return next(iter(sorted(parent.glob(pattern))), None)
    except OSError:
        return None


def _pcie_gen(speed: str | None) -> int | None:
    """PCIe generation from a sysfs link speed such as "16.0 GT/s PCIe" (-> 4)."""
    match = re.match(r"\s*([\d.]+)\s*GT/s", speed or "")
    return _PCIE_GEN_BY_GTS.get(float(match.group(1))) if match else None
