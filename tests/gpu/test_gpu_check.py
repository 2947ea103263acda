"""The GPU check as a test (#21): skipped where there is no NVIDIA GPU; run `pytest -m gpu tests/gpu`
on a machine with one (or `python -m tests.gpu.check` for the report)."""

from __future__ import annotations

import pytest

from tests.gpu.check import no_gpu_reason, run_checks


@pytest.mark.gpu
def test_llm_tray_reads_what_nvidia_smi_reads() -> None:
    reason = no_gpu_reason()
    if reason is not None:
        pytest.skip(f"no NVIDIA GPU here ({reason})")
    results = run_checks()
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert results and not failed, "\n".join(failed)


def test_the_checks_compare_like_with_like_on_a_fake_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's own arithmetic, without a GPU: nvidia-smi's MiB against llm-tray's bytes (a 1 GiB
    allocation plus a 300 MiB CUDA context = 1324 MiB); NVML's used counts a 512 MiB reserve that
    nvidia-smi's memory.used leaves out."""
    from tests.gpu import check
    from trayapp.core.hardware_readings import GpuProcess, GpuReading

    mib = 1 << 20
    child = GpuProcess(4242, "python3", 1324 * mib)
    gpu = GpuReading(
        0, "NVIDIA H200", "nvidia", 143_771 * mib, 2_000 * mib + 512 * mib, 4800.0, processes=(child,)
    )
    answers = {
        "--query-compute-apps=pid,used_memory": [["4242", "1324"]],
        "--query-gpu=index,memory.total,memory.used": [["0", "143771", "2000"]],
        "--query-gpu=index,memory.reserved": [["0", "512"]],
    }
    monkeypatch.setattr(check, "smi", lambda *args: answers[args[0]])

    class Probe:
        def read(self) -> tuple[GpuReading, ...]:
            return (gpu,)

    ctx = check.Context(Probe(), 4242, 1 << 30, before=())  # type: ignore[arg-type]
    results = [r for c in (check.check_process_memory, check.check_gpu_memory) for r in c(ctx)]
    assert [(r.name, r.ok) for r in results] == [
        ("per-process memory = nvidia-smi", True),
        ("per-process memory ≥ the allocation", True),
        ("GPU 0 total memory = nvidia-smi", True),
        ("GPU 0 used memory ≈ nvidia-smi", True),
    ]
    answers["--query-compute-apps=pid,used_memory"] = [["4242", "1300"]]  # 24 MiB apart: a failure
    assert not check.check_process_memory(ctx)[0].ok
