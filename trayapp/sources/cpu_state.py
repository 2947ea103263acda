"""The CPU's clock and temperature where the OS lets us read them (a throttled CPU decodes slower).

Frequency as psutil reads it (Linux: /proc/cpuinfo and /sys/devices/system/cpu/cpufreq; a VM often
has no cpufreq, so no maximum); temperature from Linux thermal zones
(`/sys/class/thermal/thermal_zone*/temp`, m°C).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import psutil

from trayapp.sources.procfs import read_bytes

_CPUINFO_MHZ = re.compile(rb"^cpu mhz[^:\n]*:([^\n]*)", re.IGNORECASE | re.MULTILINE)


def cpu_freq_policies(root: Path = Path("/sys")) -> list[Path]:
    """The CPU frequency policies' folders in CPU order, as psutil lists them (`cpufreq/policyN`, else
    `cpuN/cpufreq`); none where the kernel has no cpufreq (a VM)."""
    cpu = root / "devices" / "system" / "cpu"
    try:
        paths = list(cpu.glob("cpufreq/policy[0-9]*")) or list(cpu.glob("cpu[0-9]*/cpufreq"))
    except OSError:
        return []
    return sorted(paths, key=_cpu_number)


def _cpu_number(policy: Path) -> int:
    """12 for `policy12` and for `cpu12/cpufreq`."""
    name = policy.name if policy.name.startswith("policy") else policy.parent.name
    return int(re.sub(r"\D", "", name) or 0)


def cpuinfo_mhz(proc_root: Path = Path("/proc")) -> list[float]:
    """Each CPU's "cpu MHz" line of /proc/cpuinfo (none on CPUs that print no such line)."""
    return [float(value) for value in _CPUINFO_MHZ.findall(read_bytes(proc_root / "cpuinfo", 2**24))]


def cpu_frequency_mhz(
    policies: Sequence[Path] | None = None, root: Path = Path("/sys"), proc_root: Path = Path("/proc")
) -> tuple[float | None, float | None]:
    """(current, maximum) CPU frequency in MHz, averaged over the CPUs; None where not readable.

    Linux: pass `policies` (`cpu_freq_policies(root)`, kept between reads): read as psutil 7's
    `cpu_freq()` reads them (the current from /proc/cpuinfo when it lists as many CPUs, else the
    policy's own; an offline CPU counts 0), without psutil's listing and minimum on every read.
    None: through psutil (other systems).
    """
    if policies is not None:
        return _linux_frequency_mhz(policies, root, proc_root)
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError):
        return None, None
    if freq is None:
        return None, None
    return (float(freq.current) or None), (float(freq.max) or None)


def _linux_frequency_mhz(
    policies: Sequence[Path], root: Path, proc_root: Path
) -> tuple[float | None, float | None]:
    try:
        listed_mhz = cpuinfo_mhz(proc_root)
        if not policies:  # no cpufreq: /proc/cpuinfo's figures alone, no maximum
            return (sum(listed_mhz) / len(listed_mhz) or None, None) if listed_mhz else (None, None)
        currents_mhz: list[float] = []
        maxima_mhz: list[float] = []
        for i, policy in enumerate(policies):
            if len(policies) == len(listed_mhz):
                current_khz = listed_mhz[i] * 1000
            else:
                text = _read_text(policy / "scaling_cur_freq") or _read_text(policy / "cpuinfo_cur_freq")
                if text is None:
                    if _read_text(root / "devices" / "system" / "cpu" / f"cpu{i}" / "online") == "0":
                        currents_mhz.append(0.0)  # offline
                        maxima_mhz.append(0.0)
                        continue
                    return None, None
                current_khz = float(int(text))
            currents_mhz.append(current_khz / 1000)
            maxima_mhz.append(int((policy / "scaling_max_freq").read_bytes()) / 1000)
    except (OSError, ValueError):
        return None, None
    count = len(currents_mhz)
    return (sum(currents_mhz) / count or None), (sum(maxima_mhz) / count or None)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None


def thermal_zones(root: Path = Path("/sys")) -> list[Path]:
    """The thermal zones' folders (none where unreadable)."""
    try:
        return sorted((root / "class" / "thermal").glob("thermal_zone*"))
    except OSError:
        return []


def thermal_max_c(root: Path = Path("/sys"), zones: list[Path] | None = None) -> float | None:
    """The hottest thermal zone in °C (of `zones`, found under `root` when not given), or None when
    none can be read."""
    hottest: float | None = None
    for zone in thermal_zones(root) if zones is None else zones:
        try:
            value = int((zone / "temp").read_text(encoding="ascii").strip()) / 1000
        except (OSError, ValueError):
            continue
        hottest = value if hottest is None else max(hottest, value)
    return hottest
