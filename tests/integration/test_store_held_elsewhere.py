"""A recording monitor (the tray's) that finds the store held by another process: not recording, said
as its store error while that lasts (the tray's menu and its "recording again" notification follow
it), and the store tried again every STORE_RETRY_S — it records once the other process lets go (a
`llm-tray proxy` or `watch` started first used to leave the tray unrecorded until it restarted).
The other process is a real writer of the real store (its lock is flock's, one per open file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trayapp.config import paths
from trayapp.config.settings import Settings
from trayapp.services.monitor import STORE_RETRY_S, Monitor
from trayapp.sinks.store import Store, StoreLockedError
from trayapp.sources.energy import HostEnergyProbe, MacmonProbe, RaplProbe
from trayapp.sources.gpu import AppleProbe, NvmlProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.hardware import HardwareProbe


def _monitor(tmp_path: Path, now_s: list[float]) -> Monitor:
    none = tmp_path / "nothing"
    hardware = HardwareProbe(
        NvmlProbe(driver_absent=lambda: True), AmdSysfsProbe(none), AppleProbe(platform="linux"),
        energy_probe=HostEnergyProbe(RaplProbe(none), MacmonProbe(platform="linux")),
    )  # fmt: skip
    return Monitor(
        Settings(), record=True, measure_ram=False, discover=False, hardware_probe=hardware,
        clock=lambda: now_s[0],
    )  # fmt: skip


def test_the_tray_records_once_the_process_holding_the_store_lets_go(tmp_path: Path) -> None:
    now_s = [1000.0]
    other = Store(paths.store_file(), writer=True)  # `llm-tray proxy`, started first
    monitor = _monitor(tmp_path, now_s)
    try:
        held = monitor.store_error
        assert held is not None and held.startswith("not recording: another llm-tray process (pid")
        assert not [w for w in monitor.warnings if "not recording" in w]  # said once, as the store's state
        now_s[0] += STORE_RETRY_S
        monitor.tick(budget_s=0.2)
        assert monitor.store_error == held  # still held: tried, still not recording

        other.close()
        now_s[0] += STORE_RETRY_S / 2
        monitor.tick(budget_s=0.2)
        assert monitor.store_error == held  # not tried again before its time
        now_s[0] += STORE_RETRY_S / 2
        monitor.tick(budget_s=0.2)
        assert monitor.store_error is None  # recording
        with pytest.raises(StoreLockedError):
            Store(paths.store_file(), writer=True)  # the tray's monitor holds it now
    finally:
        monitor.close()
        other.close()
    with Store(paths.store_file(), writer=True) as after:  # closing the monitor let go of it
        assert after.writer
