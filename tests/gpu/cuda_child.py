"""A child process that holds GPU memory through the CUDA driver API, with ctypes only (no framework).

    python -m tests.gpu.cuda_child <bytes>

cuInit → cuDeviceGet(0) → cuCtxCreate (or, where the driver lacks cuCtxCreate_v2, the device's
primary context) → cuMemAlloc of <bytes> → cuMemsetD8 (so the pages are really there). Prints
`READY <pid> <bytes>` on one line, then holds the memory until a line (or EOF) arrives on stdin.
Exits 2 with `FAIL <what>` when a call fails.
"""

from __future__ import annotations

import ctypes
import os
import sys

LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib")


def load_cuda() -> ctypes.CDLL:
    errors = []
    for name in LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise OSError("; ".join(errors))


class CudaError(Exception):
    pass


def _check(cuda: ctypes.CDLL, call: str, result: int) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        cuda.cuGetErrorString(result, ctypes.byref(text))
        raise CudaError(f"{call} returned {result} ({(text.value or b'?').decode()})")


def hold(size_bytes: int) -> int:
    cuda = load_cuda()
    _check(cuda, "cuInit", cuda.cuInit(0))
    device = ctypes.c_int()
    _check(cuda, "cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    context = ctypes.c_void_p()
    if hasattr(cuda, "cuCtxCreate_v2"):
        _check(cuda, "cuCtxCreate_v2", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    else:
        _check(cuda, "cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
        _check(cuda, "cuCtxSetCurrent", cuda.cuCtxSetCurrent(context))
    pointer = ctypes.c_uint64()
    _check(cuda, "cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size_bytes)))
    _check(cuda, "cuMemsetD8_v2", cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(0), ctypes.c_size_t(size_bytes)))
    _check(cuda, "cuCtxSynchronize", cuda.cuCtxSynchronize())
    print(f"READY {os.getpid()} {size_bytes}", flush=True)
    sys.stdin.readline()
    cuda.cuMemFree_v2(pointer)
    return 0


def main(argv: list[str]) -> int:
    size_bytes = int(argv[1]) if len(argv) > 1 else 1 << 30
    try:
        return hold(size_bytes)
    except (OSError, CudaError, AttributeError) as exc:
        print(f"FAIL {exc}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
