"""GUI-thread stalls of the real tray app while a real llama-server is frozen and while it generates.

    python bench/gui_stall.py [--seconds 20] [--beat-ms 10] [--phases idle,frozen,generating] [--json]
                              [--server-url URL --server-pid PID]

Runs the real app (`trayapp.app.tray_main.run_tray`) in this process on a real X display (Xvfb +
trayer; offscreen when those tools are missing), with its dashboard open (a second start,
as a user would), and a QTimer heartbeat (10 ms; `--beat-ms`) on the GUI thread recording when
it fires. A stall is how late a beat comes: gap between beats − the beat. Phases, `--seconds` each:

* idle       the server is up and idle (reference)
* frozen     the server is stopped with SIGSTOP: it accepts connections and never answers,
             so every poll hangs until its timeout (SIGCONT afterwards, always)
* generating a separate client process keeps the server generating; the app polls every
             second, redraws the icon and the dashboard's plots

Reports p50 / p99 / max stall per phase in ms. Target (issue 5): p99 ≤ 50 ms.
`--server-url` / `--server-pid` use a llama-server the caller started (and SIGCONTs, whatever
happens here): tests/e2e/test_gui_stall.py runs this script that way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.llama import LlamaServer  # noqa: E402
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing  # noqa: E402

BEAT_MS = 10.0
PHASES = ("idle", "frozen", "generating")
TARGET_P99_MS = 50.0
CLIENT = """
import sys, time
from tests.support.llama import generate
url, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < until:
    generate(url, "Write about the ocean.", 150, ignore_eos=True, timeout_s=120)
"""


class Events:
    """Reads the app's LLM_TRAY_TEST_EVENTS file; waits with deadlines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cursor = 0

    def wait_for(
        self, what: str, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 60.0
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                lines = self.path.read_text(encoding="utf-8").split("\n")[:-1]
            except FileNotFoundError:
                lines = []
            for index in range(self.cursor, len(lines)):
                if predicate(json.loads(lines[index])):
                    self.cursor = index + 1
                    return
            time.sleep(0.05)
        raise TimeoutError(f"no {what} within {timeout_s:.0f} s")

    def between(self, start_wall_s: float, end_wall_s: float) -> list[dict[str, Any]]:
        """Events stamped inside [start, end] (wall clock, as the app writes them)."""
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")[:-1]
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines]
        return [e for e in events if start_wall_s <= e["t"] <= end_wall_s]

    def skip_to_end(self) -> None:
        try:
            self.cursor = len(self.path.read_text(encoding="utf-8").split("\n")[:-1])
        except FileNotFoundError:
            self.cursor = 0


