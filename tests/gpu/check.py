"""The GPU check (#21): llm-tray's GPU readings against nvidia-smi, on a machine with an NVIDIA GPU.

    .venv/bin/python -m tests.gpu.check          # or: pytest -m gpu tests/gpu

Exit 0: every check passed; 1: a check failed; 77: skipped, no NVIDIA GPU here (the reason is printed).

A child process (tests/gpu/cuda_child.py) allocates `ALLOC_BYTES` of GPU memory through the CUDA
driver API with ctypes (cuInit, cuDeviceGet, cuCtxCreate, cuMemAlloc; no framework). While it holds
them, the checks compare what llm-tray reads (`NvmlProbe`, the probe the tray and `status` use) with
`nvidia-smi` on the same machine:

* per process: llm-tray's figure for the child against `nvidia-smi --query-compute-apps=pid,used_memory`
  (MiB), and at least the bytes allocated;
* per GPU: total and used memory against `nvidia-smi --query-gpu=index,memory.total,memory.used`
  (NVML's `used` counts the driver's reserve, which newer nvidia-smi leaves out: the difference may be
  up to `memory.reserved`).

Power, the energy counter's delta and throttle reasons (#21 part B) are added to `CHECKS`.
Where the child runs in another PID namespace than NVML reports (a container), it is found as the
process that appeared holding the allocation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from trayapp.core.hardware_readings import GpuProcess, GpuReading
from trayapp.sources.gpu import NvmlProbe

ALLOC_BYTES = 1 << 30  # 1 GiB, held by the child
MIB = 1 << 20
SKIPPED = 77  # the automake convention for "skipped"
USED_DRIFT_BYTES = 256 * MIB  # other processes' memory may move between llm-tray's read and nvidia-smi's
APPEAR_TRIES = 20  # NVML lists a new context within a few reads; 20 × 0.25 s at most
SMI_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str


@dataclass
class Context:
    """What every check may use: llm-tray's readings and the child holding memory."""

    probe: NvmlProbe
    child_pid: int
    alloc_bytes: int
    before: tuple[GpuReading, ...]  # llm-tray's readings before the child allocated
    gpus: tuple[GpuReading, ...] = ()  # and while it holds the memory
    extra: dict[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------- nvidia-smi


def smi(*args: str) -> list[list[str]]:
    """nvidia-smi's CSV rows (noheader, nounits), split and stripped."""
    done = subprocess.run(
        ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=SMI_TIMEOUT_S,
        check=True,
    )
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check; None when it can."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"nvidia-smi -L lists no GPU ({(listed.stderr or listed.stdout).strip()[:200]})"
    probe = NvmlProbe()
    try:
        if not probe.read():
            return f"llm-tray's NVML probe finds no GPU: {probe.reason}"
    finally:
        probe.close()
    return None


# --------------------------------------------------------------------------- the child


@contextmanager
def child_holding(alloc_bytes: int) -> Iterator[int]:
    """A child holding `alloc_bytes` of GPU memory; yields its pid."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.gpu.cuda_child", str(alloc_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=None,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"the CUDA child did not allocate: {line or 'no output'}")
        yield int(line.split()[1])
        child.stdin.write("done\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


def _all_processes(gpus: tuple[GpuReading, ...]) -> list[tuple[int, GpuProcess]]:
    return [(g.index, p) for g in gpus for p in g.processes]


def find_child(ctx: Context) -> tuple[int, GpuProcess] | None:
    """The child's (GPU index, process) in llm-tray's reading: by pid, else (another PID namespace) the
    one process that was not there before and holds at least the allocation."""
    for tries in range(APPEAR_TRIES):
        ctx.gpus = ctx.probe.read()
        found = [(i, p) for i, p in _all_processes(ctx.gpus) if p.pid == ctx.child_pid]
        if found:
            return found[0]
        before = {p.pid for _, p in _all_processes(ctx.before)}
        new = [
            (i, p)
            for i, p in _all_processes(ctx.gpus)
            if p.pid not in before and (p.used_bytes or 0) >= ctx.alloc_bytes
        ]
        if len(new) == 1:
            ctx.extra["pid_namespace"] = f"child pid {ctx.child_pid}, NVML pid {new[0][1].pid}"
            return new[0]
        if tries + 1 < APPEAR_TRIES:
            time.sleep(0.25)
    return None


# --------------------------------------------------------------------------- checks


def check_process_memory(ctx: Context) -> list[Result]:
    found = find_child(ctx)
    if found is None:
        return [
            Result("per-process memory", False, f"llm-tray does not list the child (pid {ctx.child_pid})")
        ]
    _, process = found
    ours = process.used_bytes
    rows = {int(r[0]): r[1] for r in smi("--query-compute-apps=pid,used_memory") if r and r[0].isdigit()}
    theirs = rows.get(process.pid)
    where = f" ({ctx.extra['pid_namespace']})" if "pid_namespace" in ctx.extra else ""
    if ours is None:
        return [
            Result("per-process memory", False, f"llm-tray says unavailable; nvidia-smi {theirs} MiB{where}")
        ]
    if theirs is None or not theirs.isdigit():
        return [
            Result("per-process memory", False, f"nvidia-smi does not list pid {process.pid}: {rows}{where}")
        ]
    same = abs(ours / MIB - int(theirs)) < 1
    enough = ours >= ctx.alloc_bytes
    detail = (
        f"pid {process.pid}: llm-tray {ours} B = {ours / MIB:.1f} MiB, nvidia-smi {theirs} MiB, "
        f"allocated {ctx.alloc_bytes / MIB:.0f} MiB{where}"
    )
    return [
        Result("per-process memory = nvidia-smi", same, detail),
        Result("per-process memory ≥ the allocation", enough, detail),
    ]


def check_gpu_memory(ctx: Context) -> list[Result]:
    gpus = ctx.gpus or ctx.probe.read()
    rows = {int(r[0]): r for r in smi("--query-gpu=index,memory.total,memory.used") if r and r[0].isdigit()}
    reserved: dict[int, int] = {}
    try:
        for r in smi("--query-gpu=index,memory.reserved"):
            if r and r[0].isdigit() and r[1].isdigit():
                reserved[int(r[0])] = int(r[1])
    except subprocess.CalledProcessError:
        pass  # an older nvidia-smi without memory.reserved
    results = []
    for gpu in gpus:
        row = rows.get(gpu.index)
        if row is None or gpu.vram_total_bytes is None or gpu.vram_used_bytes is None:
            results.append(Result(f"GPU {gpu.index} memory", False, f"llm-tray {gpu}, nvidia-smi {row}"))
            continue
        total_mib, used_mib = int(row[1]), int(row[2])
        results.append(
            Result(
                f"GPU {gpu.index} total memory = nvidia-smi",
                abs(gpu.vram_total_bytes / MIB - total_mib) < 1,
                f"llm-tray {gpu.vram_total_bytes / MIB:.1f} MiB, nvidia-smi {total_mib} MiB",
            )
        )
        allowed = reserved.get(gpu.index, 0) * MIB + USED_DRIFT_BYTES
        results.append(
            Result(
                f"GPU {gpu.index} used memory ≈ nvidia-smi",
                abs(gpu.vram_used_bytes - used_mib * MIB) <= allowed,
                f"llm-tray {gpu.vram_used_bytes / MIB:.1f} MiB, nvidia-smi {used_mib} MiB "
                f"(reserved {reserved.get(gpu.index, '?')} MiB; allowed difference {allowed / MIB:.0f} MiB)",
            )
        )
    return results


# The checks, in order: memory here, then power, the energy counter's delta, SM clocks and throttle
# reasons against nvidia-smi --query-gpu (tests/gpu/check_power.py, #21 part B).
CHECKS: list[Callable[[Context], list[Result]]] = [
    check_process_memory,
    check_gpu_memory,
]


def _power_checks() -> list[Callable[[Context], list[Result]]]:
    from tests.gpu.check_power import check_clocks_and_throttle, check_energy, check_power

    return [check_power, check_energy, check_clocks_and_throttle]


CHECKS += _power_checks()


def run_checks(alloc_bytes: int = ALLOC_BYTES) -> list[Result]:
    probe = NvmlProbe()
    try:
        before = probe.read()
        with child_holding(alloc_bytes) as pid:
            ctx = Context(probe, pid, alloc_bytes, before)
            return [result for check in CHECKS for result in check(ctx)]
    finally:
        probe.close()


def main() -> int:
    reason = no_gpu_reason()
    if reason is not None:
        print(f"SKIPPED: no NVIDIA GPU here ({reason})")
        return SKIPPED
    try:
        results = run_checks()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"FAILED: {exc}")
        return 1
    for result in results:
        print(f"{'ok  ' if result.ok else 'FAIL'} {result.name}: {result.detail}")
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
