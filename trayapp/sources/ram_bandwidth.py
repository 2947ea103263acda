"""The host's RAM read bandwidth: one trusted figure per machine that does not wander.

It is measured by `python -m trayapp.sources.rambench` in a short-lived subprocess (numpy never
loads here, its buffer of at most 256 MiB goes back with the process) and stored as ONE best-of
figure per machine (the cache file, keyed by a hardware fingerprint) that every process (tray,
agent, `watch`) reads and keeps. A busy machine only ever measures lower, so a new measurement
replaces it only when higher or on other hardware. A figure measured while other processes used
the CPU is "provisional" (measured again until a quiet one exists); a quiet one is measured again
only on evidence: a live CPU decode rate that proves it too low makes it "suspect". Each change of
the figure is recorded with its reason (`RamBandwidthChange`). Blocking calls never run on the GUI
thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trayapp.core.bandwidth import contradicting_model
from trayapp.core.model import Snapshot
from trayapp.sources.ram_bandwidth_cache import (
    Confidence,
    Fingerprint,
    RamBandwidth,
    hardware_fingerprint,
    read_cache,
    same_hardware,
    write_cached,
)

__all__ = [
    "RamBandwidthKeeper",
    "run_rambench",
]

log = logging.getLogger(__name__)

BUSY_CPU_PCT = 25.0  # other processes using more than this share of all cores: not a quiet machine
RETRY_INTERVAL_S = 600.0  # a provisional or suspect figure is measured again this often, when quiet
SUSPECT_INTERVAL_S = 1800.0  # a decode rate may call a figure suspect at most this often
HARDWARE_CHECK_INTERVAL_S = 60.0  # a running keeper compares the hardware fingerprint this often


@dataclass(frozen=True)
class BenchResult:
    """One run of the rambench subprocess. `gbps` is None when it skipped a busy machine."""

    gbps: float | None
    busy_cpu_pct: float | None = None  # other processes' share of all cores just before
    runs: int = 0
    buffer_bytes: int | None = None
    peak_rss_bytes: int | None = None


def run_rambench(
    skip_if_busy_pct: float | None = None,
    budget_s: float = 0.5,
    timeout_s: float = 60.0,
    buffer_bytes: int | None = None,
) -> BenchResult:
    """Run `python -m trayapp.sources.rambench` and read its JSON line. Blocking (about 1.5 s).

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
            [sys.executable, "-m", "trayapp.sources.rambench", *args],
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

    from trayapp.sources import rambench

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


Measure = Callable[[float | None], BenchResult]  # skip_if_busy_pct -> result


