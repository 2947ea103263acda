"""GPU probes: NVIDIA through NVML, AMD through sysfs (`gpu_amd.py`), Apple Silicon through sysctl/ioreg.

Each probe's `read()` returns a tuple of `GpuReading`s (empty when it finds no
such GPU) and leaves in `reason` why it found none. A missing driver, an
unsupported query or a vanished process never raises: absence is data.
Probes are not thread-safe: the sampler thread owns them (never the GUI thread).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trayapp.core.hardware_readings import GpuProcess, GpuReading, ValueSource
from trayapp.sources.gpu_processes import APPLE_PRESSURE_ARGV, apple_memory_pressure, largest_memory_users
from trayapp.sources.host import ram_bytes
from trayapp.sources.hwtable import lookup_gpu
from trayapp.sources.processes import process_name

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
HostMemory = Callable[[], "tuple[int, int]"]  # -> (total_bytes, used_bytes)


class GpuProbe(Protocol):
    """What `HardwareProbe` needs from a vendor probe."""

    reason: str | None  # why read() found no GPU; None when it found some (or does not apply here)

    def read(self) -> tuple[GpuReading, ...]: ...

    def close(self) -> None: ...


def host_memory_bytes() -> tuple[int, int]:
    """System RAM (total, used) in bytes: the memory a unified-memory GPU shares."""
    total_bytes, available_bytes = ram_bytes()
    return total_bytes, total_bytes - available_bytes


# --------------------------------------------------------------------------- NVIDIA

# Clock-event bits that mean the GPU is being slowed down (GpuIdle, application clocks,
# sync boost and display clock settings are not slowdowns).
THROTTLE_BITS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
_NOT_AVAILABLE = 2**63  # NVML's "value not available" is 2**64 - 1

NO_NVML_LIBRARY = "NVML library not found: no NVIDIA driver"
NVML_LIBRARY = "libnvidia-ml.so.1"  # what pynvml loads on Linux
_INIT_REASONS = (
    ("NVMLError_LibraryNotFound", NO_NVML_LIBRARY),
    ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded (NVML present, kernel module missing)"),
    ("NVMLError_NoPermission", "no permission to use NVML"),
    ("NVMLError_LibRmVersionMismatch", "NVIDIA driver and NVML versions differ: reboot"),
)


def _load_library(name: str) -> None:
    import ctypes

    ctypes.CDLL(name)


def nvidia_driver_absent(
    platform: str = sys.platform,
    proc_root: Path = Path("/proc"),
    load_library: Callable[[str], object] = _load_library,
) -> bool:
    """True on Linux where no NVIDIA driver is loaded (no /proc/driver/nvidia) and NVML's library
    cannot be loaded either: pynvml would say NO_NVML_LIBRARY, so it need not be imported (issue #26:
    it is a few MiB). False elsewhere, and where the library loads (pynvml then tells why, e.g. the
    kernel module is missing)."""
    if not platform.startswith("linux") or (proc_root / "driver" / "nvidia").exists():
        return False
    try:
        load_library(NVML_LIBRARY)
    except OSError:
        return True
    return False


def throttle_names(mask: int | None) -> tuple[str, ...]:
    """Names of the active slowdown reasons in an NVML clocks-event bitmask."""
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)


def nvml_bandwidth_gbps(bus_width_bits: int, max_mem_clock_mhz: int) -> float:
    """Peak bandwidth from NVML: bus/8 × max memory clock × 2 (every memory type, hardware.md §0)."""
    return bus_width_bits / 8 * max_mem_clock_mhz * 2 / 1000


@dataclass(frozen=True)
class _NvmlDevice:
    """Facts that do not change while the driver is loaded."""

    index: int
    handle: Any
    name: str
    bandwidth_gbps: float | None
    bandwidth_source: ValueSource
    pcie_max_gen: int | None
    pcie_max_width: int | None


class NvmlProbe:
    """NVIDIA GPUs through NVML (`pynvml` from nvidia-ml-py).

    NVML is initialised on the first `read()`. When that fails (no driver, no
    permission) the probe reports no GPUs with a human `reason` and tries again
    only after `retry_after_s`; pynvml is not even imported where
    `driver_absent()` (no driver, no library). Every query is wrapped on its
    own: one that the device or driver does not support gives None. Pass `nvml`
    to inject a pynvml-shaped module (tests).
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        retry_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        host_memory: HostMemory = host_memory_bytes,
        name_of_pid: Callable[[int], str | None] = process_name,
        driver_absent: Callable[[], bool] = nvidia_driver_absent,
    ) -> None:
        self._nvml = nvml
        self._driver_absent = driver_absent
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._host_memory = host_memory
        self._name_of_pid = name_of_pid
        self._devices: tuple[_NvmlDevice, ...] | None = None  # None until NVML is initialised
        self._failed_at_s: float | None = None
        self.reason: str | None = None

    def read(self) -> tuple[GpuReading, ...]:
        if not self._ensure_init():
            return ()
        assert self._devices is not None
        return tuple(self._reading(device) for device in self._devices)

    def close(self) -> None:
        """Shut NVML down if this probe initialised it."""
        if self._devices is not None:
            self._call("nvmlShutdown")
        self._devices = None
        self._failed_at_s = None

    # -- init

    def _ensure_init(self) -> bool:
        if self._devices is not None:
            return True
        if self._failed_at_s is not None and self._clock() - self._failed_at_s < self._retry_after_s:
            return False
        if self._nvml is None:
            if self._driver_absent():
                return self._fail(NO_NVML_LIBRARY)
            try:
                import pynvml
            except ImportError:
                return self._fail("nvidia-ml-py is not installed")
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            return self._fail(self._init_reason(exc))
        count = self._call("nvmlDeviceGetCount") or 0
        devices = []
        for index in range(count):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                devices.append(self._static(index, handle))
        self._devices = tuple(devices)
        self.reason = None if devices else "NVML reports no NVIDIA GPU"
        return True

    def _fail(self, reason: str) -> bool:
        self.reason = reason
        self._failed_at_s = self._clock()
        return False

    def _init_reason(self, exc: Exception) -> str:
        for attr, text in _INIT_REASONS:
            cls = getattr(self._nvml, attr, None)
            if isinstance(cls, type) and isinstance(exc, cls):
                return text
        return f"NVML init failed: {exc}"

    def _static(self, index: int, handle: Any) -> _NvmlDevice:
        raw_name = self._call("nvmlDeviceGetName", handle)
        name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name or "")
        name = name or f"NVIDIA GPU {index}"
        bus = self._call("nvmlDeviceGetMemoryBusWidth", handle)
        clock = self._call("nvmlDeviceGetMaxClockInfo", handle, getattr(self._nvml, "NVML_CLOCK_MEM", 2))
        bandwidth: float | None = None
        source: ValueSource = "unknown"
        if bus and clock:
            bandwidth, source = nvml_bandwidth_gbps(int(bus), int(clock)), "nvml"
        else:  # e.g. GB10: no discrete memory bus to report
            total, _, _ = self._memory(handle)
            spec = lookup_gpu(name, vram_bytes=total)
            if spec is not None:
                bandwidth, source = spec.bandwidth_gbps, "table"
        return _NvmlDevice(
            index=index,
            handle=handle,
            name=name,
            bandwidth_gbps=bandwidth,
            bandwidth_source=source,
            pcie_max_gen=self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_max_width=self._call("nvmlDeviceGetMaxPcieLinkWidth", handle),
        )

    # -- per read

    def _reading(self, device: _NvmlDevice) -> GpuReading:
        handle = device.handle
        total, used, unified = self._memory(handle)
        util = self._call("nvmlDeviceGetUtilizationRates", handle)
        temperature = self._call(
            "nvmlDeviceGetTemperature", handle, getattr(self._nvml, "NVML_TEMPERATURE_GPU", 0)
        )
        power_mw = self._call("nvmlDeviceGetPowerUsage", handle)
        mask = self._clocks_event_reasons(handle)
        energy_mj = self._call("nvmlDeviceGetTotalEnergyConsumption", handle)  # NotSupported before Volta
        limit_mw = self._call("nvmlDeviceGetEnforcedPowerLimit", handle)
        sm_clock = getattr(self._nvml, "NVML_CLOCK_SM", 1)
        sm_mhz = self._call("nvmlDeviceGetClockInfo", handle, sm_clock)
        sm_max_mhz = self._call("nvmlDeviceGetMaxClockInfo", handle, sm_clock)
        return GpuReading(
            index=device.index,
            name=device.name,
            vendor="nvidia",
            vram_total_bytes=total,
            vram_used_bytes=used,
            bandwidth_gbps=device.bandwidth_gbps,
            bandwidth_source=device.bandwidth_source,
            unified_memory=unified,
            pcie_max_gen=device.pcie_max_gen,
            pcie_max_width=device.pcie_max_width,
            util_gpu_pct=float(util.gpu) if util is not None else None,
            util_mem_pct=float(util.memory) if util is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            clocks_event_reasons=mask,
            throttle_reasons=throttle_names(mask),
            energy_j=energy_mj / 1000 if energy_mj is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw else None,
            sm_clock_mhz=float(sm_mhz) if sm_mhz else None,
            sm_clock_max_mhz=float(sm_max_mhz) if sm_max_mhz else None,
            processes=self._processes(handle),
        )

    def _memory(self, handle: Any) -> tuple[int | None, int | None, bool]:
        """(total, used, unified): unified-memory devices (GB10) report host RAM instead."""
        nvml = self._nvml
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._error("NVMLError_NotSupported"):
            info = None
        except nvml.NVMLError:
            return None, None, False
        if info is None or not info.total:
            total, used = self._host_memory()
            return total, used, True
        return int(info.total), int(info.used), False

    def _clocks_event_reasons(self, handle: Any) -> int | None:
        # The new name (nvidia-ml-py >= 12.535.77) first; the old one on older bindings/drivers.
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                return int(fn(handle))
            except self._error("NVMLError_FunctionNotFound"):
                continue
            except self._nvml.NVMLError:
                return None
        return None

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        used: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            for proc in self._process_list(kind, handle):
                pid = int(proc.pid)
                mem = proc.usedGpuMemory
                mem = int(mem) if mem is not None and mem < _NOT_AVAILABLE else None
                seen = used.get(pid)
                used[pid] = mem if seen is None else seen if mem is None else max(seen, mem)
        return tuple(GpuProcess(pid, self._name_of_pid(pid), used[pid]) for pid in sorted(used))

    def _process_list(self, kind: str, handle: Any) -> Iterable[Any]:
        missing = (self._error("NVMLError_FunctionNotFound"), self._error("NVMLLibraryMismatchError"))
        for suffix in ("_v3", "_v2", ""):
            fn = getattr(self._nvml, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", None)
            if fn is None:
                continue
            try:
                return list(fn(handle))
            except missing:
                continue  # the driver lacks this version: try the older one
            except self._nvml.NVMLError:
                return []
        return []

    # -- helpers

    def _call(self, name: str, *args: Any) -> Any:
        """`pynvml.<name>(*args)`, or None when the binding lacks it or NVML says no."""
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _error(self, name: str) -> type[BaseException]:
        cls = getattr(self._nvml, name, None)
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else _NeverRaised


class _NeverRaised(Exception):
    """Stands in for an error class an old binding does not define."""


# --------------------------------------------------------------------------- Apple


@dataclass(frozen=True)
class _AppleChip:
    name: str
    memory_bytes: int | None
    bandwidth_gbps: float | None


class AppleProbe:
    """Apple Silicon's GPU on macOS: chip from sysctl + ioreg, bandwidth from the table.

    Capacity is this machine's own memory (`hw.memsize`), shared with the CPU.
    Elsewhere than macOS it reports nothing and no reason.
    """

    def __init__(
        self,
        run: Runner = subprocess.run,
        *,
        platform: str = sys.platform,
        host_memory: HostMemory = host_memory_bytes,
        memory_users: Callable[[], tuple[GpuProcess, ...]] = largest_memory_users,
    ) -> None:
        self._run = run
        self._platform = platform
        self._host_memory = host_memory
        self._memory_users = memory_users  # no per-process GPU memory on unified memory: RAM users (RSS)
        self._chip: _AppleChip | None = None
        self._identified = False
        self.reason: str | None = None

    def read(self) -> tuple[GpuReading, ...]:
        if self._platform != "darwin":
            return ()
        if not self._identified:
            self._chip = self._identify()
            self._identified = True
        chip = self._chip
        if chip is None:
            return ()
        _, used = self._host_memory()
        stats = self._output(["ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"]) or ""
        util = re.search(r'"Device Utilization %"\s*=\s*(\d+)', stats)
        return (
            GpuReading(
                index=0,
                name=chip.name,
                vendor="apple",
                vram_total_bytes=chip.memory_bytes,
                vram_used_bytes=used,
                bandwidth_gbps=chip.bandwidth_gbps,
                bandwidth_source="table" if chip.bandwidth_gbps else "unknown",
                unified_memory=True,
                util_gpu_pct=float(util.group(1)) if util else None,
                processes=self._memory_users(),
                processes_rss=True,
                memory_pressure=apple_memory_pressure(self._output(APPLE_PRESSURE_ARGV)),
            ),
        )

    def close(self) -> None:
        pass

    def _identify(self) -> _AppleChip | None:
        brand = self._output(["sysctl", "-n", "machdep.cpu.brand_string"])
        if not brand or not brand.startswith("Apple"):
            self.reason = f"not Apple Silicon ({brand or 'unknown CPU'})"
            return None
        memsize = self._output(["sysctl", "-n", "hw.memsize"])
        accel = self._output(["ioreg", "-rc", "AGXAccelerator"]) or ""
        cores_match = re.search(r'"gpu-core-count"\s*=\s*(\d+)', accel)
        cores = int(cores_match.group(1)) if cores_match else None
        spec = lookup_gpu(brand, gpu_cores=cores)
        return _AppleChip(
            name=f"{brand} ({cores}-core GPU)" if cores else brand,
            memory_bytes=int(memsize) if memsize and memsize.isdigit() else None,
            bandwidth_gbps=spec.bandwidth_gbps if spec else None,
        )

    def _output(self, argv: list[str]) -> str | None:
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
