"""Per-process GPU memory without NVML (#21): the kernel's DRM client stats on a fake /proc, and Apple.

The fdinfo files follow the kernel's Documentation/gpu/drm-usage-stats.rst ("DRM client usage stats"):
`drm-driver` (mandatory), `drm-pdev` (PCI slot address), `drm-client-id` (one per drm_file: "used to
distinguish duplicated and shared file descriptors" — "userspace should make sure to not double
account"), `drm-memory-<region>` (deprecated alias of `drm-resident-<region>`), `drm-total-`,
`drm-resident-`, values "<uint> [KiB|MiB]", bytes by default. The older amdgpu lines are those
drivers/gpu/drm/amd/amdgpu/amdgpu_fdinfo.c prints (`pasid`, `drm-memory-vram: N KiB`,
`drm-memory-gtt: N KiB`); the newer ones drm_print_memory_stats' (`drm-total-vram`, `drm-shared-vram`,
`drm-resident-vram`); xe names its device memory `vram0`. Expected sizes are worked by hand.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tests.support.fake_gpu_machines import RX_7900_XTX, FakeMac, host_memory, make_card
from trayapp.core.hardware_readings import GpuProcess
from trayapp.core.vram_holders import OTHER_USER
from trayapp.sources.gpu import AppleProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.gpu_processes import (
    DrmClientReader,
    apple_memory_pressure,
    device_memory_bytes,
    largest_memory_users,
    memory_bytes,
    parse_fdinfo,
)
from trayapp.sources.processes import process_name

CARD1, CARD2 = "0000:03:00.1", "0000:03:00.2"  # make_card's PCI addresses for card1, card2
OLD_AMDGPU = """pos:\t0
flags:\t02100002
mnt_id:\t24
ino:\t1068
drm-driver:\tamdgpu
drm-pdev:\t{pdev}
pasid:\t32771
drm-client-id:\t{client}
drm-memory-vram:\t{vram_kib} KiB
drm-memory-gtt: \t2048 KiB
drm-memory-cpu: \t0 KiB
drm-engine-gfx:\t1186312500 ns
"""
NEW_AMDGPU = """pos:\t0
flags:\t02100002
drm-driver:\tamdgpu
drm-client-id:\t{client}
drm-pdev:\t{pdev}
pasid:\t32780
drm-total-cpu:\t0
drm-shared-cpu:\t0
drm-total-gtt:\t14 MiB
drm-shared-gtt:\t0
drm-resident-gtt:\t14 MiB
drm-total-vram:\t{total}
drm-shared-vram:\t20480 KiB
drm-resident-vram:\t{resident}
amd-evicted-vram:\t0
"""
XE = """drm-driver:\txe
drm-client-id:\t{client}
drm-pdev:\t0000:0c:00.0
drm-total-system:\t0
drm-total-gtt:\t4 MiB
drm-total-vram0:\t{total}
drm-resident-vram0:\t{resident}
drm-total-stolen:\t0
"""


def fd(proc: Path, pid: int, number: int, target: str, fdinfo: str) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "fdinfo").mkdir(parents=True, exist_ok=True)
    os.symlink(target, proc / str(pid) / "fd" / str(number))
    (proc / str(pid) / "fdinfo" / str(number)).write_text(fdinfo)


def fake_proc(root: Path) -> Path:
    proc = root / "proc"
    # 2001: an old amdgpu client 17 on card1, 2 GiB of VRAM, open twice (a dup'ed fd) and inherited by
    # its child 2002: counted once, for 2001.
    client17 = OLD_AMDGPU.format(pdev=CARD1, client=17, vram_kib=2_097_152)
    fd(proc, 2001, 5, "/dev/dri/renderD129", client17)
    fd(proc, 2001, 9, "/dev/dri/renderD129", client17)
    fd(proc, 2002, 5, "/dev/dri/renderD129", client17)
    # 3003: two clients on card1 (the newer keys: resident counts, total does not), one on card2.
    fd(
        proc,
        3003,
        4,
        "/dev/dri/renderD129",
        NEW_AMDGPU.format(client=21, pdev=CARD1, total="1600000 KiB", resident="1536000 KiB"),
    )
    fd(
        proc,
        3003,
        6,
        "/dev/dri/card1",
        NEW_AMDGPU.format(client=22, pdev=CARD1, total="600 MiB", resident="512 MiB"),
    )
    fd(
        proc,
        3003,
        7,
        "/dev/dri/renderD130",
        NEW_AMDGPU.format(client=5, pdev=CARD2, total="3 MiB", resident="1024"),
    )
    # 4004: not a DRM file (its fdinfo has no drm- keys), and an Intel xe client (another driver).
    fd(proc, 4004, 3, "/dev/null", "pos:\t0\nflags:\t0100002\n")
    fd(proc, 4004, 8, "/dev/dri/renderD128", XE.format(client=3, total="8 MiB", resident="6 MiB"))
    (proc / "self").mkdir()  # not a pid
    return proc


def test_units_and_regions_from_the_kernel_doc() -> None:
    assert memory_bytes("12 KiB") == 12_288
    assert memory_bytes("3 MiB") == 3_145_728
    assert memory_bytes("1024") == 1024  # bytes by default
    assert memory_bytes("2 GiB?") is None and memory_bytes("") is None
    keys = parse_fdinfo(NEW_AMDGPU.format(client=1, pdev=CARD1, total="600 MiB", resident="512 MiB"))
    assert keys["drm-client-id"] == "1" and "pasid" not in keys and "amd-evicted-vram" not in keys
    assert device_memory_bytes(keys) == 536_870_912  # resident, not total; gtt and cpu are not VRAM
    assert (
        device_memory_bytes(parse_fdinfo(XE.format(client=1, total="8 MiB", resident="6 MiB"))) == 6_291_456
    )
    assert device_memory_bytes(parse_fdinfo("drm-driver:\tamdgpu\ndrm-total-vram:\t4096 KiB\n")) == 4_194_304
    assert device_memory_bytes(parse_fdinfo("drm-driver:\ti915\ndrm-total-system0:\t4 MiB\n")) is None


def test_amd_per_process_vram_from_fdinfo(tmp_path: Path) -> None:
    names = {2001: "firefox", 2002: "firefox", 3003: "llama-server", 4004: "gnome-shell"}
    reader = DrmClientReader(fake_proc(tmp_path), name_of_pid=names.get)
    # card1: 2001: 2_097_152 KiB × 1024 = 2_147_483_648 B (client 17 once, not three times);
    # 3003: 1_536_000 KiB × 1024 = 1_572_864_000 + 512 MiB 536_870_912 = 2_109_734_912 B.
    assert reader.processes("amdgpu", CARD1, only_device=False) == (
        GpuProcess(2001, "firefox", 2_147_483_648),
        GpuProcess(3003, "llama-server", 2_109_734_912),
    )
    assert reader.processes("amdgpu", CARD2, only_device=False) == (GpuProcess(3003, "llama-server", 1024),)
    assert reader.processes("xe", "0000:0c:00.0", only_device=False) == (
        GpuProcess(4004, "gnome-shell", 6_291_456),
    )

    # Through the probe: card1 and card2 are matched to their clients by PCI address.
    make_card(tmp_path / "sys", "card1", "amdgpu", RX_7900_XTX)
    make_card(tmp_path / "sys", "card2", "amdgpu", RX_7900_XTX)
    first, second = AmdSysfsProbe(tmp_path / "sys", reader).read()
    assert [p.used_bytes for p in first.processes] == [2_147_483_648, 2_109_734_912]
    assert second.processes == (GpuProcess(3003, "llama-server", 1024),)


def test_no_proc_means_no_processes(tmp_path: Path) -> None:
    make_card(tmp_path / "sys", "card1", "amdgpu", RX_7900_XTX)
    (gpu,) = AmdSysfsProbe(tmp_path / "sys", DrmClientReader(tmp_path / "nothing")).read()
    assert gpu.processes == ()


def test_a_process_we_may_not_read_is_another_users(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(pid: int) -> None:
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(psutil, "Process", denied)
    assert process_name(1) == OTHER_USER


def test_a_gone_process_has_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(pid: int) -> None:
        raise psutil.NoSuchProcess(pid)

    monkeypatch.setattr(psutil, "Process", gone)
    assert process_name(1) is None


def test_apple_names_the_largest_ram_users_and_the_memory_pressure() -> None:
    rows = [
        {"pid": 10, "name": "WindowServer", "memory_info": SimpleNamespace(rss=900_000_000)},
        {"pid": 11, "name": "ollama", "memory_info": SimpleNamespace(rss=21_000_000_000)},
        {"pid": 12, "name": None, "memory_info": SimpleNamespace(rss=2_000_000_000)},  # not ours to read
        {"pid": 13, "name": "zombie", "memory_info": None},
        {"pid": 14, "name": "Safari", "memory_info": SimpleNamespace(rss=3_100_000_000)},
    ]

    def process_iter(attrs: list[str]) -> list[SimpleNamespace]:
        assert attrs == ["pid", "name", "memory_info"]
        return [SimpleNamespace(info=row) for row in rows]

    assert largest_memory_users(3, process_iter) == (
        GpuProcess(11, "ollama", 21_000_000_000),
        GpuProcess(14, "Safari", 3_100_000_000),
        GpuProcess(12, OTHER_USER, 2_000_000_000),
    )
    assert [apple_memory_pressure(x) for x in ("1", "2", "4", "", None, "x")] == [
        "normal",
        "warning",
        "critical",
        None,
        None,
        None,
    ]
    mac = FakeMac("Apple M4 Max", 64 * 2**30, 40)
    mac.outputs[("sysctl", "-n", "kern.memorystatus_vm_pressure_level")] = "2"
    users = (GpuProcess(11, "ollama", 21_000_000_000),)
    (gpu,) = AppleProbe(mac, platform="darwin", host_memory=host_memory, memory_users=lambda: users).read()
    assert gpu.processes == users and gpu.processes_rss and gpu.memory_pressure == "warning"


def test_the_real_proc_does_not_raise() -> None:
    clients = DrmClientReader().clients()
    assert all(c.vram_bytes >= 0 and c.driver for c in clients)
