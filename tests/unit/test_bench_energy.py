"""The bench's J/token (#21): idle draw sampled before the runs, each run's joules above it, J per generated
token over the decode runs; unmeasured: None with the reason. RAPL readings by hand, a hand-driven clock."""

from __future__ import annotations

import pytest

from trayapp.core.bench import BenchRun, decode_energy
from trayapp.core.energy_types import EnergyReading
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.services.bench_energy import REMOTE, BenchEnergy
from trayapp.sources.energy import NO_RAPL

HOST = HostReading(None, None, None)


def bench_run(decode_tokens: int, energy_j: float | None) -> BenchRun:
    return BenchRun(
        kind="decode", warmup=False, depth_tokens=0, prompt_tokens=28, cached_tokens=0,
        decode_tokens=decode_tokens, streamed_tokens=decode_tokens, server_decode_tok_s=50.0,
        stream_decode_tok_s=None, ttft_s=0.05, prompt_tok_s=600.0, prompt_rate_upper_bound=False,
        wall_s=4.0, energy_j=energy_j,
    )  # fmt: skip


class Machine:
    """A RAPL package drawing `power_w` (20 W idle), read on a clock that moves only when told."""

    def __init__(self) -> None:
        self.t_s = 100.0
        self.counter_j = 5000.0
        self.power_w = 20.0

    def advance(self, seconds: float) -> None:
        self.t_s += seconds
        self.counter_j += self.power_w * seconds

    def read(self) -> HardwareSnapshot:
        return HardwareSnapshot(
            (), HOST, energy=(EnergyReading("package-0", "rapl", counter_j=self.counter_j),)
        )


def test_a_run_gets_its_joules_above_the_idle_draw() -> None:
    machine = Machine()
    energy = BenchEnergy(machine.read, clock=lambda: machine.t_s, sleep=machine.advance)
    energy.sample_idle()  # 3 intervals of 0.3 s at 20 W
    assert energy.reason is None
    energy.begin()
    machine.power_w = 170.0
    machine.advance(2.0)  # 340 J in 2 s
    assert energy.end() == pytest.approx(340.0 - 20.0 * 2.0)  # 300 J above idle


def test_no_energy_reading_or_a_remote_server_gives_the_reason() -> None:
    nothing = BenchEnergy(lambda: HardwareSnapshot((), HOST, energy_reason=NO_RAPL), sleep=lambda s: None)
    nothing.sample_idle()
    nothing.begin()
    assert nothing.end() is None and nothing.reason == NO_RAPL
    remote = BenchEnergy(Machine().read, local=False)
    remote.sample_idle()
    assert remote.end() is None and remote.reason == REMOTE


def test_decode_j_per_token_over_the_measured_runs() -> None:
    runs = [bench_run(200, 300.0), bench_run(100, 150.0), bench_run(100, None)]
    assert decode_energy(runs, None) == (pytest.approx((300.0 + 150.0) / 300), None)  # 1.5 J/token
    assert decode_energy(runs[2:], NO_RAPL) == (None, NO_RAPL)
