"""A RAM bandwidth you can trust: measured in a bounded subprocess, on a quiet machine, again when untrusted.

The recovery test runs real busy-loop processes and the real benchmark; the
keeper's rules are also checked with a scripted benchmark (fast, exact).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from trayapp.config.settings import Settings
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.model import ModelStatus, ServerStatus, Snapshot
from trayapp.services.monitor import Monitor
from trayapp.sources.hardware import HardwareProbe
from trayapp.sources.host import HostProbe
from trayapp.sources.ram_bandwidth import (
    BUSY_CPU_PCT,
    BenchResult,
    RamBandwidthKeeper,
    run_rambench,
)
from trayapp.sources.ram_bandwidth_cache import RamBandwidth, load_cached
from trayapp.sources.rambench import buffer_bytes_for, last_level_cache_bytes

MIB = 2**20
ROOT = Path(__file__).resolve().parents[2]


class NoGpu:
    reason = "no GPU (test)"

    def read(self) -> tuple[GpuReading, ...]:
        return ()

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


# --------------------------------------------------------------------------- the benchmark's bounds


@pytest.mark.parametrize(
    ("llc", "expected_bytes"),
    [
        ("4096K", 64 * MIB),  # 8 × 4 MiB = 32 MiB → the 64 MiB floor
        ("16384K", 128 * MIB),  # 8 × 16 MiB
        ("32M", 256 * MIB),  # 8 × 32 MiB = 256 MiB, the cap itself
        ("107520K", 256 * MIB),  # 8 × 105 MiB = 840 MiB → capped at 256 MiB
    ],
)
def test_buffer_is_sized_from_the_last_level_cache(tmp_path: Path, llc: str, expected_bytes: int) -> None:
    for level, size in (("index0", "48K"), ("index2", "2048K"), ("index3", llc)):
        (tmp_path / level).mkdir()
        (tmp_path / level / "size").write_text(size + "\n")
    assert buffer_bytes_for(last_level_cache_bytes(tmp_path)) == expected_bytes


def test_unreadable_cache_size_gets_the_safe_default(tmp_path: Path) -> None:
    assert last_level_cache_bytes(tmp_path / "absent") == 32 * MIB  # → 256 MiB buffer
    assert buffer_bytes_for(32 * MIB) == 256 * MIB


def test_benchmark_subprocess_memory_is_bounded() -> None:
    """Its RSS, sampled while it runs and as its own ru_maxrss, stays under the buffer + 128 MiB."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trayapp.sources.rambench", "--budget-s", "0.3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    watched = psutil.Process(proc.pid)
    peak_sampled = 0
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                peak_sampled = max(peak_sampled, watched.memory_info().rss)
            except psutil.Error:
                break  # it just ended
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["buffer_bytes"] <= 256 * MIB
    bound = result["buffer_bytes"] + 128 * MIB
    assert 0 < peak_sampled <= bound
    if result["peak_rss_bytes"] is not None:
        assert result["buffer_bytes"] <= result["peak_rss_bytes"] <= bound  # the buffer was really touched
    assert result["gbps"] > 0 and result["runs"] >= 2


def test_the_reported_peak_is_the_benchmarks_own_not_its_parents() -> None:
    """Started from a parent holding ~600 MiB (like the app or a test runner), the benchmark still
    reports its own peak: on Linux `ru_maxrss` survives exec and would report the parent's."""
    parent = (
        "import subprocess, sys\n"
        "held = bytearray(600 * 1024 * 1024)\n"
        "for i in range(0, len(held), 4096): held[i] = 1\n"
        "out = subprocess.run([sys.executable, '-m', 'trayapp.sources.rambench', '--budget-s', '0.2'],\n"
        "                     capture_output=True, text=True, timeout=60).stdout\n"
        "print(out.strip().splitlines()[-1])\n"
    )
    command = [sys.executable, "-c", parent]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["buffer_bytes"] <= result["peak_rss_bytes"] <= result["buffer_bytes"] + 128 * MIB


