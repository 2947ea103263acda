"""The bench's energy: this machine's idle draw sampled before the runs, then each run's joules above it.

Reads the monitor's hardware (NVML's energy counter, RAPL, macmon; core/energy.py does the deltas
and wraps). A bench of a server on another machine, or on a machine with no energy reading, gets
no figure and the reason, never 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trayapp.core.energy import NO_ENERGY, EnergyMeter, domains_of
from trayapp.core.hardware_readings import HardwareSnapshot

IDLE_READS = 4  # reads 0.3 s apart: three idle intervals before the first run
IDLE_GAP_S = 0.3
REMOTE = "the server runs on another machine: its energy is not read here"


class BenchEnergy:
    """Idle draw first (`sample_idle`), then `begin()` / `end()` around each request."""

    def __init__(
        self,
        read_hardware: Callable[[], HardwareSnapshot],
        *,
        local: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._read = read_hardware
        self._clock, self._sleep = clock, sleep
        self._meter = EnergyMeter()
        self._begun_s: float | None = None
        self.reason: str | None = None if local else REMOTE

    def sample_idle(self) -> None:
        """The idle draw over ~1 s before the runs (skipped where nothing can be read)."""
        if self.reason is not None:
            return
        hardware = self._read()
        found, reasons = domains_of(hardware)
        if not found:
            self.reason = "; ".join(reasons) or NO_ENERGY
            return
        self._meter.update(hardware, self._clock(), busy=False)
        for _ in range(IDLE_READS - 1):
            self._sleep(IDLE_GAP_S)
            self._meter.update(self._read(), self._clock(), busy=False)
        if self._meter.idle_w is None:
            self.reason = "the idle draw could not be measured"

    def begin(self) -> None:
        if self.reason is None:
            self._begun_s = self._clock()
            self._meter.update(self._read(), self._begun_s, busy=True)

    def end(self) -> float | None:
        """Joules above the idle draw since `begin()`; None when not measured (see `reason`)."""
        start_s, self._begun_s = self._begun_s, None
        idle_w = self._meter.idle_w
        if self.reason is not None or start_s is None or idle_w is None:
            return None
        end_s = self._clock()
        self._meter.update(self._read(), end_s, busy=True)
        above_j, _, _ = self._meter.above_idle(start_s, end_s)
        return above_j
