"""A fake pynvml module for NvmlProbe (values from hardware.md §1.3) and GPU builders.

The fake mirrors nvidia-ml-py's shape: `NVMLError` subclasses named `NVMLError_<Name>`,
`NVMLLibraryMismatchError` outside that hierarchy, the same function names, structs with
`.total/.used`, `.gpu/.memory`, `.pid/.usedGpuMemory`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 2**30


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # pynvml spells its error classes this way
    def __init__(self) -> None:
        super().__init__(12)


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(13)


class NVMLLibraryMismatchError(Exception):
    pass


@dataclass
class FakeDevice:
    name: str
    bus_width_bits: int | None
    max_mem_clock_mhz: int | None
    memory: tuple[int, int] | None = (24 * GIB, 1 * GIB)  # (total, used); None: NotSupported
    util: tuple[int, int] | None = (37, 12)
    temperature_c: int | None = 61
    power_mw: int | None = 312_500
    reasons: int | None = 0x1
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    pcie: tuple[int, int] | None = (4, 16)
    energy_mj: int | None = None  # nvmlDeviceGetTotalEnergyConsumption; None: NotSupported (pre-Volta)
    power_limit_mw: int | None = None  # nvmlDeviceGetEnforcedPowerLimit
    sm_clock_mhz: int | None = None  # nvmlDeviceGetClockInfo(NVML_CLOCK_SM)
    sm_max_clock_mhz: int | None = None  # nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)


class FakeNvml:
    """A pynvml-shaped module over a list of FakeDevice."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        devices: list[FakeDevice],
        init_error: type[Exception] | None = None,
        no_v3_processes: bool = False,
        no_event_reasons: bool = False,
    ) -> None:
        self.devices = devices
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.initialised = False
        self.no_v3_processes = no_v3_processes
        self.no_event_reasons = no_event_reasons
        self.calls: list[str] = []

    def _dev(self, handle: int) -> FakeDevice:
        if not self.initialised:
            raise NVMLError(1)  # Uninitialized
        return self.devices[handle]

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported()
        return value

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise NVMLError(1)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._dev(index)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._dev(handle).name

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return self._value(self._dev(handle).bus_width_bits)

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock_type: int) -> int:
        if clock_type == self.NVML_CLOCK_SM:
            return self._value(self._dev(handle).sm_max_clock_mhz)
        assert clock_type == self.NVML_CLOCK_MEM
        return self._value(self._dev(handle).max_mem_clock_mhz)

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int) -> int:
        assert clock_type == self.NVML_CLOCK_SM
        return self._value(self._dev(handle).sm_clock_mhz)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._value(self._dev(handle).energy_mj)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return self._value(self._dev(handle).power_limit_mw)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._value(self._dev(handle).pcie)[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return self._value(self._dev(handle).pcie)[1]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        total, used = self._value(self._dev(handle).memory)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu, memory = self._value(self._dev(handle).util)
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._value(self._dev(handle).temperature_c)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._value(self._dev(handle).power_mw)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        self.calls.append("EventReasons")
        if self.no_event_reasons:
            raise NVMLError_FunctionNotFound()
        return self._value(self._dev(handle).reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        self.calls.append("ThrottleReasons")
        return self._value(self._dev(handle).reasons)

    def _procs(self, items: list[tuple[int, int | None]]) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in items]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[SimpleNamespace]:
        self.calls.append("compute_v3")
        if self.no_v3_processes:
            raise NVMLError_FunctionNotFound()
        return self._procs(self._dev(handle).compute)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        self.calls.append("compute_v2")
        return self._procs(self._dev(handle).compute)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        if self.no_v3_processes:  # the unversioned wrapper turns FunctionNotFound into this
            raise NVMLLibraryMismatchError("use _v2")
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: int) -> list[SimpleNamespace]:
        self.calls.append("graphics_v3")
        if self.no_v3_processes:
            raise NVMLError_FunctionNotFound()
        return self._procs(self._dev(handle).graphics)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        self.calls.append("graphics_v2")
        return self._procs(self._dev(handle).graphics)


def rtx_4090(**kwargs: Any) -> FakeDevice:
    return FakeDevice("NVIDIA GeForce RTX 4090", 384, 10501, **kwargs)


def h100_sxm(**kwargs: Any) -> FakeDevice:
    return FakeDevice("NVIDIA H100 80GB HBM3", 5120, 2619, memory=(80 * GIB, 2 * GIB), **kwargs)


def gb10(**kwargs: Any) -> FakeDevice:
    # DGX Spark: memory info NOT_SUPPORTED, no discrete memory bus (PR 208 thread, driver 580).
    return FakeDevice("NVIDIA GB10", None, None, memory=None, **kwargs)
