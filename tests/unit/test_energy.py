"""Energy per request (#21): NVML's counter (and power × time where it is missing), Linux RAPL with a
counter wrap, macmon's JSON lines; idle draw subtracted; unmeasurable figures None with a reason.

Every expected value is worked by hand in the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.support.fake_nvml import FakeNvml, rtx_4090
from tests.support.macmon import MACMON_LINES
from trayapp.core.energy import EnergyMeter, counter_delta_j
from trayapp.core.energy_types import EnergyReading
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.model import RequestRecord
from trayapp.sources.energy import (
    NO_RAPL,
    RAPL_PERMISSION,
    HostEnergyProbe,
    MacmonEnergy,
    MacmonProbe,
    RaplProbe,
    macmon_sample,
)
from trayapp.sources.gpu import NvmlProbe

HOST = HostReading(ram_total_bytes=None, ram_available_bytes=None, ram_bandwidth_gbps=None)
WALL_0 = 1_700_000_000.0  # wall time at monotonic 0 in these tests


class PynvmlShaped(FakeNvml):
    """The fake NVML, raising nvidia-ml-py's own error classes and codes (pynvml.NVMLError maps a
    code to its subclass: NVML_ERROR_NOT_SUPPORTED → NVMLError_NotSupported)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value


def nvml_probe(nvml: FakeNvml) -> NvmlProbe:
    return NvmlProbe(nvml, host_memory=lambda: (64 * 2**30, 8 * 2**30), name_of_pid=lambda pid: None)


def request(finished_mono_s: float, **kwargs: Any) -> RequestRecord:
    return RequestRecord(
        server="http://127.0.0.1:8080",
        server_kind="llamacpp",
        model="m",
        finished_wall_s=WALL_0 + finished_mono_s,
        session_id=None,
        exact=True,
        **kwargs,
    )


def gpu(energy_j: float | None = None, power_w: float | None = None) -> GpuReading:
    return GpuReading(0, "g", "nvidia", None, None, None, energy_j=energy_j, power_w=power_w)


# --------------------------------------------------------------------------- NVML


def test_nvml_energy_counter_power_limit_and_sm_clocks_read_in_joules_watts_and_mhz() -> None:
    nvml = PynvmlShaped(
        [
            rtx_4090(
                energy_mj=123_456_789,
                power_limit_mw=400_000,
                sm_clock_mhz=1605,
                sm_max_clock_mhz=2520,
                power_mw=398_000,
            )
        ]
    )
    (reading,) = nvml_probe(nvml).read()
    assert reading.energy_j == 123_456.789  # 123 456 789 mJ ÷ 1000
    assert reading.power_limit_w == 400.0
    assert reading.power_w == 398.0
    assert (reading.sm_clock_mhz, reading.sm_clock_max_mhz) == (1605.0, 2520.0)


def test_old_card_without_energy_counter_falls_back_to_power_times_time_flagged_estimated() -> None:
    nvml = PynvmlShaped([rtx_4090(energy_mj=None, power_mw=100_000)])  # NVMLError_NotSupported
    probe = nvml_probe(nvml)
    meter = EnergyMeter()
    (first,) = probe.read()
    assert first.energy_j is None
    meter.update(HardwareSnapshot((first,), HOST), 0.0, busy=False)
    nvml.devices[0].power_mw = 200_000
    (second,) = probe.read()
    status = meter.update(HardwareSnapshot((second,), HOST), 2.0, busy=False)
    # trapezoid: (100 W + 200 W) / 2 × 2 s = 300 J
    (domain,) = status.domains
    assert (domain.domain, domain.source, domain.total_j, domain.estimated) == (
        "gpu0",
        "nvml-power",
        300.0,
        True,
    )
    assert status.power_w == 150.0  # 300 J over 2 s
    assert status.estimated


# --------------------------------------------------------------------------- the meter


def ticks(meter: EnergyMeter, counters_j: list[float], busy: list[bool], wrap_j: float | None = None) -> None:
    for t, (counter, is_busy) in enumerate(zip(counters_j, busy, strict=True)):
        reading = HardwareSnapshot(
            (),
            HOST,
            energy=(EnergyReading("package-0", "rapl", counter_j=counter, wrap_j=wrap_j),),
        )
        meter.update(reading, float(t), busy=is_busy)


