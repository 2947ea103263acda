"""A fake NVIDIA driver under the real nvidia-ml-py: pynvml's own wrappers, structures and error codes run.

`FakeNvmlDriver` stands in for libnvidia-ml.so (`pynvml.nvmlLib`): each attribute is one C function of
the NVML API, called by pynvml with its own ctypes arguments (`c_nvmlMemory_t`, arrays of
`c_nvmlProcessInfo_v3_t`, `byref` counts) and answering NVML return codes. So what NvmlProbe gets is
exactly what pynvml makes of a driver's answers: `usedGpuMemory` None for NVML_VALUE_NOT_AVAILABLE
(Windows WDDM), `NVMLError_NotSupported` from a card that does not list graphics processes,
`NVMLError_FunctionNotFound` for a function the driver lacks (an old driver without the _v3 calls).
A function not defined here is one the driver lacks.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

Procs = list[tuple[int, int | None]]  # (pid, used bytes; None: NVML_VALUE_NOT_AVAILABLE)
SUCCESS: int = pynvml.NVML_SUCCESS
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT


@dataclass
class DriverGpu:
    name: str
    total_bytes: int
    used_bytes: int
    compute: Procs = field(default_factory=list)
    graphics: Procs | None = field(default_factory=list)  # None: NVML_ERROR_NOT_SUPPORTED (old cards)


class FakeNvmlDriver:
    """libnvidia-ml.so for pynvml: `install` it, then use `pynvml` itself."""

    def __init__(self, gpus: list[DriverGpu], lacks: tuple[str, ...] = ()) -> None:
        self.gpus = gpus
        functions: dict[str, Callable[..., int]] = {
            "nvmlInitWithFlags": lambda flags: SUCCESS,
            "nvmlShutdown": lambda: SUCCESS,
            "nvmlDeviceGetCount_v2": self._count,
            "nvmlDeviceGetHandleByIndex_v2": self._handle,
            "nvmlDeviceGetName": self._name,
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetComputeRunningProcesses_v3": self._procs("compute", pynvml.c_nvmlProcessInfo_v3_t),
            "nvmlDeviceGetGraphicsRunningProcesses_v3": self._procs(
                "graphics", pynvml.c_nvmlProcessInfo_v3_t
            ),
            "nvmlDeviceGetComputeRunningProcesses_v2": self._procs("compute", pynvml.c_nvmlProcessInfo_v2_t),
            "nvmlDeviceGetGraphicsRunningProcesses_v2": self._procs(
                "graphics", pynvml.c_nvmlProcessInfo_v2_t
            ),
        }
        self._functions = {name: fn for name, fn in functions.items() if name not in lacks}

    def __getattr__(self, name: str) -> Callable[..., int]:
        try:
            return self._functions[name]
        except KeyError:
            raise AttributeError(name) from None  # pynvml: NVML_ERROR_FUNCTION_NOT_FOUND

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pynvml, "nvmlLib", self)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})

    # -- the C functions

    def _gpu(self, handle: Any) -> DriverGpu:
        return self.gpus[ctypes.cast(handle, ctypes.c_void_p).value - 1]  # type: ignore[operator]

    def _count(self, count_ref: Any) -> int:
        count_ref._obj.value = len(self.gpus)
        return SUCCESS

    def _handle(self, index: Any, device_ref: Any) -> int:
        if index.value >= len(self.gpus):
            return INVALID_ARGUMENT
        slot = ctypes.cast(ctypes.pointer(device_ref._obj), ctypes.POINTER(ctypes.c_void_p))
        slot.contents.value = index.value + 1  # the handle is the GPU's index + 1
        return SUCCESS

    def _name(self, handle: Any, buffer: Any, size: Any) -> int:
        buffer.value = self._gpu(handle).name.encode()[: size.value - 1]
        return SUCCESS

    def _memory(self, handle: Any, memory_ref: Any) -> int:
        gpu, memory = self._gpu(handle), memory_ref._obj
        memory.total, memory.used, memory.free = (
            gpu.total_bytes,
            gpu.used_bytes,
            gpu.total_bytes - gpu.used_bytes,
        )
        return SUCCESS

    def _procs(self, kind: str, struct: type[ctypes.Structure]) -> Callable[..., int]:
        def call(handle: Any, count_ref: Any, array: Any) -> int:
            procs: Procs | None = getattr(self._gpu(handle), kind)
            if procs is None:
                return NOT_SUPPORTED
            count = count_ref._obj
            if not procs:
                count.value = 0
                return SUCCESS
            if array is None or count.value < len(procs):  # the size query: NVML's two-call protocol
                count.value = len(procs)
                return INSUFFICIENT_SIZE
            for i, (pid, used) in enumerate(procs):
                array[i].pid = pid
                array[i].usedGpuMemory = (
                    pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
                )
            count.value = len(procs)
            return SUCCESS

        return call
