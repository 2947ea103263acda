"""NvmlProbe through a fake pynvml module (tests/support/fake_nvml.py) and the real one."""

from __future__ import annotations

import os
from typing import Any

import psutil
import pytest

from tests.support.fake_nvml import (
    GIB,
    FakeDevice,
    FakeNvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    gb10,
    h100_sxm,
    rtx_4090,
)
from trayapp.sources.gpu import NvmlProbe, nvml_bandwidth_gbps, throttle_names

HOST_RAM = (128 * 10**9, 40 * 10**9)
NAMES = {4242: "llama-server", 777: "Xorg"}


def make_probe(nvml: FakeNvml, **kwargs: Any) -> NvmlProbe:
    return NvmlProbe(nvml, host_memory=lambda: HOST_RAM, name_of_pid=NAMES.get, **kwargs)


# --------------------------------------------------------------------------- bandwidth and static facts


def test_rtx_4090_bandwidth_from_bus_width_and_max_memory_clock() -> None:
    (gpu,) = make_probe(FakeNvml([rtx_4090()])).read()
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    assert gpu.vendor == "nvidia"
    assert gpu.bandwidth_gbps == pytest.approx(1008.1, abs=0.1)
    assert gpu.bandwidth_source == "nvml"
    assert gpu.vram_total_bytes == 24 * GIB
    assert gpu.vram_used_bytes == 1 * GIB
    assert not gpu.unified_memory
    assert (gpu.pcie_max_gen, gpu.pcie_max_width) == (4, 16)


def test_h100_sxm_bandwidth() -> None:
    (gpu,) = make_probe(FakeNvml([h100_sxm()])).read()
    assert gpu.bandwidth_gbps == pytest.approx(3352.3, abs=0.1)
    assert gpu.vram_total_bytes == 80 * GIB


@pytest.mark.parametrize(
    ("bus", "clock", "gbps"),
    [(128, 3504, 112.1), (256, 7000, 448.0), (512, 14001, 1792.1), (4096, 877, 898.0), (6144, 3201, 4916.7)],
)
def test_bandwidth_rule_matches_the_verified_dumps(bus: int, clock: int, gbps: float) -> None:
    assert nvml_bandwidth_gbps(bus, clock) == pytest.approx(gbps, abs=0.1)


def test_two_gpus_keep_their_nvml_indices() -> None:
    gpus = make_probe(FakeNvml([rtx_4090(), h100_sxm()])).read()
    assert [g.index for g in gpus] == [0, 1]
    assert [round(g.bandwidth_gbps or 0) for g in gpus] == [1008, 3352]


def test_static_facts_are_queried_once() -> None:
    nvml = FakeNvml([rtx_4090()])
    probe = make_probe(nvml)
    probe.read()
    nvml.devices[0].bus_width_bits = 128  # would change the bandwidth if it were re-read
    (gpu,) = probe.read()
    assert gpu.bandwidth_gbps == pytest.approx(1008.1, abs=0.1)
    assert nvml.init_calls == 1


# --------------------------------------------------------------------------- unified memory


def test_gb10_unsupported_memory_info_falls_back_to_host_ram() -> None:
    (gpu,) = make_probe(FakeNvml([gb10()])).read()
    assert gpu.unified_memory
    assert gpu.vram_total_bytes == HOST_RAM[0]
    assert gpu.vram_used_bytes == HOST_RAM[1]
    # No bus width / memory clock on GB10: the table's 273 GB/s.
    assert gpu.bandwidth_gbps == 273
    assert gpu.bandwidth_source == "table"


def test_zero_total_memory_also_means_unified() -> None:
    dev = FakeDevice("NVIDIA GB10", 256, 4266, memory=(0, 0))
    (gpu,) = make_probe(FakeNvml([dev])).read()
    assert gpu.unified_memory
    assert gpu.vram_total_bytes == HOST_RAM[0]


# --------------------------------------------------------------------------- per-read telemetry


