"""HostProbe looks up what hardly ever changes (core count, thermal zones) once a minute, not every tick."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from trayapp.sources import host
from trayapp.sources.host import STATIC_REFRESH_S, HostProbe


def test_core_count_and_thermal_zones_are_looked_up_once_a_minute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    zone = tmp_path / "thermal_zone0"
    zone.mkdir()
    (zone / "temp").write_text("41000\n")
    lookups: list[str] = []

    def zones() -> list[Path]:
        lookups.append("zones")
        return [zone]

    monkeypatch.setattr(host, "thermal_zones", zones)
    now_s = [100.0]
    probe = HostProbe(clock=lambda: now_s[0])
    first = probe.read()
    assert first.cpu_count == psutil.cpu_count(logical=True) and first.thermal_max_c == 41.0
    (zone / "temp").write_text("52000\n")  # the temperature itself is read every tick
    now_s[0] += STATIC_REFRESH_S - 1
    assert probe.read().thermal_max_c == 52.0
    assert lookups == ["zones"]
    now_s[0] += 1
    probe.read()
    assert lookups == ["zones", "zones"]


@pytest.mark.skipif(not host._LINUX, reason="cpufreq policies are Linux's")
def test_a_clock_without_cpufreq_is_read_once_a_minute_with_policies_every_tick(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads: list[object] = []
    policies: list[Path] = []

    def frequency_mhz(listed: list[Path]) -> tuple[float, float | None]:
        reads.append(list(listed))
        return (2600.0, None) if not listed else (1800.0, 3600.0)

    monkeypatch.setattr(host, "cpu_freq_policies", lambda: policies)
    monkeypatch.setattr(host, "cpu_frequency_mhz", frequency_mhz)
    now_s = [0.0]
    probe = HostProbe(clock=lambda: now_s[0])
    first = probe.read()
    assert (first.cpu_freq_mhz, first.cpu_freq_max_mhz) == (2600.0, None)
    now_s[0] = STATIC_REFRESH_S - 1
    probe.read()
    assert reads == [[]]  # no cpufreq (a VM): no maximum, nothing to throttle against
    policies.append(tmp_path / "policy0")
    now_s[0] = STATIC_REFRESH_S  # the policies and the policy-less clock are listed again
    probe.read()
    now_s[0] += 1
    read = probe.read()
    assert (read.cpu_freq_mhz, read.cpu_freq_max_mhz) == (1800.0, 3600.0)
    assert reads == [[], [tmp_path / "policy0"], [tmp_path / "policy0"]]  # with policies: every tick
