"""Per-process GPU memory where NVML does not apply: the kernel's DRM client stats (AMD, Intel), and on
Apple's unified memory the largest users of RAM and the memory pressure.

Linux DRM drivers print per-client statistics in `/proc/<pid>/fdinfo/<fd>` for every open DRM file
(the kernel's Documentation/gpu/drm-usage-stats.rst, "DRM client usage stats"): `drm-driver`
(mandatory), `drm-pdev` (the PCI address of the device), `drm-client-id` (one per `struct drm_file`:
"used to distinguish duplicated and shared file descriptors", so a client seen through two fds or two
processes is counted once), and per memory region `drm-resident-<region>` (resident buffers; its
deprecated alias `drm-memory-<region>`, which amdgpu prints) and `drm-total-<region>` (all buffers,
instantiated or not), each `<uint> [KiB|MiB]`, bytes by default. A region names the GPU's own memory
as `vram` (amdgpu), `vram0` (xe) or `local0` (i915); `memory`, `gtt`, `system0` and `stolen` are
system memory and not counted. Another user's fds cannot be read without privileges: their processes
are not listed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from trayapp.core.hardware_readings import GpuProcess
from trayapp.core.vram_holders import OTHER_USER
from trayapp.sources.processes import process_name

NameOfPid = Callable[[int], "str | None"]
DEVICE_REGION = re.compile(r"(vram|local)\d*")  # the GPU's own memory: amdgpu vram, xe vram0, i915 local0
_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_VALUE = re.compile(r"(\d+)\s*([A-Za-z]*)")
APPLE_USERS_LISTED = 5  # Apple: the largest RAM users named on the GPU card
# sysctl kern.memorystatus_vm_pressure_level (xnu's kern_memorystatus: 1 normal, 2 warning, 4 critical)
APPLE_PRESSURE = {1: "normal", 2: "warning", 4: "critical"}


# --------------------------------------------------------------------------- DRM fdinfo (AMD, Intel)


def memory_bytes(value: str) -> int | None:
    """'12 KiB' → 12_288; '1024' → 1024 (bytes by default); None for anything else."""
    match = _VALUE.fullmatch(value.strip())
    if match is None or match.group(2) not in _UNITS:
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_fdinfo(text: str) -> dict[str, str]:
    """The `drm-` keys of one fdinfo file (key: value per line)."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.startswith("drm-"):
            keys[key.strip()] = value.strip()
    return keys


def device_memory_bytes(keys: Mapping[str, str]) -> int | None:
    """Bytes of the GPU's own memory a client holds: per device region its resident size
    (`drm-resident-`, or the alias `drm-memory-`), else its total (`drm-total-`); summed over the
    regions. None when the client reports no device region."""
    regions: dict[str, int] = {}
    for prefix in ("drm-total-", "drm-memory-", "drm-resident-"):  # later ones win
        for key, value in keys.items():
            region = key[len(prefix) :] if key.startswith(prefix) else None
            if region is None or not DEVICE_REGION.fullmatch(region):
                continue
            size = memory_bytes(value)
            if size is not None:
                regions[region] = size
    return sum(regions.values()) if regions else None


@dataclass(frozen=True)
class DrmClient:
    pid: int
    driver: str
    pdev: str | None  # PCI address, e.g. "0000:03:00.0"
    client_id: int | None
    vram_bytes: int


class DrmClientReader:
    """DRM clients and their GPU memory from `<proc_root>/<pid>/fdinfo` (only fds that are DRM files)."""

    def __init__(self, proc_root: Path = Path("/proc"), name_of_pid: NameOfPid = process_name) -> None:
        self._proc = proc_root
        self._name_of_pid = name_of_pid

    def clients(self) -> list[DrmClient]:
        """Every DRM client with device memory, each once (by `drm-client-id` on its device)."""
        seen: set[tuple[str | None, str, int]] = set()
        found: list[DrmClient] = []
        for pid, keys in self._fdinfos():
            driver = keys.get("drm-driver")
            vram = device_memory_bytes(keys)
            if not driver or vram is None:
                continue
            pdev = keys.get("drm-pdev")
            raw_id = keys.get("drm-client-id", "")
            client_id = int(raw_id) if raw_id.isdigit() else None
            if client_id is not None:
                if (pdev, driver, client_id) in seen:
                    continue  # a duplicated or shared fd of a client already counted
                seen.add((pdev, driver, client_id))
            found.append(DrmClient(pid, driver, pdev, client_id, vram))
        return found

    def processes(
        self, driver: str, pdev: str | None, only_device: bool, clients: Iterable[DrmClient] | None = None
    ) -> tuple[GpuProcess, ...]:
        """Per process, the device memory of its clients of `driver` on the card at `pdev` (any card of
        that driver when `pdev` is unknown and `only_device`: the machine has one such card).
        `clients`: those already read this tick (one scan of /proc for every card)."""
        held: dict[int, int] = {}
        for client in self.clients() if clients is None else clients:
            if client.driver != driver:
                continue
            if client.pdev != pdev and not (only_device and (pdev is None or client.pdev is None)):
                continue
            held[client.pid] = held.get(client.pid, 0) + client.vram_bytes
        return tuple(GpuProcess(pid, self._name_of_pid(pid), held[pid]) for pid in sorted(held))

    def _fdinfos(self) -> Iterator[tuple[int, dict[str, str]]]:
        try:
            pids = sorted(int(p.name) for p in self._proc.iterdir() if p.name.isdigit())
        except OSError:
            return
        for pid in pids:
            fd_dir = self._proc / str(pid) / "fd"
            try:
                fds = list(fd_dir.iterdir())
            except OSError:  # gone, or another user's
                continue
            for fd in fds:
                try:
                    if not os.readlink(fd).startswith("/dev/dri/"):
                        continue
                    text = (self._proc / str(pid) / "fdinfo" / fd.name).read_text(errors="replace")
                except OSError:
                    continue
                yield pid, parse_fdinfo(text)


# --------------------------------------------------------------------------- Apple (unified memory)


def largest_memory_users(
    limit: int = APPLE_USERS_LISTED, processes: Callable[..., Iterable[Any]] = psutil.process_iter
) -> tuple[GpuProcess, ...]:
    """The `limit` processes with the largest resident memory (RSS), largest first: on unified memory
    there is no per-process GPU memory, so these are who leaves the GPU less room."""
    users: list[GpuProcess] = []
    for proc in processes(["pid", "name", "memory_info"]):
        info = proc.info
        memory = info.get("memory_info")
        if memory is None:
            continue
        name = info.get("name")
        users.append(GpuProcess(int(info["pid"]), str(name) if name else OTHER_USER, int(memory.rss)))
    users.sort(key=lambda p: (-(p.used_bytes or 0), p.pid))
    return tuple(users[:limit])


def apple_memory_pressure(output: str | None) -> str | None:
    """`sysctl -n kern.memorystatus_vm_pressure_level` → "normal" | "warning" | "critical"."""
    text = (output or "").strip()
    return APPLE_PRESSURE.get(int(text)) if text.isdigit() else None


APPLE_PRESSURE_ARGV = ["sysctl", "-n", "kern.memorystatus_vm_pressure_level"]