def test_telemetry_values_and_units() -> None:
    (gpu,) = make_probe(FakeNvml([rtx_4090()])).read()
    assert gpu.util_gpu_pct == 37
    assert gpu.util_mem_pct == 12
    assert gpu.temperature_c == 61
    assert gpu.power_w == pytest.approx(312.5)  # mW -> W


def test_unsupported_queries_give_none_not_exceptions() -> None:
    dev = FakeDevice("NVIDIA GeForce RTX 4090 Laptop GPU", 256, 9001, util=None, temperature_c=None)
    dev.power_mw = None
    dev.reasons = None
    dev.pcie = None
    (gpu,) = make_probe(FakeNvml([dev])).read()
    assert gpu.power_w is None
    assert gpu.temperature_c is None
    assert gpu.util_gpu_pct is None and gpu.util_mem_pct is None
    assert gpu.clocks_event_reasons is None and gpu.throttle_reasons == ()
    assert gpu.pcie_max_gen is None and gpu.pcie_max_width is None
    assert gpu.bandwidth_gbps == pytest.approx(576.0, abs=0.1)  # the rest still reads


def test_unknown_device_without_bus_width_has_no_bandwidth() -> None:
    (gpu,) = make_probe(FakeNvml([FakeDevice("NVIDIA Mystery 9000", None, None)])).read()
    assert gpu.bandwidth_gbps is None
    assert gpu.bandwidth_source == "unknown"
    assert gpu.vram_total_bytes == 24 * GIB


def test_throttle_bits_become_names_and_idle_bits_are_ignored() -> None:
    mask = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100
    assert throttle_names(mask) == (
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
    )
    assert throttle_names(0x1 | 0x2 | 0x100) == ()
    assert throttle_names(None) == ()
    (gpu,) = make_probe(FakeNvml([rtx_4090(reasons=0x1 | 0x20 | 0x4)])).read()
    assert gpu.clocks_event_reasons == 0x25
    assert gpu.throttle_reasons == ("sw_power_cap", "sw_thermal")


def test_clocks_event_reasons_fall_back_to_the_old_throttle_name() -> None:
    nvml = FakeNvml([rtx_4090(reasons=0x40)], no_event_reasons=True)
    (gpu,) = make_probe(nvml).read()
    assert gpu.throttle_reasons == ("hw_thermal",)
    assert nvml.calls.index("EventReasons") < nvml.calls.index("ThrottleReasons")


# --------------------------------------------------------------------------- processes


def test_per_process_memory_from_compute_and_graphics_lists() -> None:
    dev = rtx_4090(compute=[(4242, 20 * GIB)], graphics=[(777, 300 * 2**20), (4242, 20 * GIB)])
    nvml = FakeNvml([dev])
    (gpu,) = make_probe(nvml).read()
    by_pid = {p.pid: p for p in gpu.processes}
    assert set(by_pid) == {777, 4242}  # a process in both lists appears once
    assert by_pid[4242].used_bytes == 20 * GIB
    assert by_pid[4242].name == "llama-server"
    assert by_pid[777].used_bytes == 300 * 2**20
    assert "compute_v2" not in nvml.calls


def test_process_used_memory_may_be_unknown_and_pids_may_vanish() -> None:
    # usedGpuMemory is None under Windows WDDM; pid 9999 has exited (no name).
    dev = rtx_4090(compute=[(4242, None), (9999, 2**64 - 1)])
    (gpu,) = make_probe(FakeNvml([dev])).read()
    by_pid = {p.pid: p for p in gpu.processes}
    assert by_pid[4242].used_bytes is None
    assert by_pid[9999].used_bytes is None  # NVML's "not available" sentinel
    assert by_pid[9999].name is None


def test_v3_function_not_found_falls_back_to_v2() -> None:
    nvml = FakeNvml([rtx_4090(compute=[(4242, 5 * GIB)])], no_v3_processes=True)
    (gpu,) = make_probe(nvml).read()
    assert [(p.pid, p.used_bytes) for p in gpu.processes] == [(4242, 5 * GIB)]
    assert "compute_v3" in nvml.calls and "compute_v2" in nvml.calls