def _phase_models(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == "snapshot" and any(m["phase"] == phase for m in e.get("models", []))


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(max(round(pct / 100 * (len(ordered) - 1)), 0), len(ordered) - 1)
    return ordered[rank]


def stalls_ms(beats_s: list[float], start_s: float, end_s: float, beat_ms: float = BEAT_MS) -> list[float]:
    """How late each beat inside [start, end] came, in ms (0 when on time)."""
    inside = [t for t in beats_s if start_s <= t <= end_s]
    return [max((b - a) * 1000 - beat_ms, 0.0) for a, b in itertools.pairwise(inside)]


@dataclass(frozen=True)
class Target:
    """The llama-server to freeze and to make generate."""

    url: str
    pid: int


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP for the block, SIGCONT afterwards, always."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def run(
    seconds: float,
    server: Target,
    env: dict[str, str],
    home: Path,
    *,
    beat_ms: float = BEAT_MS,
    phases: Sequence[str] = PHASES,
) -> dict[str, dict[str, float]]:
    """Run the app in this process; a controller thread drives the phases. Returns stats per phase."""
    os.environ.update(env)
    from PySide6.QtCore import QMetaObject, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from trayapp.cli.main import main as cli_main

    app = QApplication([sys.argv[0]])
    beats: list[float] = []
    heartbeat = QTimer()
    heartbeat.setTimerType(Qt.TimerType.PreciseTimer)
    heartbeat.setInterval(round(beat_ms))
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    heartbeat.start()

    events = Events(home / "events.jsonl")
    windows: dict[str, tuple[float, float]] = {}  # perf_counter start, end
    walls: dict[str, tuple[float, float]] = {}  # the same windows on the wall clock (event stamps)
    failure: list[BaseException] = []
    app_args = ["--endpoint", f"llamacpp={server.url}", "--no-discover"]

    def mark(phase: str) -> None:
        start, start_wall = time.perf_counter(), time.time()
        time.sleep(seconds)
        windows[phase] = (start, time.perf_counter())
        walls[phase] = (start_wall, time.time())

    def controller() -> None:
        client: subprocess.Popen[bytes] | None = None
        try:
            events.wait_for("the first snapshot", lambda e: e["event"] == "snapshot", 60)
            second = [sys.executable, "-m", "trayapp", *app_args]  # shows the dashboard, then exits
            subprocess.run(second, cwd=REPO, env={**os.environ}, timeout=60, check=True, capture_output=True)
            events.wait_for("the dashboard", lambda e: e["event"] == "dashboard_shown", 30)
            time.sleep(2.0)  # let the first full redraw settle
            if "idle" in phases:
                mark("idle")
            if "frozen" in phases:
                with frozen(server.pid):
                    mark("frozen")
            if "generating" in phases:
                events.skip_to_end()
                client = subprocess.Popen(
                    [sys.executable, "-c", CLIENT, server.url, str(seconds + 60)], cwd=REPO,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                events.wait_for("decoding", _phase_models("decoding"), 90)
                mark("generating")
        except BaseException as exc:
            failure.append(exc)
        finally:
            if client is not None:
                client.kill()
                client.wait(timeout=10)
            QMetaObject.invokeMethod(app, "quit", Qt.ConnectionType.QueuedConnection)

    threading.Thread(target=controller, name="gui-stall-controller", daemon=True).start()
    code = cli_main(app_args)
    heartbeat.stop()
    if failure:
        raise RuntimeError(f"the measurement failed: {failure[0]!r}") from failure[0]
    if code != 0:
        raise RuntimeError(f"the app exited with {code}")
    results: dict[str, dict[str, float]] = {}
    for phase, (start, end) in windows.items():
        stalls = stalls_ms(beats, start, end, beat_ms)
        results[phase] = {
            "beats": len(stalls),
            "p50_ms": percentile(stalls, 50),
            "p99_ms": percentile(stalls, 99),
            "max_ms": max(stalls, default=float("nan")),
            "over_50ms": sum(1 for s in stalls if s > 50),
        }
        snapshots = [e for e in events.between(*walls[phase]) if e["event"] == "snapshot"]
        results[phase]["snapshots"] = len(snapshots)
        results[phase]["snapshots_without_models"] = sum(1 for e in snapshots if not e.get("models"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--beat-ms", type=float, default=BEAT_MS, help="heartbeat interval (10)")
    parser.add_argument("--phases", default=",".join(PHASES), help="which phases, in this order")
    parser.add_argument("--server-url", help="a running llama-server (the caller SIGCONTs it, always)")
    parser.add_argument("--server-pid", type=int, help="its pid, to freeze it")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    if set(phases) - set(PHASES) or bool(args.server_url) != bool(args.server_pid):
        parser.error(f"--phases is a list of {','.join(PHASES)}; --server-url needs --server-pid")
    with ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llm-tray-stall-")))
        env = {"LLM_TRAY_HOME": str(home / "home"), "LLM_TRAY_TEST_EVENTS": str(home / "events.jsonl")}
        if xdisplay_tools_missing():
            env["QT_QPA_PLATFORM"] = "offscreen"
            where = "offscreen (X tools missing)"
        else:
            display = stack.enter_context(XDisplay())
            env.update(DISPLAY=display.display, QT_QPA_PLATFORM="xcb")
            where = f"Xvfb {display.display} + trayer"
        if args.server_url:
            target = Target(args.server_url, args.server_pid)
        else:
            server = stack.enter_context(LlamaServer(threads=1, log_dir=home))
            target = Target(server.url, server.pid or 0)
            stack.callback(os.kill, target.pid, signal.SIGCONT)  # never leave it frozen
        results = run(args.seconds, target, env, home, beat_ms=args.beat_ms, phases=phases)
    if args.json:
        print(json.dumps({"display": where, "beat_ms": args.beat_ms, "phases": results}))
        return
    print(
        f"GUI-thread stalls, {args.beat_ms:g} ms heartbeat, {args.seconds:.0f} s per phase, {where}, "
        "dashboard open"
    )
    print(f"{'phase':<11} {'beats':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>50 ms':>7}  snapshots")
    for phase, r in results.items():
        print(
            f"{phase:<11} {r['beats']:>6} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
            f"{r['over_50ms']:>7}  {r['snapshots']:.0f} ({r['snapshots_without_models']:.0f} no model)"
        )
    worst = max(r["p99_ms"] for r in results.values())
    verdict = "met" if worst <= TARGET_P99_MS else "NOT met"
    print(f"target p99 ≤ {TARGET_P99_MS:.0f} ms: {verdict} (worst p99 {worst:.1f} ms)")


if __name__ == "__main__":
    main()
