"""The GPU check's power, energy and throttle checks on a fake machine (#21 part B): their own arithmetic,
without a GPU. nvidia-smi answers as it prints them (W, MHz, a hex clock-event mask); a 400 W-capped
H200 drawing 398 W whose energy counter gains 796 J in the 2 s window (398 W)."""

from __future__ import annotations

import pytest

from tests.gpu import check, check_power
from trayapp.core.hardware_readings import GpuReading


def h200(energy_j: float, reasons: tuple[str, ...] = ("sw_power_cap",)) -> GpuReading:
    return GpuReading(
        0, "NVIDIA H200", "nvidia", None, None, 4800.0, power_w=398.0, power_limit_w=400.0,
        energy_j=energy_j, sm_clock_mhz=1605.0, sm_clock_max_mhz=1980.0, throttle_reasons=reasons,
    )  # fmt: skip


class Probe:
    def __init__(self, readings: list[GpuReading]) -> None:
        self.readings = readings

    def read(self) -> tuple[GpuReading, ...]:
        return (self.readings.pop(0) if len(self.readings) > 1 else self.readings[0],)


def test_power_energy_and_throttle_checks_on_a_fake_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "power.draw,enforced.power.limit": {0: ["397.40", "400.00"]},
        "power.draw": {0: ["398.10"]},
        "clocks.sm,clocks.max.sm,clocks_event_reasons.active": {0: ["1605", "1980", "0x0000000000000004"]},
    }
    monkeypatch.setattr(check_power, "query_gpu", lambda fields: answers[fields])
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(check_power.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(check_power.time, "sleep", lambda s: None)

    ctx = check.Context(Probe([h200(10_000.0)]), 4242, 1 << 30, before=())  # type: ignore[arg-type]
    assert all(r.ok for r in check_power.check_power(ctx))
    ctx.probe = Probe([h200(10_000.0), h200(10_796.0)])  # type: ignore[assignment]
    energy = check_power.check_energy(ctx)
    assert [(r.name, r.ok) for r in energy] == [
        ("GPU 0 energy counter delta ≈ nvidia-smi power × time", True),  # 796 J / 2 s = 398 W
        ("GPU 0 energy counter delta = the meter's", True),
    ]
    ctx.probe = Probe([h200(10_796.0)])  # type: ignore[assignment]
    assert all(r.ok for r in check_power.check_clocks_and_throttle(ctx))

    # A reading that disagrees fails: 600 J in 2 s is 300 W against nvidia-smi's 398 W.
    clock = iter([100.0, 102.0])
    ctx.probe = Probe([h200(10_000.0), h200(10_600.0)])  # type: ignore[assignment]
    assert not check_power.check_energy(ctx)[0].ok
    answers["clocks.sm,clocks.max.sm,clocks_event_reasons.active"] = {
        0: ["1980", "1980", "0x0000000000000001"]
    }
    assert not all(r.ok for r in check_power.check_clocks_and_throttle(ctx))  # idle bit only: no cap