def test_real_process_names_come_from_psutil() -> None:
    impossible_pid = 2**22 + 12345  # above Linux's largest pid_max
    dev = rtx_4090(compute=[(os.getpid(), GIB), (impossible_pid, GIB)])
    (gpu,) = NvmlProbe(FakeNvml([dev])).read()
    by_pid = {p.pid: p.name for p in gpu.processes}
    assert by_pid[os.getpid()] == psutil.Process().name()
    assert by_pid[impossible_pid] is None


# --------------------------------------------------------------------------- init failures


def test_driver_not_loaded_gives_no_gpus_and_a_reason() -> None:
    nvml = FakeNvml([rtx_4090()], init_error=NVMLError_DriverNotLoaded)
    probe = make_probe(nvml)
    assert probe.read() == ()
    assert probe.reason is not None and "driver not loaded" in probe.reason


def test_init_is_not_retried_every_tick_but_after_a_long_interval() -> None:
    now = [1000.0]
    nvml = FakeNvml([rtx_4090()], init_error=NVMLError_LibraryNotFound)
    probe = make_probe(nvml, retry_after_s=600, clock=lambda: now[0])
    for _ in range(5):
        assert probe.read() == ()
        now[0] += 10
    assert nvml.init_calls == 1
    assert probe.reason == "NVML library not found: no NVIDIA driver"
    nvml.init_error = None  # the driver got installed
    now[0] += 600
    (gpu,) = probe.read()
    assert nvml.init_calls == 2
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    assert probe.reason is None


def test_other_init_errors_have_a_generic_reason() -> None:
    class NVMLError_Unknown(NVMLError):
        def __init__(self) -> None:
            super().__init__(999)

    probe = make_probe(FakeNvml([], init_error=NVMLError_Unknown))
    assert probe.read() == ()
    assert probe.reason is not None and probe.reason.startswith("NVML init failed")


def test_no_devices_after_init() -> None:
    probe = make_probe(FakeNvml([]))
    assert probe.read() == ()
    assert probe.reason == "NVML reports no NVIDIA GPU"


def test_close_shuts_nvml_down_only_when_initialised() -> None:
    failed = FakeNvml([], init_error=NVMLError_DriverNotLoaded)
    probe = make_probe(failed)
    probe.read()
    probe.close()
    assert failed.shutdown_calls == 0

    nvml = FakeNvml([rtx_4090()])
    probe = make_probe(nvml)
    probe.read()
    probe.close()
    assert nvml.shutdown_calls == 1
    probe.close()
    assert nvml.shutdown_calls == 1


# --------------------------------------------------------------------------- the real pynvml


def _real_nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_real_pynvml_without_a_driver_gives_a_reason() -> None:
    if _real_nvml_works():
        pytest.skip("this machine has a working NVIDIA driver")
    probe = NvmlProbe()  # the real pynvml module, no fakes
    assert probe.read() == ()
    assert probe.reason is not None and "library" in probe.reason.lower()
    probe.close()


@pytest.mark.gpu
def test_real_nvidia_gpu_readings_are_sane() -> None:
    if not _real_nvml_works():
        pytest.skip("no NVIDIA GPU / driver here")
    probe = NvmlProbe()
    try:
        gpus = probe.read()
        assert gpus, probe.reason
        for gpu in gpus:
            assert gpu.name
            assert gpu.vendor == "nvidia"
            assert gpu.bandwidth_gbps is not None and gpu.bandwidth_gbps > 100
            assert gpu.vram_total_bytes is not None and gpu.vram_total_bytes > 0
            assert gpu.vram_used_bytes is not None and 0 <= gpu.vram_used_bytes <= gpu.vram_total_bytes
            if gpu.temperature_c is not None:
                assert 0 < gpu.temperature_c < 120
            if gpu.power_w is not None:
                assert 0 < gpu.power_w < 2000
        second = probe.read()
        assert [g.name for g in second] == [g.name for g in gpus]
    finally:
        probe.close()
