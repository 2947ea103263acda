"""Start-up of PyInstaller bundles to a docked tray icon, beside a bare PySide6 tray in the same run.

    python bench/bundle_start.py --bundle dist/llm-tray/llm-tray [--bundle OTHER] [--rounds 5] [--json]

A real X display (Xvfb + trayer); each round starts, in rotating order, the bare tray of
bench/app_cost.py and every `--bundle` (`llm-tray --no-discover`, one LLM_TRAY_HOME per bundle),
timing each from Popen to its icon docked in trayer's panel (xdotool, every 20 ms), then quits it
before the next. One untimed start of each first: it makes the bundle's config and store and
brings its files into the page cache, so every timed start is a warm one (a user's second
start; a first start after boot also reads the folder from disk).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from app_cost import BARE_CLASS, BARE_TRAY, stop, time_to_dock

from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

BARE = "bare PySide6 tray"


def start_to_dock_s(display: XDisplay, name: str, home: Path) -> float:
    """One start of `name` (BARE or a bundle's executable) until its icon docks; quit after."""
    if name == BARE:
        args, env, class_name = [sys.executable, "-c", BARE_TRAY], display.env, BARE_CLASS
    else:
        args, class_name = [name, "--no-discover"], "llm-tray"
        env = dict(display.env, LLM_TRAY_HOME=str(home))
    t0 = time.monotonic()
    proc = subprocess.Popen(args, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return time_to_dock(display, class_name, proc, t0)
    finally:
        stop(proc)


def measure(bundles: list[str], rounds: int, work_dir: Path) -> dict[str, list[float]]:
    names = [BARE, *bundles]
    homes = {name: work_dir / f"home-{i}" for i, name in enumerate(names)}
    for home in homes.values():
        home.mkdir()
    times: dict[str, list[float]] = {name: [] for name in names}
    with XDisplay() as display:
        for name in names:
            start_to_dock_s(display, name, homes[name])  # untimed: config, store, page cache
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                times[name].append(start_to_dock_s(display, name, homes[name]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", action="append", required=True, help="a bundle's llm-tray executable")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = xdisplay_tools_missing()
    if missing:
        raise SystemExit(f"missing X display tools: {', '.join(missing)} (tests/provision.sh installs them)")
    bundles = [str(Path(b).resolve()) for b in args.bundle]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="llm-tray-bundle-start-") as work:
        times = measure(bundles, args.rounds, Path(work))
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"start_to_dock_s": times, "load_before": load_before, "load_after": load_after}))
        return
    for name, values in times.items():
        print(f"{name}: {' '.join(f'{t:.2f}' for t in values)} s (median {statistics.median(values):.2f})")
    print(
        f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