class RamBandwidthKeeper:
    """The machine's RAM bandwidth: one stored best-of figure per machine, shared by every process.

    Measured when there is none (or the hardware changed); a provisional one (a busy machine) again
    every `retry_interval_s` until a quiet one exists; a quiet one only on evidence: a CPU decode
    faster than it allows (at most every `suspect_interval_s`). It replaces the stored figure only
    when higher (or on other hardware), and adopts a higher one another process stored.
    `load_or_measure()` blocks (callers run it off the GUI thread). `after_tick()` never blocks: a
    due re-measurement runs on a background thread and hands the new figure to `on_update`.
    """

    def __init__(
        self,
        cache_path: Path,
        *,
        measure: Measure = lambda skip_pct: run_rambench(skip_pct),
        busy_cpu_pct: float = BUSY_CPU_PCT,
        retry_interval_s: float = RETRY_INTERVAL_S,
        suspect_interval_s: float = SUSPECT_INTERVAL_S,
        hardware_check_interval_s: float = HARDWARE_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fingerprint: Callable[[], Fingerprint] = hardware_fingerprint,
    ) -> None:
        self.cache_path = cache_path
        self._measure = measure
        self._busy_cpu_pct = busy_cpu_pct
        self._retry_interval_s = retry_interval_s
        self._suspect_interval_s = suspect_interval_s
        self._hardware_check_interval_s = hardware_check_interval_s
        self._clock = clock
        self._wall = wall_clock
        self._fingerprint = fingerprint
        self._hardware: Fingerprint | None = None  # the hardware the current figure belongs to
        self._current: RamBandwidth | None = None
        self._thread: threading.Thread | None = None
        self._last_attempt_mono: float | None = None
        self._last_suspect_mono: float | None = None
        self._last_hardware_check_mono: float | None = None
        self._seen_file: tuple[int, int, int] | None = None  # (inode, mtime ns, size) last read

    @property
    def current(self) -> RamBandwidth | None:
        return self._current

    @property
    def measuring(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load_or_measure(self) -> RamBandwidth:
        """The stored figure, measuring first when there is none for this hardware or a provisional
        one is due. Blocking (about 1.5 s when it measures). Raises RuntimeError without any figure."""
        self._hardware = dict(self._fingerprint())
        self._last_hardware_check_mono = self._clock()
        entry = read_cache(self.cache_path)
        if entry is None or not same_hardware(entry[1], self._hardware):
            return self._attempt(None)
        cached = entry[0]
        self._current = cached
        last_try = cached.attempted_at_wall_s
        if cached.confidence != "quiet" and (
            last_try is None or self._wall() - last_try >= self._retry_interval_s
        ):
            return self._attempt(cached)
        return cached

    def after_tick(self, snapshot: Snapshot, on_update: Callable[[RamBandwidth], None]) -> None:
        """Adopt what another process stored; start a background re-measurement when the hardware
        changed, a provisional figure is due, or a decode rate contradicts a quiet one. Call at the
        end of every tick; never blocks (a stat of the cache, a read only when it changed)."""
        if self._current is None or self.measuring:
            return
        now = self._clock()
        if self._hardware_changed(now):
            self._remeasure(None, on_update)
            return
        current = self._sync(on_update)
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
            current = write_cached(
                self.cache_path, dataclasses.replace(current, confidence="suspect"), self._hw()
            )
            self._current = current
            on_update(current)
        elif self._last_attempt_mono is not None and now - self._last_attempt_mono < self._retry_interval_s:
            return
        self._remeasure(current, on_update)

    def wait(self, timeout_s: float) -> bool:
        """Wait for a background measurement to end (for tests and shutdown); True when none runs."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.measuring

    def _hw(self) -> Fingerprint:
        if self._hardware is None:
            self._hardware = dict(self._fingerprint())
        return self._hardware

    def _hardware_changed(self, now_mono_s: float) -> bool:
        """Compare the hardware with the figure's every `hardware_check_interval_s`; True when other."""
        last = self._last_hardware_check_mono
        if last is not None and now_mono_s - last < self._hardware_check_interval_s:
            return False
        self._last_hardware_check_mono = now_mono_s
        present = dict(self._fingerprint())
        if self._hardware is None or same_hardware(self._hardware, present):
            self._hardware = self._hardware or present
            return False
        log.warning(
            "the hardware changed (%s → %s): measuring the RAM bandwidth again", self._hardware, present
        )
        self._hardware = present
        return True

    def _sync(self, on_update: Callable[[RamBandwidth], None]) -> RamBandwidth:
        """The stored figure when another process changed it (higher, or re-marked); a lower one
        (a writer that knows no better) is replaced by ours again. Reads only when the file changed."""
        current = self._current
        assert current is not None
        try:
            st = os.stat(self.cache_path)
        except OSError:
            return current
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen_file:
            return current
        self._seen_file = seen
        entry = read_cache(self.cache_path)
        if entry is None or not same_hardware(entry[1], self._hw()) or entry[0] == current:
            return current
        stored = entry[0]
        if stored.gbps < current.gbps:
            log.info(
                "RAM bandwidth cache holds %.1f GB/s, lower than %.1f: storing ours again",
                stored.gbps,
                current.gbps,
            )
            self._current = write_cached(self.cache_path, current, self._hw())
            return self._current
        log.info(
            "RAM bandwidth %.1f GB/s (%s) from the cache, stored by another process",
            stored.gbps,
            stored.confidence,
        )
        self._current = stored
        on_update(stored)
        return stored

    def _remeasure(self, previous: RamBandwidth | None, on_update: Callable[[RamBandwidth], None]) -> None:
        """Measure on a background thread (`previous` None: anew, even on a busy machine)."""
        self._last_attempt_mono = self._clock()
        before = self._current

        def remeasure() -> None:
            try:
                record = self._attempt(previous)
            except Exception as exc:  # a failed benchmark only costs the CPU-side ceiling
                log.warning("RAM bandwidth re-measurement failed: %s", exc)
                return
            if before is None or (record.gbps, record.confidence, record.measured_at_wall_s) != (
                before.gbps,
                before.confidence,
                before.measured_at_wall_s,
            ):
                on_update(record)

        self._thread = threading.Thread(target=remeasure, name="ram-bandwidth", daemon=True)
        self._thread.start()

    def _attempt(self, previous: RamBandwidth | None) -> RamBandwidth:
        """Measure once (skipping a busy machine when a figure exists); store best-of, return what is kept."""
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
        else:
            quiet = result.busy_cpu_pct is None or result.busy_cpu_pct <= self._busy_cpu_pct
            confidence: Confidence = "quiet" if quiet else "provisional"  # busy: a lower bound
            record = RamBandwidth(gbps, now_wall, confidence, result.busy_cpu_pct, result.runs, now_wall)
            log.info(
                "RAM bandwidth measured %.1f GB/s (%s; other processes used %s %% of the CPU)",
                gbps,
                confidence,
                result.busy_cpu_pct,
            )
        kept = write_cached(self.cache_path, record, self._hw())
        if kept.gbps != record.gbps:
            log.info("RAM bandwidth: the stored %.1f GB/s stays (the best measured)", kept.gbps)
        self._current = kept
        return kept


def _as_bench(measure: Callable[[], float]) -> Measure:
    return lambda _skip_pct: BenchResult(gbps=float(measure()))


def cached_ram_bandwidth(
    cache_path: Path,
    measure: Callable[[], float] = measure_ram_bandwidth_gbps,
    now_s: float | None = None,
) -> tuple[float, str, float]:
    """(gbps, "measured", measured_wall_s) from `cache_path` when stored for this hardware, else
    measured and stored.

    `measure` returns GB/s alone (no CPU check: the figure counts as quiet).
    Blocking (it may measure): never on the GUI thread.
    """
    wall = (lambda: now_s) if now_s is not None else time.time
    keeper = RamBandwidthKeeper(cache_path, measure=_as_bench(measure), wall_clock=wall)
    record = keeper.load_or_measure()
    return record.gbps, "measured", record.measured_at_wall_s


def default_cache_path() -> Path:
    from trayapp.config import paths

    return paths.cache_dir() / "ram_bandwidth.json"


def default_ram_bandwidth() -> tuple[float, str]:
    """(gbps, source): the stored figure (measured when there is none). Blocking: never on the GUI thread."""
    record = RamBandwidthKeeper(default_cache_path()).load_or_measure()
    return record.gbps, "measured"
