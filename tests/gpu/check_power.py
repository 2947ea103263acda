"""The GPU check's power, energy and throttle checks (#21 part B): llm-tray's NVML readings against
`nvidia-smi --query-gpu` on the same machine (run by tests/gpu/check.py, listed in its `CHECKS`).

* power: `power_w` against `power.draw`, `power_limit_w` against `enforced.power.limit`;
* energy: NVML's total-energy counter over `ENERGY_WINDOW_S` (and the same delta through
  core/energy.py's meter) against nvidia-smi's `power.draw` × the window;
* clocks and throttling: `sm_clock_max_mhz` against `clocks.max.sm`, the current SM clock within it,
  and the slowdown reasons against `clocks_event_reasons.active` (`clocks_throttle_reasons.active`
  on older drivers), read again when they changed between the two reads.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

from trayapp.core.energy import EnergyMeter
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.sources.gpu import throttle_names

if TYPE_CHECKING:
    from tests.gpu.check import Context, Result

ENERGY_WINDOW_S = 2.0
POWER_TOLERANCE_W = 15.0  # power moves between two reads a few ms apart …
POWER_TOLERANCE_SHARE = 0.2  # … or by this share of the draw, whichever is larger
REASON_TRIES = 3
HOST = HostReading(None, None, None)


def query_gpu(fields: str) -> dict[int, list[str]]:
    """nvidia-smi's `--query-gpu=index,<fields>` rows by GPU index (the values after the index)."""
    from tests.gpu.check import smi

    return {int(r[0]): r[1:] for r in smi(f"--query-gpu=index,{fields}") if r and r[0].isdigit()}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _close_w(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= max(POWER_TOLERANCE_W, POWER_TOLERANCE_SHARE * theirs)


def check_power(ctx: Context) -> list[Result]:
    from tests.gpu.check import Result

    rows = query_gpu("power.draw,enforced.power.limit")
    results = []
    for gpu in ctx.probe.read():
        draw, limit = (_float(v) for v in rows.get(gpu.index, ["", ""])[:2])
        detail = f"llm-tray {gpu.power_w} W of {gpu.power_limit_w} W, nvidia-smi {draw} W of {limit} W"
        results.append(
            Result(
                f"GPU {gpu.index} power ≈ nvidia-smi",
                gpu.power_w is not None and draw is not None and _close_w(gpu.power_w, draw),
                detail,
            )
        )
        results.append(
            Result(
                f"GPU {gpu.index} power limit = nvidia-smi",
                gpu.power_limit_w is not None and limit is not None and abs(gpu.power_limit_w - limit) < 1,
                detail,
            )
        )
    return results


def check_energy(ctx: Context) -> list[Result]:
    from tests.gpu.check import Result

    meter = EnergyMeter()
    first, start_s = ctx.probe.read(), time.monotonic()
    draw_start = query_gpu("power.draw")
    meter.update(HardwareSnapshot(first, HOST), start_s, busy=False)
    time.sleep(ENERGY_WINDOW_S)
    second, end_s = ctx.probe.read(), time.monotonic()
    draw_end = query_gpu("power.draw")
    status = meter.update(HardwareSnapshot(second, HOST), end_s, busy=False)
    totals = {d.domain: d.total_j for d in status.domains}
    results = []
    for before, after in zip(first, second, strict=True):
        name = f"GPU {before.index} energy counter"
        if before.energy_j is None or after.energy_j is None:
            results.append(Result(name, True, "NVML has no energy counter here: llm-tray uses power × time"))
            continue
        delta_j, window_s = after.energy_j - before.energy_j, end_s - start_s
        draws = [_float(rows.get(before.index, [""])[0]) for rows in (draw_start, draw_end)]
        known = [d for d in draws if d is not None]
        smi_w = sum(known) / len(known) if known else None
        detail = (
            f"{delta_j:.1f} J over {window_s:.2f} s = {delta_j / window_s:.1f} W; nvidia-smi power.draw "
            f"{draws} W; the meter's total {totals.get(f'gpu{before.index}')} J"
        )
        ok = delta_j > 0 and smi_w is not None and _close_w(delta_j / window_s, smi_w)
        results.append(Result(f"{name} delta ≈ nvidia-smi power × time", ok, detail))
        meter_j = totals.get(f"gpu{before.index}")
        results.append(
            Result(
                f"{name} delta = the meter's", meter_j is not None and abs(meter_j - delta_j) < 1e-6, detail
            )
        )
    return results


def _reasons() -> dict[int, list[str]]:
    try:
        return query_gpu("clocks.sm,clocks.max.sm,clocks_event_reasons.active")
    except subprocess.CalledProcessError:  # a driver before the rename (535)
        return query_gpu("clocks.sm,clocks.max.sm,clocks_throttle_reasons.active")


def check_clocks_and_throttle(ctx: Context) -> list[Result]:
    from tests.gpu.check import Result

    results: list[Result] = []
    for attempt in range(REASON_TRIES):
        gpus, rows = ctx.probe.read(), _reasons()
        results = []
        for gpu in gpus:
            sm, sm_max, mask = rows.get(gpu.index, ["", "", ""])[:3]
            theirs = throttle_names(int(mask, 16)) if mask.startswith("0x") else None
            detail = (
                f"llm-tray SM {gpu.sm_clock_mhz} of {gpu.sm_clock_max_mhz} MHz, "
                f"reasons {gpu.throttle_reasons}; "
                f"nvidia-smi SM {sm} of {sm_max} MHz, reasons {mask} = {theirs}"
            )
            results.append(
                Result(
                    f"GPU {gpu.index} max SM clock = nvidia-smi",
                    gpu.sm_clock_max_mhz is not None and _float(sm_max) == gpu.sm_clock_max_mhz,
                    detail,
                )
            )
            results.append(
                Result(
                    f"GPU {gpu.index} SM clock within its maximum",
                    gpu.sm_clock_mhz is not None
                    and gpu.sm_clock_max_mhz is not None
                    and 0 < gpu.sm_clock_mhz <= gpu.sm_clock_max_mhz,
                    detail,
                )
            )
            results.append(
                Result(
                    f"GPU {gpu.index} slowdown reasons = nvidia-smi", theirs == gpu.throttle_reasons, detail
                )
            )
        if all(r.ok for r in results) or attempt + 1 == REASON_TRIES:
            return results  # the reasons may change between the two reads: read again
        time.sleep(0.2)
    return results
