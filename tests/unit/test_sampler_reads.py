"""The sampler's cheaper reads (issue #26) give what psutil and pynvml gave: RAM from /proc/meminfo's
lines, the CPU load from /proc/stat, the CPU frequency from kept cpufreq policies, a process's CPU time
from /proc/PID/stat, AMD cards and other listings kept for STATIC_REFRESH_S, and no pynvml import where
there is no NVIDIA driver."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.fake_gpu_machines import RX_7900_XTX, make_card
from trayapp.sources import cpu_state
from trayapp.sources.cpu_state import cpu_freq_policies, cpu_frequency_mhz
from trayapp.sources.gpu import NO_NVML_LIBRARY, NvmlProbe, nvidia_driver_absent
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.host import CpuLoad, busy_percent, meminfo_bytes, proc_stat_cpu_ticks, ram_bytes
from trayapp.sources.processes import CpuActivity, proc_stat_cpu_seconds
from trayapp.sources.procfs import read_bytes
from trayapp.sources.relisted import STATIC_REFRESH_S, Relisted

LINUX = sys.platform.startswith("linux")
needs_linux = pytest.mark.skipif(not LINUX, reason="reads Linux's /proc and /sys")

MEMINFO = """\
MemTotal:       24576000 kB
MemFree:         1000000 kB
MemAvailable:   12000000 kB
Buffers:          100000 kB
Cached:          9000000 kB
"""


# --------------------------------------------------------------------------- RAM


def test_meminfo_gives_total_and_available_in_bytes(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    assert meminfo_bytes(path) == (24_576_000 * 1024, 12_000_000 * 1024)


def test_meminfo_available_above_total_is_free_as_psutil_says(tmp_path: Path) -> None:
    path = tmp_path / "meminfo"  # a container's distorted figures (psutil: avail > total -> free)
    path.write_text(MEMINFO.replace("12000000", "30000000"))
    assert meminfo_bytes(path) == (24_576_000 * 1024, 1_000_000 * 1024)


NO_AVAILABLE = MEMINFO.replace("MemAvailable:   12000000 kB\n", "")
ZERO_AVAILABLE = MEMINFO.replace("MemAvailable:   12000000", "MemAvailable:   0")


@pytest.mark.parametrize("text", [ZERO_AVAILABLE, NO_AVAILABLE, "garbage\n"])
def test_meminfo_without_available_leaves_it_to_psutil(tmp_path: Path, text: str) -> None:
    path = tmp_path / "meminfo"
    path.write_text(text)
    assert meminfo_bytes(path) is None
    assert meminfo_bytes(tmp_path / "missing") is None


@needs_linux
def test_ram_matches_psutil_on_this_machine() -> None:
    total_bytes, available_bytes = ram_bytes()
    vm = psutil.virtual_memory()
    assert total_bytes == vm.total
    assert abs(available_bytes - vm.available) < vm.total * 0.05  # other processes move it between reads


# --------------------------------------------------------------------------- CPU frequency


def _cpufreq(root: Path, policies: dict[str, tuple[int | None, int]]) -> None:
    """policyN -> (scaling_cur_freq kHz or None for none, scaling_max_freq kHz)."""
    for name, (cur_khz, max_khz) in policies.items():
        folder = root / "devices" / "system" / "cpu" / "cpufreq" / name
        folder.mkdir(parents=True)
        if cur_khz is not None:
            (folder / "scaling_cur_freq").write_text(f"{cur_khz}\n")
        (folder / "scaling_max_freq").write_text(f"{max_khz}\n")
        (folder / "scaling_min_freq").write_text("400000\n")


def _cpuinfo(proc: Path, mhz: list[float]) -> None:
    proc.mkdir(exist_ok=True)
    blocks = [f"processor\t: {i}\nmodel name\t: X\ncpu MHz\t\t: {value}\ncache size\t: 1 KB\n"
              for i, value in enumerate(mhz)]  # fmt: skip
    (proc / "cpuinfo").write_text("\n".join(blocks))


def test_policies_are_listed_in_cpu_order(tmp_path: Path) -> None:
    _cpufreq(tmp_path, {"policy10": (1, 2), "policy2": (1, 2), "policy0": (1, 2)})
    assert [p.name for p in cpu_freq_policies(tmp_path)] == ["policy0", "policy2", "policy10"]
    assert cpu_freq_policies(tmp_path / "none") == []


def test_current_comes_from_cpuinfo_when_it_lists_as_many_cpus(tmp_path: Path) -> None:
    _cpufreq(tmp_path, {"policy0": (800_000, 4_000_000), "policy1": (900_000, 3_000_000)})
    _cpuinfo(tmp_path / "proc", [2000.0, 3000.0])
    policies = cpu_freq_policies(tmp_path)
    # current: (2000 + 3000) / 2 from cpuinfo; maximum: (4000 + 3000) / 2 MHz
    assert cpu_frequency_mhz(policies, tmp_path, tmp_path / "proc") == (2500.0, 3500.0)


def test_current_comes_from_the_policies_otherwise_and_an_offline_cpu_counts_zero(tmp_path: Path) -> None:
    _cpufreq(tmp_path, {"policy0": (1_200_000, 4_000_000), "policy1": (None, 4_000_000),
                        "policy2": (1_800_000, 4_000_000)})  # fmt: skip
    (tmp_path / "devices" / "system" / "cpu" / "cpu1").mkdir()
    (tmp_path / "devices" / "system" / "cpu" / "cpu1" / "online").write_text("0\n")
    _cpuinfo(tmp_path / "proc", [1200.0, 1800.0])  # two online CPUs, three policies
    policies = cpu_freq_policies(tmp_path)
    # (1200 + 0 + 1800) / 3 and (4000 + 0 + 4000) / 3 MHz
    assert cpu_frequency_mhz(policies, tmp_path, tmp_path / "proc") == (1000.0, pytest.approx(8000 / 3))


def test_no_cpufreq_gives_cpuinfo_alone_and_unreadable_gives_none(tmp_path: Path) -> None:
    _cpuinfo(tmp_path / "proc", [2599.998, 2599.998])
    assert cpu_frequency_mhz([], tmp_path, tmp_path / "proc") == (pytest.approx(2599.998), None)
    assert cpu_frequency_mhz([], tmp_path, tmp_path / "nothing") == (None, None)
    _cpufreq(tmp_path, {"policy0": (1_000_000, 2_000_000)})  # the current frequency file is missing:
    (tmp_path / "devices" / "system" / "cpu" / "cpufreq" / "policy0" / "scaling_cur_freq").unlink()
    _cpuinfo(tmp_path / "proc", [])
    assert cpu_frequency_mhz(cpu_freq_policies(tmp_path), tmp_path, tmp_path / "proc") == (None, None)


@needs_linux
def test_cpu_frequency_matches_psutil_on_this_machine() -> None:
    mine_mhz, mine_max_mhz = cpu_frequency_mhz(cpu_freq_policies())
    theirs = psutil.cpu_freq()
    if theirs is None or not theirs.current:
        assert mine_mhz is None
        return
    assert mine_max_mhz == (theirs.max or None)  # the maximum does not move between two reads
    assert mine_mhz == pytest.approx(theirs.current, rel=0.5)  # the current may


# --------------------------------------------------------------------------- listings


def test_a_listing_is_looked_up_again_after_its_interval_or_when_expired() -> None:
    now_s = [50.0]
    lookups: list[int] = []
    listing = Relisted(lambda: lookups.append(1) or len(lookups), clock=lambda: now_s[0])
    assert listing.get() == 1
    now_s[0] += STATIC_REFRESH_S - 0.5
    assert listing.get() == 1
    now_s[0] += 0.5
    assert listing.get() == 2
    listing.expire()
    assert listing.get() == 3


def test_amd_cards_are_listed_once_a_minute_and_at_once_when_one_goes(tmp_path: Path) -> None:
    make_card(tmp_path, "card0", "amdgpu", RX_7900_XTX)
    now_s = [0.0]
    probe = AmdSysfsProbe(tmp_path, clock=lambda: now_s[0])
    assert len(probe.read()) == 1
    make_card(tmp_path, "card1", "amdgpu", RX_7900_XTX)  # a second card appears
    now_s[0] += STATIC_REFRESH_S - 1
    assert len(probe.read()) == 1
    now_s[0] += 1
    first, second = probe.read()
    assert (first.vram_total_bytes, second.vram_total_bytes) == (24 * 2**30, 24 * 2**30)
    shutil.rmtree(tmp_path / "class" / "drm" / "card1")  # and goes (the clock has not moved)
    assert len(probe.read()) == 1


# --------------------------------------------------------------------------- a process's CPU time


@needs_linux
def test_proc_stat_fields_after_the_name(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "42").mkdir()
    rest = "S 1 42 42 0 -1 4194560 100 0 0 0"  # fields 3-13
    # a name with a space and a parenthesis; utime 250 and stime 50 ticks (fields 14, 15)
    (tmp_path / "42" / "stat").write_text(f"42 (llama) server) {rest} 250 50 0 0 20 0 4 0 99\n")
    assert proc_stat_cpu_seconds(42, str(tmp_path)) == pytest.approx(300 / ticks)
    assert proc_stat_cpu_seconds(43, str(tmp_path)) is None


@needs_linux
def test_proc_stat_matches_psutil_for_this_process() -> None:
    end_s = time.thread_time() + 0.05
    while time.thread_time() < end_s:  # some CPU of its own to count
        pass
    before = psutil.Process().cpu_times()
    mine_s = proc_stat_cpu_seconds(os.getpid())
    after = psutil.Process().cpu_times()
    assert mine_s is not None
    assert before.user + before.system <= mine_s + 1e-9 <= after.user + after.system + 2e-9
    activity = CpuActivity()
    assert activity.worked(os.getpid(), 1.0) is None  # the first look only marks
    assert activity.mark is not None and activity.mark[1] >= mine_s


# --------------------------------------------------------------------------- NVML


def test_driver_absent_only_on_linux_without_driver_or_library(tmp_path: Path) -> None:
    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    loaded: list[str] = []
    assert nvidia_driver_absent("linux", tmp_path, missing)
    assert not nvidia_driver_absent("linux", tmp_path, loaded.append)  # the library loads: pynvml says why
    assert loaded == ["libnvidia-ml.so.1"]
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    assert not nvidia_driver_absent("linux", tmp_path, missing)  # the driver is loaded
    assert not nvidia_driver_absent("win32", tmp_path / "none", missing)


def test_no_driver_gives_pynvmls_reason_without_pynvml() -> None:
    probe = NvmlProbe(driver_absent=lambda: True)
    assert probe.read() == ()
    assert probe.reason == NO_NVML_LIBRARY == "NVML library not found: no NVIDIA driver"


def test_cpu_state_reads_no_psutil_listing_on_linux(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse() -> None:
        raise AssertionError("psutil.cpu_freq called")

    monkeypatch.setattr(cpu_state.psutil, "cpu_freq", refuse)
    _cpuinfo(tmp_path / "proc", [1000.0])
    assert cpu_frequency_mhz([], tmp_path, tmp_path / "proc") == (1000.0, None)


# --------------------------------------------------------------------------- CPU load and small reads


def test_busy_percent_as_psutil_counts_it() -> None:
    #        user nice system idle iowait irq softirq steal guest guest_nice
    before = [1000, 10, 500, 8000, 100, 0, 20, 0, 50, 0]
    after = [1300, 10, 600, 8500, 200, 0, 40, 0, 150, 0]
    # deltas 300+0+100+500+100+0+20+0 (+100 guest, already in user) = 1020 in all; busy 1020-500-100 = 420
    assert busy_percent(before, after) == round(420 / 1020 * 100, 1) == 41.2
    assert busy_percent(after, before) == 0.0  # counters that went back count nothing
    assert busy_percent(before[:4], [1100, 10, 500, 8100]) == 50.0  # an old kernel's four fields


def test_proc_stat_first_line(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text("cpu  1 2 3 4 5 6 7 8 9 10 11\ncpu0 1 1 1 1 1 1 1 1 1 1\nintr 5 0 0\n")
    assert proc_stat_cpu_ticks(str(path)) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    path.write_text("intr 5 0 0\n")
    assert proc_stat_cpu_ticks(str(path)) is None
    assert proc_stat_cpu_ticks(str(tmp_path / "missing")) is None


@needs_linux
def test_cpu_load_matches_psutil_on_this_machine() -> None:
    load = CpuLoad()
    psutil.cpu_percent(interval=None)
    end_s = time.monotonic() + 0.5
    while time.monotonic() < end_s:  # one core busy: at least 100 / cores % of the machine
        pass
    mine, theirs = load.percent(), psutil.cpu_percent(interval=None)
    assert mine >= 100 / (psutil.cpu_count() or 1) - 10
    assert abs(mine - theirs) < 10


def test_read_bytes_reads_to_the_end_or_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(bytes(range(256)) * 1000)  # 256,000 bytes: several reads
    assert read_bytes(path) == bytes(range(256)) * 1000
    assert read_bytes(path, 1000) == (bytes(range(256)) * 4)[:1000]
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "missing")