def test_counter_delta_undoes_one_wrap_and_refuses_a_reset() -> None:
    assert counter_delta_j(90.0, 70.0, 100.0) == pytest.approx(80.0)  # 10 J to the top, 70 J after
    assert counter_delta_j(90.0, 70.0, None) is None  # went back, range unknown: a reset


def test_request_energy_with_a_counter_wrap_idle_subtracted() -> None:
    meter = EnergyMeter()
    # t = 0..4 idle at 20 J per 1 s tick (20 W); the counter wraps at 100 J between t=4 and t=5.
    counters = [10.0, 30.0, 50.0, 70.0, 90.0, 70.0, 60.0]
    busy = [False, False, False, False, False, True, True]
    ticks(meter, counters, busy, wrap_j=100.0)
    assert meter.idle_w == 20.0  # four idle intervals of 20 J / 1 s
    # Prefill [4, 5]: 90 → 70 across the wrap = 10 + 70 = 80 J; decode [5, 6]: 70 → 60 = 30 + 60 = 90 J.
    record = request(6.0, prompt_tokens=200, prompt_tok_s=200.0, decode_tokens=50, decode_tok_s=50.0)
    out = meter.attribute(record, -WALL_0)
    assert out.energy_prefill_j == pytest.approx(80.0 - 20.0 * 1.0)  # 60 J above idle
    assert out.energy_decode_j == pytest.approx(90.0 - 20.0 * 1.0)  # 70 J above idle
    assert out.energy_j_per_token == pytest.approx(70.0 / 50)  # 1.4 J/token
    assert out.energy_idle_w == 20.0
    assert out.energy_source == "rapl"
    assert not out.energy_estimated
    assert out.energy_reason is None


def test_a_span_shorter_than_a_tick_takes_its_share_of_the_tick() -> None:
    meter = EnergyMeter()
    ticks(meter, [10.0, 30.0, 50.0, 70.0, 90.0, 70.0, 60.0], [False] * 5 + [True] * 2, wrap_j=100.0)
    record = request(6.0, decode_tokens=10, decode_tok_s=20.0)  # 0.5 s: [5.5, 6]
    out = meter.attribute(record, -WALL_0)
    assert out.energy_decode_j == pytest.approx(90.0 * 0.5 - 20.0 * 0.5)  # 35 J
    assert out.energy_j_per_token == pytest.approx(3.5)
    assert out.energy_prefill_j is None
    assert out.energy_reason == "prefill: its duration is unknown"


def test_idle_draw_not_measured_yet_gives_none_with_the_reason_never_zero() -> None:
    meter = EnergyMeter()
    ticks(meter, [10.0, 30.0, 60.0], [False, True, True])
    out = meter.attribute(request(2.0, decode_tokens=10, decode_tok_s=10.0), -WALL_0)
    assert out.energy_decode_j is None
    assert out.energy_j_per_token is None
    assert "idle draw not measured yet" in (out.energy_reason or "")


def test_no_energy_source_at_all_says_why() -> None:
    meter = EnergyMeter()
    hardware = HardwareSnapshot((), HOST, energy_reason=NO_RAPL)
    for t in range(5):
        meter.update(hardware, float(t), busy=False)
    out = meter.attribute(request(4.0, decode_tokens=10, decode_tok_s=10.0), -WALL_0)
    assert out.energy_decode_j is None and out.energy_prefill_j is None
    assert NO_RAPL in (out.energy_reason or "")
    assert meter.status().reason == NO_RAPL


def test_a_request_that_began_before_energy_was_read_is_not_measured() -> None:
    meter = EnergyMeter()
    ticks(meter, [10.0, 30.0, 50.0, 70.0, 90.0], [False] * 5)
    out = meter.attribute(request(4.0, decode_tokens=100, decode_tok_s=10.0), -WALL_0)  # [-6, 4]
    assert out.energy_decode_j is None
    assert "not read through the whole span" in (out.energy_reason or "")


