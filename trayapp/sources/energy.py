"""Host energy counters: Linux RAPL (Intel and AMD packages) and Apple Silicon through `macmon pipe`.

GPUs carry their own (NVML's total-energy counter, `sources/gpu.py`). Each probe's `read()` returns
`EnergyReading`s; one that finds nothing leaves the reason in `reason`. Counters are handed on raw
(with their range), and `core/energy.py` turns them into deltas, wraps undone.

RAPL (kernel docs, Documentation/power/powercap/powercap.rst): every zone
`/sys/class/powercap/intel-rapl:N` has `name` ("package-N", "psys", …), `energy_uj` (the
cumulative energy counter, µJ) and `max_energy_range_uj` (its range: past it the counter restarts
from 0). AMD Zen packages use the same `intel-rapl` interface (Linux ≥ 5.8). Since the fix of
CVE-2020-8694 (Platypus) `energy_uj` is readable by root only.

macmon (github.com/vladkens/macmon, readme "JSON output"): `macmon pipe -i MS` prints one JSON
object per line and per interval, without sudo; `all_power` is CPU + GPU + ANE in watts averaged
over the interval, so the interval's energy is `all_power × interval` (a measured figure).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from trayapp.config.bugs import BugLog
from trayapp.core.energy_types import EnergyReading
from trayapp.sources.relisted import Relisted

log = logging.getLogger(__name__)

ReadText = Callable[[Path], str]
_ZONE = re.compile(r"[a-z]+-rapl:\d+")  # a top-level zone (intel-rapl:0, not its sub-zone intel-rapl:0:0)
RAPL_PERMISSION = (
    "RAPL's energy_uj is readable by root only (since the CVE-2020-8694 fix); allow it with "
    "`sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj` (until the next boot) or a udev rule: "
    'SUBSYSTEM=="powercap", ACTION=="add", RUN+="/bin/chmod o+r /sys%p/energy_uj" '
    "(kernel docs: Documentation/power/powercap/powercap.rst)"
)
NO_RAPL = "no RAPL package counters in /sys/class/powercap (not Linux on Intel/AMD, or a virtual machine)"
NO_MACMON = "macmon is not installed (brew install macmon): no energy reading on this Mac"


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii").strip()


@dataclass(frozen=True)
class RaplPackage:
    """A package zone as listed: its folder, name and counter range (J; None when unreadable)."""

    zone: Path
    name: str
    wrap_j: float | None


class RaplProbe:
    """The package domains of Linux RAPL under `root`/class/powercap (injectable for tests).

    The zones, their names and ranges are listed every STATIC_REFRESH_S (issue #26: a tick reads
    only each package's `energy_uj`); a zone that goes away is listed again at the next read.
    """

    def __init__(
        self,
        root: Path = Path("/sys"),
        read_text: ReadText = _read_text,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._powercap = root / "class" / "powercap"
        self._read_text = read_text
        self._packages = Relisted(self._list_packages, clock)
        self.reason: str | None = None

    def read(self) -> tuple[EnergyReading, ...]:
        readings: list[EnergyReading] = []
        for package in self._packages.get():
            reading = self._reading(package)
            if reading is None:  # gone since it was listed: list them again at the next read
                self._packages.expire()
                continue
            readings.append(reading)
        self.reason = None if readings else NO_RAPL
        return tuple(readings)

    def close(self) -> None:
        pass

    def _list_packages(self) -> tuple[RaplPackage, ...]:
        try:
            zones = sorted(p for p in self._powercap.iterdir() if _ZONE.fullmatch(p.name))
        except OSError:
            return ()
        packages: list[RaplPackage] = []
        for zone in zones:
            name = self._text(zone / "name")
            if name is None or not name.startswith("package"):
                continue  # psys and sub-zones overlap the packages
            range_text = self._text(zone / "max_energy_range_uj")
            wrap_j = int(range_text) / 1e6 if range_text and range_text.isdigit() else None
            packages.append(RaplPackage(zone, name, wrap_j))
        return tuple(packages)

    def _reading(self, package: RaplPackage) -> EnergyReading | None:
        """The package's counter now; None when its zone has gone."""
        zone, name = package.zone, package.name
        try:
            energy_uj = int(self._read_text(zone / "energy_uj"))
        except FileNotFoundError:
            return None
        except PermissionError:
            return EnergyReading(name, "rapl", reason=RAPL_PERMISSION)
        except (OSError, ValueError) as exc:
            return EnergyReading(name, "rapl", reason=f"{zone.name}/energy_uj unreadable: {exc}")
        return EnergyReading(name, "rapl", counter_j=energy_uj / 1e6, wrap_j=package.wrap_j)

    def _text(self, path: Path) -> str | None:
        try:
            return self._read_text(path)
        except (OSError, ValueError):
            return None


def macmon_sample(line: str) -> tuple[float, float] | None:
    """(time in seconds since the epoch, CPU + GPU + ANE watts) of one `macmon pipe` line; None
    for a line that is not a sample."""
    try:
        data = json.loads(line)
        when = datetime.fromisoformat(str(data["timestamp"])).timestamp()
        power_w = float(data["all_power"])
    except (ValueError, KeyError, TypeError):
        return None
    return when, power_w


class MacmonEnergy:
    """Integrates `macmon pipe` samples into a cumulative counter (J). Feed it lines; read `energy_j`."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last_s: float | None = None
        self.energy_j: float | None = None
        self.fed_monotonic_s: float | None = None  # when the last sample arrived

    def feed(self, line: str) -> None:
        sample = macmon_sample(line)
        if sample is None:
            return
        self.fed_monotonic_s = time.monotonic()
        when_s, power_w = sample
        # Each sample averages the interval that ends at its timestamp.
        span_s = self._interval_s if self._last_s is None else when_s - self._last_s
        self._last_s = when_s
        if span_s > 0:
            self.energy_j = (self.energy_j or 0.0) + power_w * span_s


class MacmonProbe:
    """Apple Silicon's SoC energy from a `macmon pipe` child read on its own thread (macOS only)."""

    def __init__(
        self,
        *,
        platform: str = sys.platform,
        which: Callable[[str], str | None] = shutil.which,
        interval_ms: int = 1000,
    ) -> None:
        self._platform = platform
        self._which = which
        self._interval_ms = interval_ms
        self._energy = MacmonEnergy(interval_ms / 1000)
        self._child: subprocess.Popen[str] | None = None
        self._started = False
        self._bugs = BugLog(log)
        self.reason: str | None = None

    def read(self) -> tuple[EnergyReading, ...]:
        if self._platform != "darwin":
            return ()
        if not self._started:
            self._started = True
            self._start()
        if self._child is None:
            return ()
        stopped = self._stopped()
        if stopped is not None:  # a counter that no longer moves would read as 0 W
            return (EnergyReading("soc", "macmon", reason=stopped),)
        energy_j = self._energy.energy_j
        if energy_j is None:
            return (EnergyReading("soc", "macmon", reason="macmon has not reported a sample yet"),)
        return (EnergyReading("soc", "macmon", counter_j=energy_j),)

    def _stopped(self) -> str | None:
        """Why macmon's counter is stale (its child exited, or no sample for 3 intervals); None if live."""
        assert self._child is not None
        exit_code = self._child.poll()
        if exit_code is not None:
            return f"macmon stopped (exit {exit_code})"
        fed_s = self._energy.fed_monotonic_s
        silent_s = None if fed_s is None else time.monotonic() - fed_s
        if silent_s is not None and silent_s > 3 * self._interval_ms / 1000:
            return f"macmon has sent no sample for {silent_s:.0f} s"
        return None

    def _start(self) -> None:
        path = self._which("macmon")
        if path is None:
            self.reason = NO_MACMON
            return
        try:
            self._child = subprocess.Popen(
                [path, "pipe", "-i", str(self._interval_ms)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError as exc:
            self.reason = f"macmon could not start: {exc}"
            return
        threading.Thread(target=self._pump, name="macmon-reader", daemon=True).start()

    def _pump(self) -> None:
        child = self._child
        if child is None or child.stdout is None:
            return
        try:
            for line in child.stdout:
                self._energy.feed(line)
        except Exception as exc:  # a bug reading its output: logged once; read() then says it stopped
            self._bugs.report(exc, "macmon pipe")
            child.terminate()
        finally:
            child.stdout.close()
        log.info("macmon pipe ended (exit %s)", child.wait())

    def close(self) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.terminate()  # its reader thread then sees the pipe end and reaps it
        self._child = None


class HostEnergyProbe:
    """RAPL on Linux, macmon on macOS: the host's energy readings and, when none, why."""

    def __init__(self, rapl: RaplProbe | None = None, macmon: MacmonProbe | None = None) -> None:
        self._rapl = rapl if rapl is not None else RaplProbe()
        self._macmon = macmon if macmon is not None else MacmonProbe()
        self.reason: str | None = None

    def read(self) -> tuple[EnergyReading, ...]:
        readings = self._rapl.read() + self._macmon.read()
        self.reason = None
        if not readings:
            self.reason = self._macmon.reason or self._rapl.reason
        return readings

    def close(self) -> None:
        self._rapl.close()
        self._macmon.close()
