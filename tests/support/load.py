"""A competing CPU load, as a busy neighbour makes one: busy-loop processes, bounded in time.

In a test: `with cpu_hog(): ...` (one busy process per `processes`, killed at the end). For a
whole suite run: `tests/run.sh` starts `python -m tests.support.load --processes N --limit-s S`
when LLM_TRAY_TEST_HOG=N is set, and stops it when pytest ends.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

BUSY_LOOP = "import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end:\n    pass\n"


def start_hogs(processes: int, limit_s: float) -> list[subprocess.Popen[bytes]]:
    """`processes` busy loops, each ending by itself after `limit_s`."""
    code = BUSY_LOOP.format(limit_s=float(limit_s))
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait(timeout=10)


@contextmanager
def cpu_hog(processes: int = 1, limit_s: float = 600.0) -> Iterator[None]:
    """Keep `processes` cores busy while the block runs (at most `limit_s`)."""
    hogs = start_hogs(processes, limit_s)
    try:
        yield
    finally:
        stop_hogs(hogs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--limit-s", type=float, default=7200.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below stops the loops
    hogs = start_hogs(args.processes, args.limit_s)
    try:
        for hog in hogs:
            hog.wait()  # each ends by itself after --limit-s
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    main()