def test_nvml_and_rapl_together_sum_per_tick() -> None:
    meter = EnergyMeter()
    for t in range(6):
        busy = t == 5
        gpu_j = 1000.0 + 50.0 * t + (250.0 if busy else 0.0)  # 50 W idle, 300 J in the busy tick
        cpu_j = 5.0 + 10.0 * t  # 10 W throughout
        hardware = HardwareSnapshot(
            (gpu(energy_j=gpu_j),), HOST, energy=(EnergyReading("package-0", "rapl", counter_j=cpu_j),)
        )
        meter.update(hardware, float(t), busy=busy)
    assert meter.idle_w == 60.0  # 50 W + 10 W
    out = meter.attribute(request(5.0, decode_tokens=31, decode_tok_s=31.0), -WALL_0)
    assert out.energy_decode_j == pytest.approx(300.0 + 10.0 - 60.0)  # 250 J
    assert out.energy_source == "nvml+rapl"


# --------------------------------------------------------------------------- RAPL sysfs


def rapl_tree(root: Path, energy_uj: int, max_range_uj: int = 262_143_328_850) -> Path:
    """The shape of the kernel's powercap tree (Documentation/power/powercap/powercap.rst): a package
    zone with name, energy_uj and max_energy_range_uj, a sub-zone, psys (not a package), and the MMIO
    copy of the package some Intel CPUs add."""
    cap = root / "class" / "powercap"
    package = cap / "intel-rapl:0"
    package.mkdir(parents=True)
    (package / "name").write_text("package-0\n")
    (package / "energy_uj").write_text(f"{energy_uj}\n")
    (package / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    core = cap / "intel-rapl:0:0"
    core.mkdir()
    (core / "name").write_text("core\n")
    (core / "energy_uj").write_text("1\n")
    psys = cap / "intel-rapl:1"
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("7\n")
    mmio = cap / "intel-rapl-mmio:0"  # newer Intel: the same package again through MMIO (not summed twice)
    mmio.mkdir()
    (mmio / "name").write_text("package-0\n")
    (mmio / "energy_uj").write_text("9\n")
    return package / "energy_uj"


def test_rapl_fake_sysfs_counter_wrap_gives_the_hand_computed_request_energy(tmp_path: Path) -> None:
    max_uj = 262_143_328_850
    counter = rapl_tree(tmp_path, max_uj - 80_000_000)  # 80 J below the top
    probe = RaplProbe(tmp_path)
    meter = EnergyMeter()
    # idle at 15 W for 4 s, then 2 s of decode at 115 W: the counter wraps during the first busy second.
    values_uj = [max_uj - 80_000_000 + 15_000_000 * t for t in range(5)]  # ends 20 J below the top
    values_uj += [95_000_000, 210_000_000]  # 20 J to the top + 95 J after it; then 115 J more
    assert values_uj[4] == max_uj - 20_000_000
    for t, value in enumerate(values_uj):
        counter.write_text(f"{value}\n")
        readings = probe.read()
        meter.update(HardwareSnapshot((), HOST, energy=readings), float(t), busy=t >= 5)
    (reading,) = probe.read()
    assert reading.domain == "package-0" and reading.wrap_j == pytest.approx(262_143.32885)
    assert meter.idle_w == pytest.approx(15.0)
    out = meter.attribute(request(6.0, decode_tokens=100, decode_tok_s=50.0), -WALL_0)  # decode [4, 6]
    assert out.energy_decode_j == pytest.approx(2 * 115.0 - 2 * 15.0)  # 200 J above idle
    assert out.energy_j_per_token == pytest.approx(2.0)


def test_rapl_unreadable_without_permission_says_how_to_allow_it(tmp_path: Path) -> None:
    rapl_tree(tmp_path, 5)

    def read_text(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return path.read_text().strip()

    (reading,) = RaplProbe(tmp_path, read_text=read_text).read()
    assert reading.counter_j is None and reading.reason == RAPL_PERMISSION
    assert "chmod" in RAPL_PERMISSION and "udev" in RAPL_PERMISSION and "CVE-2020-8694" in RAPL_PERMISSION
    meter = EnergyMeter()
    for t in range(5):
        meter.update(HardwareSnapshot((), HOST, energy=(reading,)), float(t), busy=False)
    out = meter.attribute(request(4.0, decode_tokens=10, decode_tok_s=10.0), -WALL_0)
    assert out.energy_decode_j is None and RAPL_PERMISSION in (out.energy_reason or "")


def test_rapl_zones_are_listed_once_a_minute_and_again_when_one_goes(tmp_path: Path) -> None:
    now_s = [0.0]
    looked: list[str] = []

    def read_text(path: Path) -> str:
        looked.append(f"{path.parent.name}/{path.name}")
        return path.read_text().strip()

    probe = RaplProbe(tmp_path, read_text=read_text, clock=lambda: now_s[0])
    assert probe.read() == () and probe.reason == NO_RAPL  # no powercap tree yet
    counter = rapl_tree(tmp_path, 2_000_000)
    now_s[0] = 59.0
    assert probe.read() == ()  # listed at 0 s: seen at the next listing
    now_s[0] = 60.0
    (reading,) = probe.read()
    assert (reading.domain, reading.counter_j, reading.wrap_j) == ("package-0", 2.0, 262_143.32885)
    looked.clear()
    counter.write_text("5000000\n")
    now_s[0] = 61.0
    (reading,) = probe.read()
    assert reading.counter_j == 5.0
    assert looked == ["intel-rapl:0/energy_uj"]  # a tick reads the counter alone
    for name in ("energy_uj", "name", "max_energy_range_uj"):
        (counter.parent / name).unlink()
    counter.parent.rmdir()  # the module unloaded: gone at once, listed again at the next read
    assert probe.read() == () and probe.reason == NO_RAPL
    looked.clear()
    assert probe.read() == ()
    assert "intel-rapl:1/name" in looked  # listed again


def test_no_powercap_tree_is_a_reason(tmp_path: Path) -> None:
    probe = HostEnergyProbe(RaplProbe(tmp_path), MacmonProbe(platform="linux"))
    assert probe.read() == ()
    assert probe.reason == NO_RAPL


# --------------------------------------------------------------------------- macmon

# MACMON_LINES (tests/support/macmon.py): two lines as `macmon pipe -i 1000` prints them.


def test_macmon_lines_integrate_all_power_over_each_interval() -> None:
    assert macmon_sample(MACMON_LINES[0]) == (pytest.approx(1740429495.427569), 0.22231553)
    assert macmon_sample("not json") is None
    energy = MacmonEnergy(interval_s=1.0)
    energy.feed(MACMON_LINES[0])
    assert energy.energy_j == pytest.approx(0.22231553)  # × its 1 s interval
    energy.feed(MACMON_LINES[1])
    assert energy.energy_j == pytest.approx(0.22231553 + 21.75 * 1.0)


def test_macmon_missing_on_macos_is_a_reason() -> None:
    probe = MacmonProbe(platform="darwin", which=lambda name: None)
    assert probe.read() == ()
    assert probe.reason is not None and "macmon is not installed" in probe.reason


def test_a_prefill_whose_end_is_unknown_is_not_placed_by_guess() -> None:
    meter = EnergyMeter()
    ticks(meter, [10.0, 30.0, 50.0, 70.0, 90.0, 70.0, 60.0], [False] * 5 + [True] * 2, wrap_j=100.0)
    unplaced = request(6.0, prompt_tokens=200, prompt_tok_s=200.0, decode_tokens=50)  # no decode rate
    out = meter.attribute(unplaced, -WALL_0)
    assert out.energy_prefill_j is None and out.energy_decode_j is None
    assert out.energy_reason == (
        "decode: its duration is unknown; prefill: when it ended is unknown (so is the decode's duration)"
    )
    refused = request(6.0, prompt_tokens=200, prompt_tok_s=200.0)  # nothing decoded: prefill ends at 6
    out = meter.attribute(refused, -WALL_0)
    assert out.energy_prefill_j == pytest.approx(90.0 - 20.0)  # [5, 6]
    assert out.energy_reason == "decode: no token decoded"