def test_numpy_never_loads_in_the_app_process() -> None:
    code = (
        "import sys\n"
        "from trayapp.sources.ram_bandwidth import measure_ram_bandwidth_gbps\n"
        "import trayapp.services.monitor\n"
        "gbps = measure_ram_bandwidth_gbps(budget_s=0.1)\n"
        "print(gbps, 'numpy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    gbps, numpy_loaded = done.stdout.split()
    assert float(gbps) > 0 and numpy_loaded == "False"


# --------------------------------------------------------------------------- the cache file


def _fingerprint() -> dict[str, object]:
    return {
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": int(psutil.virtual_memory().total),
    }


class Script:
    """A scripted benchmark: each call returns the next result (and counts the calls)."""

    def __init__(self, *results: BenchResult) -> None:
        self.results = list(results)
        self.skip_args: list[float | None] = []

    def __call__(self, skip_if_busy_pct: float | None) -> BenchResult:
        self.skip_args.append(skip_if_busy_pct)
        return self.results.pop(0)


def test_cache_keeps_confidence_busy_share_and_runs(tmp_path: Path) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    keeper = RamBandwidthKeeper(cache, measure=Script(BenchResult(13.2, 3.5, 24)), wall_clock=Clock(5000.0))
    assert keeper.load_or_measure() == RamBandwidth(13.2, 5000.0, "quiet", 3.5, 24, 5000.0)
    stored = json.loads(cache.read_text())
    assert {k: stored[k] for k in ("gbps", "measured_at_wall_s", "confidence", "busy_cpu_pct", "runs")} == {
        "gbps": 13.2,
        "measured_at_wall_s": 5000.0,
        "confidence": "quiet",
        "busy_cpu_pct": 3.5,
        "runs": 24,
    }
    again = RamBandwidthKeeper(cache, measure=Script(), wall_clock=Clock(5000.0 + 86400))
    assert again.load_or_measure().gbps == 13.2  # fresh and quiet: not measured again


def test_old_cache_format_loads_and_is_measured_again(tmp_path: Path) -> None:
    """The format before confidence existed: it may have been measured on a busy machine."""
    cache = tmp_path / "ram_bandwidth.json"
    old = {"gbps": 6.4, "source": "measured", "measured_wall_s": 1000.0, "date": "1970-01-01T00:16:40Z"}
    cache.write_text(json.dumps({**old, "fingerprint": _fingerprint()}))
    loaded = load_cached(cache)
    assert loaded == RamBandwidth(6.4, 1000.0, "provisional")
    script = Script(BenchResult(13.2, 2.0, 20))
    record = RamBandwidthKeeper(cache, measure=script, wall_clock=Clock(4600.0)).load_or_measure()
    assert (record.gbps, record.confidence) == (13.2, "quiet")
    assert script.skip_args == [BUSY_CPU_PCT]  # a figure exists: a busy machine would only postpone


def test_old_cache_on_a_busy_machine_keeps_its_figure(tmp_path: Path) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    cache.write_text(json.dumps({"gbps": 6.4, "measured_wall_s": 1000.0, "fingerprint": _fingerprint()}))
    keeper = RamBandwidthKeeper(cache, measure=Script(BenchResult(None, 80.0)), wall_clock=Clock(4600.0))
    record = keeper.load_or_measure()
    assert (record.gbps, record.confidence, record.attempted_at_wall_s) == (6.4, "provisional", 4600.0)
    # the try is remembered: a `status` within 10 minutes does not try again
    keeper = RamBandwidthKeeper(cache, measure=Script(), wall_clock=Clock(4600.0 + 599))
    assert keeper.load_or_measure().gbps == 6.4


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"gbps": "fast", "measured_at_wall_s": 100}',
        '{"gbps": 13.2, "measured_at_wall_s": 100, "confidence": "certain"}',
        '{"gbps": 13.2}',
        '{"gbps": Infinity, "measured_at_wall_s": 100}',
    ],
)
def test_corrupt_cache_is_measured_again_with_a_log_line(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "ram_bandwidth.json"
    cache.write_text(content)
    keeper = RamBandwidthKeeper(cache, measure=Script(BenchResult(13.2, 1.0, 20)), wall_clock=Clock(200.0))
    with caplog.at_level(logging.WARNING, logger="trayapp.sources.ram_bandwidth_cache"):
        assert keeper.load_or_measure().gbps == 13.2
    assert any("unreadable" in r.getMessage() for r in caplog.records)
    assert json.loads(cache.read_text())["confidence"] == "quiet"


# --------------------------------------------------------------------------- the keeper's rules


def _idle_snapshot() -> Snapshot:
    host = HostReading(None, None, None)
    return Snapshot(0.0, 0.0, (), HardwareSnapshot((), host))


def _cpu_decode_snapshot(tok_s: float, bytes_per_token: int) -> Snapshot:
    model = ModelStatus(
        name="qwen-0.5b",
        phase="decoding",
        gpu_fraction=0.0,
        bytes_per_token=bytes_per_token,
        bytes_per_token_exact=True,
        decode_tok_s=tok_s,
    )
    server = ServerStatus("llamacpp", "http://127.0.0.1:8080", "ok", models=(model,))
    return Snapshot(0.0, 0.0, (server,), HardwareSnapshot((), HostReading(None, None, None)))


def test_provisional_figure_is_measured_again_in_the_background(tmp_path: Path) -> None:
    clock = Clock(100.0)
    release = threading.Event()
    script = Script(BenchResult(6.4, 100.0, 20), BenchResult(None, 90.0), BenchResult(13.2, 4.0, 20))

    def measure(skip_pct: float | None) -> BenchResult:
        if script.skip_args:  # the re-measurements wait until the test lets them go
            assert release.wait(30)
        return script(skip_pct)

    updates: list[RamBandwidth] = []
    keeper = RamBandwidthKeeper(tmp_path / "rb.json", measure=measure, clock=clock)
    first = keeper.load_or_measure()
    assert (first.gbps, first.confidence, first.busy_cpu_pct) == (6.4, "provisional", 100.0)

    keeper.after_tick(_idle_snapshot(), updates.append)
    assert not keeper.measuring  # tried 0 s ago: not due
    clock.now_s += 600
    started = time.monotonic()
    keeper.after_tick(_idle_snapshot(), updates.append)
    assert keeper.measuring and time.monotonic() - started < 1.0  # never blocks the tick
    release.set()
    assert keeper.wait(30)
    assert updates == []  # still busy: postponed, the figure stays
    clock.now_s += 600
    keeper.after_tick(_idle_snapshot(), updates.append)
    assert keeper.wait(30)
    assert [(u.gbps, u.confidence) for u in updates] == [(13.2, "quiet")]
    assert script.skip_args == [None, BUSY_CPU_PCT, BUSY_CPU_PCT]
    clock.now_s += 6000
    keeper.after_tick(_idle_snapshot(), updates.append)
    assert not keeper.measuring  # a quiet figure is not measured again


def test_a_cpu_decode_rate_above_the_figure_makes_it_suspect(tmp_path: Path) -> None:
    clock = Clock(0.0)
    script = Script(BenchResult(13.0, 2.0, 20), BenchResult(21.5, 3.0, 20), BenchResult(21.0, 3.0, 20))
    keeper = RamBandwidthKeeper(tmp_path / "rb.json", measure=script, clock=clock, suspect_interval_s=1800)
    keeper.load_or_measure()
    updates: list[RamBandwidth] = []
    # 40 tok/s × 0.5 GB = 20 GB/s > 13 GB/s × 1.1
    keeper.after_tick(_cpu_decode_snapshot(40.0, 500_000_000), updates.append)
    assert keeper.wait(30)
    assert [(u.gbps, u.confidence) for u in updates] == [(13.0, "suspect"), (21.5, "quiet")]
    # 45 tok/s × 0.5 GB = 22.5 GB/s: 21.5 GB/s is within the tolerance (23.65): trusted
    keeper.after_tick(_cpu_decode_snapshot(45.0, 500_000_000), updates.append)
    # 50 tok/s × 0.5 GB = 25 GB/s > 23.65: contradicted again, but only 10 minutes after the last time
    clock.now_s += 600
    keeper.after_tick(_cpu_decode_snapshot(50.0, 500_000_000), updates.append)
    assert not keeper.measuring and len(updates) == 2
    clock.now_s += 1200  # 30 minutes after the first suspicion
    keeper.after_tick(_cpu_decode_snapshot(50.0, 500_000_000), updates.append)
    assert keeper.wait(30)
    assert [u.confidence for u in updates[2:]] == ["suspect", "quiet"]


def test_hardware_probe_carries_when_and_how_confident() -> None:
    probe = HardwareProbe(NoGpu(), NoGpu(), NoGpu(), HostProbe())
    probe.set_measured_ram_bandwidth(RamBandwidth(13.2, 1000.0, "provisional", 80.0, 20))
    host = probe.read().host
    assert (host.ram_bandwidth_gbps, host.ram_bandwidth_source) == (13.2, "measured")
    assert (host.ram_bandwidth_measured_wall_s, host.ram_bandwidth_confidence) == (1000.0, "provisional")
    probe.set_ram_bandwidth(60.0, "given")
    host = probe.read().host
    assert host.ram_bandwidth_measured_wall_s is None and host.ram_bandwidth_confidence is None


# --------------------------------------------------------------------------- the scenario, for real


@contextmanager
def cpu_hogs(count: int, limit_s: float = 120.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` busy-loop processes, each ending by itself after `limit_s`, killed on exit."""
    code = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until each one has really burnt CPU
            if all(psutil.Process(h.pid).cpu_times().user > 0.2 for h in hogs):
                break
            time.sleep(0.05)
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=10)


def _references_until_one_agrees(gbps: float, tolerance: float, deadline_s: float) -> list[float]:
    """Real benchmarks on a quiet machine (GB/s), until one agrees with `gbps` to `tolerance` or
    `deadline_s` passes. "Quiet" allows neighbours up to BUSY_CPU_PCT of the cores, and within that the
    figure moves with them (20 vs 34 GB/s on a 2-core host, a neighbour at 19 % of its cores): one
    reference taken at a busier moment than the monitor's run proves nothing either way, while a wrong
    figure agrees with none of them. Empty when the machine was never quiet."""
    references: list[float] = []
    while time.monotonic() < deadline_s:
        result = run_rambench(skip_if_busy_pct=BUSY_CPU_PCT)
        if result.gbps is not None:
            references.append(result.gbps)
            if abs(gbps - result.gbps) <= tolerance * result.gbps:
                break
        time.sleep(2)
    return references


@pytest.mark.alone  # its quiet measurement needs the machine without the suite's other worker
def test_busy_first_measurement_is_provisional_and_recovers_when_quiet() -> None:
    clock = Clock(1000.0)
    hog_count = max(2, os.cpu_count() or 1)  # every core busy, whatever the machine
    with cpu_hogs(hog_count):
        monitor = Monitor(
            Settings(),
            discover=False,
            record=False,
            hardware_probe=HardwareProbe(NoGpu(), NoGpu(), NoGpu(), HostProbe()),
            clock=clock,
        )
        first = monitor.tick().hardware.host
    try:
        assert first.ram_bandwidth_confidence == "provisional"
        assert first.ram_bandwidth_gbps is not None and first.ram_bandwidth_measured_wall_s is not None
        provisional_gbps = first.ram_bandwidth_gbps

        # Hogs gone: the monitor measures again by itself, every 10 minutes until the machine is quiet.
        keeper = monitor._ram_keeper
        deadline = time.monotonic() + 60  # a quiet host is quiet at once; a busy one stays busy (skip)
        host = first
        while host.ram_bandwidth_confidence != "quiet" and time.monotonic() < deadline:
            clock.now_s += 601
            started = time.monotonic()
            monitor.tick()
            assert time.monotonic() - started < 2.0  # the measurement runs beside the tick
            assert keeper.wait(120)
            host = monitor.tick().hardware.host
        if host.ram_bandwidth_confidence != "quiet":
            pytest.skip("other processes kept this machine busy for a minute: no quiet measurement")
        recovered = host.ram_bandwidth_gbps
        assert recovered is not None
        references = _references_until_one_agrees(recovered, 0.30, time.monotonic() + 60)
        if not references:
            pytest.skip("other processes kept this machine busy: no clean reference measurement")
    finally:
        monitor.close()
    # best-of (#24): the quiet figure replaces the provisional one only when higher
    assert recovered >= provisional_gbps
    assert abs(recovered - references[-1]) <= 0.30 * references[-1], (
        f"no quiet reference within 60 s agrees with the recovered {recovered:.1f} GB/s to 30 %: {references}"
    )
    assert host.ram_bandwidth_measured_wall_s is not None
    if recovered > provisional_gbps:  # raised: measured by the quiet run, and the snapshot says so
        assert host.ram_bandwidth_measured_wall_s > (first.ram_bandwidth_measured_wall_s or 0)
        change = host.ram_bandwidth_change
        assert change is not None and change.reason == "first quiet measurement"
        assert (change.previous_gbps, change.gbps) == (provisional_gbps, recovered)


def test_status_says_when_the_figure_was_measured_and_how_far_to_trust_it() -> None:
    from tests.support.cli import run_cli
    from trayapp.config import paths

    measured_s = time.time() - 60  # a minute ago, so `status` does not try again (10 minutes)
    record = {
        "gbps": 6.4,
        "measured_at_wall_s": measured_s,
        "confidence": "provisional",
        "busy_cpu_pct": 100.0,
        "runs": 20,
        "attempted_at_wall_s": measured_s,
        "fingerprint": _fingerprint(),
    }
    (paths.cache_dir() / "ram_bandwidth.json").write_text(json.dumps(record))
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(measured_s))

    text = run_cli("status", "--no-discover", "--endpoint", "http://127.0.0.1:9")
    assert text.returncode == 0, text.stderr
    assert f"6 GB/s (measured {when} UTC, provisional: the machine was busy)" in text.stdout

    result = run_cli("status", "--json", "--no-discover", "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 0, result.stderr
    hardware = json.loads(result.stdout)["hardware"]
    assert (hardware["ram_bandwidth_gbps"], hardware["ram_bandwidth_confidence"]) == (6.4, "provisional")
    assert hardware["ram_bandwidth_measured_at"].startswith(when.replace(" ", "T"))


def test_status_text_and_json_say_the_ceiling_changed() -> None:
    """The real `status`, with a stored figure that changed an hour ago (this machine's fingerprint)."""
    import json
    import time

    from tests.support.cli import run_cli
    from trayapp.config import paths
    from trayapp.core.hardware_readings import RamBandwidthChange
    from trayapp.sources.ram_bandwidth_cache import RamBandwidth, hardware_fingerprint, write_cached

    now_s = time.time()
    at_s = float(int(now_s) - 3600)  # whole seconds: "at" has no fraction
    change = RamBandwidthChange(28.4, 31.3, at_s, "first quiet measurement")
    record = RamBandwidth(31.3, at_s, "quiet", 2.0, 20, at_s, change)
    cache = paths.cache_dir() / "ram_bandwidth.json"
    write_cached(cache, record, hardware_fingerprint())
    when = time.strftime("%H:%M", time.gmtime(at_s))
    if time.gmtime(at_s).tm_yday != time.gmtime(now_s).tm_yday:  # an hour ago was yesterday (UTC)
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(at_s))

    text = run_cli("status", "--no-discover", "--endpoint", "http://127.0.0.1:9")
    assert text.returncode == 0, text.stderr
    assert f"ceiling changed 28.4 → 31.3 GB/s RAM at {when} UTC: first quiet measurement" in text.stdout

    result = run_cli("status", "--json", "--no-discover", "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 0, result.stderr
    hardware = json.loads(result.stdout)["hardware"]
    assert hardware["ram_bandwidth_gbps"] == 31.3
    assert hardware["ram_bandwidth_change"] == {
        "previous_gbps": 28.4,
        "gbps": 31.3,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at_s)),
        "reason": "first quiet measurement",
    }
