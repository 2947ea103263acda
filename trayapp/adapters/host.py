"""The host: RAM and CPU through psutil, and a trusted RAM read bandwidth.

The RAM bandwidth is measured by `python -m trayapp.adapters.rambench` in a
short-lived subprocess (numpy never loads here, its buffer of at most 256 MiB
goes back with the process), cached for a week, and trusted only when it was
measured on a quiet machine: a figure measured while other processes used the
CPU is "provisional", and one that a live CPU decode rate proves too low is
"suspect"; `RamBandwidthKeeper` measures those again in the background. Its
blocking calls never run on the GUI thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from trayapp.adapters.rambench import last_level_cache_bytes
from trayapp.core.bandwidth import contradicting_model
from trayapp.core.model import HostReading, Snapshot, ValueSource

__all__ = ["HostProbe", "RamBandwidth", "RamBandwidthKeeper", "last_level_cache_bytes", "run_rambench"]

log = logging.getLogger("trayapp.host")

Confidence = Literal["quiet", "provisional", "suspect"]
BUSY_CPU_PCT = 25.0  # other processes using more than this share of all cores: not a quiet machine
RETRY_INTERVAL_S = 600.0  # a provisional or suspect figure is measured again this often, when quiet
SUSPECT_INTERVAL_S = 1800.0  # a decode rate may call a figure suspect at most this often
MAX_AGE_S = 7 * 86400.0


class HostProbe:
    """System RAM and CPU load, read through psutil."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # the first non-blocking call only starts the interval

    def read(
        self,
        ram_bandwidth_gbps: float | None = None,
        ram_bandwidth_source: ValueSource = "unknown",
        ram_bandwidth_measured_wall_s: float | None = None,
        ram_bandwidth_confidence: str | None = None,
    ) -> HostReading:
        vm = psutil.virtual_memory()
        known = bool(ram_bandwidth_gbps)
        return HostReading(
            ram_total_bytes=int(vm.total),
            ram_available_bytes=int(vm.available),
            ram_bandwidth_gbps=ram_bandwidth_gbps,
            ram_bandwidth_source=ram_bandwidth_source if known else "unknown",
            cpu_percent=psutil.cpu_percent(interval=None),
            cpu_count=psutil.cpu_count(logical=True),
            ram_bandwidth_measured_wall_s=ram_bandwidth_measured_wall_s if known else None,
            ram_bandwidth_confidence=ram_bandwidth_confidence if known else None,
        )

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- RAM bandwidth


@dataclass(frozen=True)
class BenchResult:
    """One run of the rambench subprocess. `gbps` is None when it skipped a busy machine."""

    gbps: float | None
    busy_cpu_pct: float | None = None  # other processes' share of all cores just before
    runs: int = 0
    buffer_bytes: int | None = None
    peak_rss_bytes: int | None = None


@dataclass(frozen=True)
class RamBandwidth:
    """The RAM bandwidth figure as cached: what, when, and how far to trust it."""

    gbps: float
    measured_at_wall_s: float
    confidence: Confidence
    busy_cpu_pct: float | None = None
    runs: int | None = None
    attempted_at_wall_s: float | None = None  # the last try (a busy machine postpones it)


def run_rambench(
    skip_if_busy_pct: float | None = None,
    budget_s: float = 0.5,
    timeout_s: float = 60.0,
    buffer_bytes: int | None = None,
) -> BenchResult:
    """Run `python -m trayapp.adapters.rambench` and read its JSON line. Blocking (about 1.5 s).

    With `skip_if_busy_pct` it only checks the CPU when other processes use
    more than that share of all cores. Raises RuntimeError when it fails.
    """
    args = ["--budget-s", str(budget_s)]
    if skip_if_busy_pct is not None:
        args += ["--skip-if-busy-pct", str(skip_if_busy_pct)]
    if buffer_bytes is not None:
        args += ["--buffer-bytes", str(int(buffer_bytes))]
    if getattr(sys, "frozen", False):  # a PyInstaller build has no `python -m`: measure in-process
        return _run_in_process(args)
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trayapp.adapters.rambench", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"RAM benchmark did not run: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"RAM benchmark failed: {tail[0]}")
    return _parse_bench_line(done.stdout)


def _run_in_process(args: list[str]) -> BenchResult:
    import contextlib
    import io

    from trayapp.adapters import rambench

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rambench.main(args)
    return _parse_bench_line(out.getvalue())


def _parse_bench_line(stdout: str) -> BenchResult:
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        gbps = data["gbps"]
        return BenchResult(
            gbps=None if gbps is None else float(gbps),
            busy_cpu_pct=None if data.get("busy_cpu_pct") is None else float(data["busy_cpu_pct"]),
            runs=int(data.get("runs") or 0),
            buffer_bytes=data.get("buffer_bytes"),
            peak_rss_bytes=data.get("peak_rss_bytes"),
        )
    except (IndexError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RuntimeError(f"RAM benchmark printed no result ({exc})") from exc


def measure_ram_bandwidth_gbps(budget_s: float = 0.5, buffer_bytes: int | None = None) -> float:
    """RAM read bandwidth in GB/s (10^9 B/s), all cores, in a subprocess. Blocking: not on the GUI thread."""
    result = run_rambench(budget_s=budget_s, buffer_bytes=buffer_bytes)
    if result.gbps is None:
        raise RuntimeError("RAM benchmark gave no figure")
    return result.gbps


def _fingerprint() -> dict[str, object]:
    """What a cached measurement belongs to: a new CPU or more RAM invalidates it."""
    return {
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": int(psutil.virtual_memory().total),
    }


def _finite(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) else None


def load_cached(cache_path: Path, now_s: float, max_age_s: float = MAX_AGE_S) -> RamBandwidth | None:
    """The cached figure, or None when missing, corrupt (logged), stale or from other hardware.

    A file from before confidence was recorded loads as "provisional", so it is measured again.
    """
    try:
        text = cache_path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        cached = json.loads(text)
        gbps = _finite(cached["gbps"])
        measured_s = _finite(cached.get("measured_at_wall_s", cached.get("measured_wall_s")))
        if gbps is None or gbps <= 0 or measured_s is None:
            raise ValueError(f"gbps {cached['gbps']!r}, measured at {measured_s!r}")
        confidence = cached.get("confidence", "provisional")
        if confidence not in ("quiet", "provisional", "suspect"):
            raise ValueError(f"confidence {confidence!r}")
        attempted = _finite(cached.get("attempted_at_wall_s"))
        record = RamBandwidth(
            gbps=gbps,
            measured_at_wall_s=measured_s,
            confidence=confidence,
            busy_cpu_pct=_finite(cached.get("busy_cpu_pct")),
            runs=int(cached["runs"]) if isinstance(cached.get("runs"), int) else None,
            attempted_at_wall_s=attempted,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("RAM bandwidth cache %s is unreadable (%s): measuring again", cache_path, exc)
        return None
    if not 0 <= now_s - measured_s <= max_age_s or cached.get("fingerprint") != _fingerprint():
        return None
    return record


def write_cached(cache_path: Path, record: RamBandwidth) -> None:
    """Store `record` atomically; an unwritable cache only costs a measurement next time."""
    data: dict[str, object] = dataclasses.asdict(record)
    data["source"] = "measured"
    data["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.measured_at_wall_s))
    data["fingerprint"] = _fingerprint()
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, cache_path)
    except OSError as exc:
        log.warning("cannot write the RAM bandwidth cache %s: %s", cache_path, exc)


Measure = Callable[[float | None], BenchResult]  # skip_if_busy_pct -> result


class RamBandwidthKeeper:
    """The machine's RAM bandwidth: cached, measured when quiet, measured again when not trusted.

    `load_or_measure()` blocks (callers run it off the GUI thread). `after_tick()`
    never blocks: a due re-measurement runs on a background thread and hands the
    new figure to `on_update`.
    """

    def __init__(
        self,
        cache_path: Path,
        *,
        measure: Measure = lambda skip_pct: run_rambench(skip_pct),
        busy_cpu_pct: float = BUSY_CPU_PCT,
        retry_interval_s: float = RETRY_INTERVAL_S,
        suspect_interval_s: float = SUSPECT_INTERVAL_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache_path = cache_path
        self._measure = measure
        self._busy_cpu_pct = busy_cpu_pct
        self._retry_interval_s = retry_interval_s
        self._suspect_interval_s = suspect_interval_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._wall = wall_clock
        self._current: RamBandwidth | None = None
        self._thread: threading.Thread | None = None
        self._last_attempt_mono: float | None = None
        self._last_suspect_mono: float | None = None

    @property
    def current(self) -> RamBandwidth | None:
        return self._current

    @property
    def measuring(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load_or_measure(self) -> RamBandwidth:
        """The cached figure when fresh, measuring first when there is none or an untrusted one is due.

        Blocking (about 1.5 s when it measures). Raises RuntimeError when there is no figure at all.
        """
        cached = load_cached(self.cache_path, self._wall(), self._max_age_s)
        if cached is None:
            return self._attempt(None)
        self._current = cached
        last_try = cached.attempted_at_wall_s
        if cached.confidence != "quiet" and (
            last_try is None or self._wall() - last_try >= self._retry_interval_s
        ):
            return self._attempt(cached)
        return cached

    def after_tick(self, snapshot: Snapshot, on_update: Callable[[RamBandwidth], None]) -> None:
        """Start a background re-measurement when due; call at the end of every tick. Never blocks."""
        current = self._current
        if current is None or self.measuring:
            return
        now = self._clock()
        if current.confidence == "quiet":
            model = contradicting_model(snapshot, current.gbps)
            recent = (
                self._last_suspect_mono is not None
                and now - self._last_suspect_mono < self._suspect_interval_s
            )
            if model is None or recent:
                return
            self._last_suspect_mono = now
            log.warning(
                "RAM bandwidth %.1f GB/s is suspect: %s decodes at %.1f tok/s on the CPU; measuring again",
                current.gbps,
                model.name,
                model.decode_tok_s or model.last_decode_tok_s or 0.0,
            )
            current = dataclasses.replace(current, confidence="suspect")
            self._current = current
            write_cached(self.cache_path, current)
            on_update(current)
        elif self._last_attempt_mono is not None and now - self._last_attempt_mono < self._retry_interval_s:
            return
        self._last_attempt_mono = now
        previous = current

        def remeasure() -> None:
            try:
                record = self._attempt(previous)
            except Exception as exc:  # a failed benchmark only costs the CPU-side ceiling
                log.warning("RAM bandwidth re-measurement failed: %s", exc)
                return
            changed = (record.gbps, record.confidence, record.measured_at_wall_s)
            if changed != (previous.gbps, previous.confidence, previous.measured_at_wall_s):
                on_update(record)

        self._thread = threading.Thread(target=remeasure, name="ram-bandwidth", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float) -> bool:
        """Wait for a background measurement to end (for tests and shutdown); True when none runs."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.measuring

    def _attempt(self, previous: RamBandwidth | None) -> RamBandwidth:
        """Measure once (skipping a busy machine when a figure exists), store and return the figure."""
        self._last_attempt_mono = self._clock()
        result = self._measure(None if previous is None else self._busy_cpu_pct)
        now_wall = self._wall()
        gbps = result.gbps
        if gbps is None or not math.isfinite(gbps) or gbps <= 0:
            if previous is None:
                raise RuntimeError("RAM benchmark gave no figure")
            log.info(
                "RAM bandwidth not measured again: other processes use %s %% of the CPU",
                result.busy_cpu_pct,
            )
            record = dataclasses.replace(previous, attempted_at_wall_s=now_wall)
        elif result.busy_cpu_pct is None or result.busy_cpu_pct <= self._busy_cpu_pct:
            record = RamBandwidth(gbps, now_wall, "quiet", result.busy_cpu_pct, result.runs, now_wall)
        else:  # measured on a busy machine: a lower bound, kept until a quiet measurement
            best = max(gbps, previous.gbps) if previous is not None else gbps
            record = RamBandwidth(best, now_wall, "provisional", result.busy_cpu_pct, result.runs, now_wall)
        if record.attempted_at_wall_s == record.measured_at_wall_s:  # measured now, not postponed
            log.info(
                "RAM bandwidth %.1f GB/s (%s; other processes used %s %% of the CPU)",
                record.gbps,
                record.confidence,
                record.busy_cpu_pct,
            )
        write_cached(self.cache_path, record)
        self._current = record
        return record


def _as_bench(measure: Callable[[], float]) -> Measure:
    return lambda _skip_pct: BenchResult(gbps=float(measure()))


def cached_ram_bandwidth(
    cache_path: Path,
    max_age_s: float = MAX_AGE_S,
    measure: Callable[[], float] = measure_ram_bandwidth_gbps,
    now_s: float | None = None,
) -> tuple[float, str, float]:
    """(gbps, "measured", measured_wall_s) from `cache_path` when fresh, else measured and stored.

    `measure` returns GB/s alone (no CPU check: the figure counts as quiet).
    Blocking (it may measure): never on the GUI thread.
    """
    wall = (lambda: now_s) if now_s is not None else time.time
    keeper = RamBandwidthKeeper(cache_path, measure=_as_bench(measure), max_age_s=max_age_s, wall_clock=wall)
    record = keeper.load_or_measure()
    return record.gbps, "measured", record.measured_at_wall_s


def default_cache_path() -> Path:
    from trayapp import paths

    return paths.cache_dir() / "ram_bandwidth.json"


def default_ram_bandwidth() -> tuple[float, str]:
    """(gbps, source) from the cache, measured at most once a week. Blocking: never on the GUI thread."""
    record = RamBandwidthKeeper(default_cache_path()).load_or_measure()
    return record.gbps, "measured"
