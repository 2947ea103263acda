"""A ceiling that does not wander (issue 24 item 7): one best-of RAM bandwidth per machine.

The stored figure changes only when a measurement is higher (a busy machine only ever measures
lower), when the hardware changed, or after the evidence rule (a CPU decode faster than the
figure allows); a quiet figure is never measured again on a timer. Every process keeps the same
stored value, and a change says what it was, when and why. Real cache files under tmp_path, a
scripted benchmark and injected clocks; the expected figures are the scripted ones.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading, RamBandwidthChange
from trayapp.core.jsonview import hardware_json
from trayapp.core.machine import ram_bandwidth_change_line
from trayapp.core.model import ModelStatus, ServerStatus, Snapshot
from trayapp.sources.hardware import HardwareProbe
from trayapp.sources.host import HostProbe
from trayapp.sources.ram_bandwidth import BenchResult, RamBandwidthKeeper
from trayapp.sources.ram_bandwidth_cache import RamBandwidth, load_cached, write_cached

FP = {"machine": "x86_64", "cpu_count": 16, "ram_total_bytes": 64_000_000_000}
WALL0 = 1_764_684_000.0  # 2025-12-02 14:00:00 UTC
HALF_GB = 500_000_000


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class Script:
    """A scripted benchmark: each call returns the next result; no result left fails the test."""

    def __init__(self, *results: BenchResult) -> None:
        self.results = list(results)
        self.calls = 0

    def __call__(self, _skip_if_busy_pct: float | None) -> BenchResult:
        self.calls += 1
        assert self.results, "measured again without evidence"
        return self.results.pop(0)


def quiet(gbps: float) -> BenchResult:
    return BenchResult(gbps, busy_cpu_pct=2.0, runs=20)


def busy(gbps: float) -> BenchResult:
    return BenchResult(gbps, busy_cpu_pct=90.0, runs=20)


class NoGpu:
    reason = "no GPU (test)"

    def read(self) -> tuple[GpuReading, ...]:
        return ()

    def close(self) -> None:
        pass


def keeper(
    cache: Path, script: Script, mono: Clock, wall: Clock, fingerprint: dict[str, object] | None = None
) -> RamBandwidthKeeper:
    fp = dict(fingerprint or FP)
    return RamBandwidthKeeper(cache, measure=script, clock=mono, wall_clock=wall, fingerprint=lambda: fp)


def idle() -> Snapshot:
    return Snapshot(0.0, 0.0, (), HardwareSnapshot((), HostReading(None, None, None)))


def cpu_decode(tok_s: float) -> Snapshot:
    """A local model wholly on the CPU, decoding at `tok_s` with exactly 0.5 GB per token."""
    model = ModelStatus(
        name="qwen-0.5b",
        phase="decoding",
        gpu_fraction=0.0,
        bytes_per_token=HALF_GB,
        bytes_per_token_exact=True,
        decode_tok_s=tok_s,
    )
    server = ServerStatus("llamacpp", "http://127.0.0.1:8080", "ok", models=(model,))
    return Snapshot(0.0, 0.0, (server,), HardwareSnapshot((), HostReading(None, None, None)))


def stored(cache: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(cache.read_text(encoding="utf-8"))
    return data


# --------------------------------------------------------------------------- best-of


def test_a_provisional_figure_is_raised_by_a_quiet_one_and_the_change_says_so(tmp_path: Path) -> None:
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    k = keeper(cache, Script(busy(28.4), quiet(31.3)), mono, wall)
    first = k.load_or_measure()
    assert (first.gbps, first.confidence, first.change) == (28.4, "provisional", None)  # nothing before it
    updates: list[RamBandwidth] = []
    mono.now_s, wall.now_s = 600.0, WALL0 + 120 * 60  # 10 minutes on the monotonic clock; 16:00 UTC
    k.after_tick(idle(), updates.append)
    assert k.wait(30)
    assert [(u.gbps, u.confidence) for u in updates] == [(31.3, "quiet")]
    change = RamBandwidthChange(28.4, 31.3, WALL0 + 7200, "first quiet measurement")
    assert updates[0].change == change
    assert load_cached(cache, fingerprint=FP) == updates[0]  # what is stored is what is used


def test_a_quiet_measurement_lower_than_the_provisional_one_keeps_the_higher(tmp_path: Path) -> None:
    """A busy machine only ever measures lower: 28.4 measured busy is still a floor under 25.0 quiet."""
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    k = keeper(cache, Script(busy(28.4), quiet(25.0)), mono, wall)
    k.load_or_measure()
    mono.now_s, wall.now_s = 600.0, WALL0 + 600
    updates: list[RamBandwidth] = []
    k.after_tick(idle(), updates.append)
    assert k.wait(30)
    assert [(u.gbps, u.confidence, u.change) for u in updates] == [(28.4, "quiet", None)]
    assert (stored(cache)["gbps"], stored(cache)["confidence"]) == (28.4, "quiet")


def test_a_quiet_figure_is_never_measured_again_on_a_timer(tmp_path: Path) -> None:
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    script = Script(quiet(31.3))
    k = keeper(cache, script, mono, wall)
    k.load_or_measure()
    for _ in range(5):  # ticks over five weeks, no evidence
        mono.now_s += 7 * 86400
        wall.now_s += 7 * 86400
        k.after_tick(idle(), lambda _r: pytest.fail("the figure changed"))
        assert not k.measuring
    # a new process a year later (the old cache expired after a week) reads it without measuring
    wall.now_s = WALL0 + 365 * 86400
    again = keeper(cache, script, Clock(0.0), wall).load_or_measure()
    assert (again.gbps, again.measured_at_wall_s) == (31.3, WALL0)
    assert script.calls == 1


def test_the_evidence_rule_measures_again_and_a_higher_figure_says_why(tmp_path: Path) -> None:
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    k = keeper(cache, Script(quiet(13.0), quiet(21.5)), mono, wall)
    k.load_or_measure()
    updates: list[RamBandwidth] = []
    k.after_tick(cpu_decode(27.0), updates.append)  # 27 × 0.5 GB = 13.5 GB/s ≤ 13 × 1.1 = 14.3: no evidence
    assert not k.measuring and updates == []
    wall.now_s = WALL0 + 120
    k.after_tick(cpu_decode(40.0), updates.append)  # 40 × 0.5 GB = 20 GB/s > 14.3 GB/s: contradicted
    assert k.wait(30)
    assert [(u.gbps, u.confidence) for u in updates] == [(13.0, "suspect"), (21.5, "quiet")]
    assert updates[-1].change == RamBandwidthChange(
        13.0, 21.5, WALL0 + 120, "decode faster than the ceiling allowed"
    )


def test_a_lower_measurement_after_the_evidence_keeps_the_stored_figure(tmp_path: Path) -> None:
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    k = keeper(cache, Script(quiet(13.0), quiet(12.0)), mono, wall)
    k.load_or_measure()
    updates: list[RamBandwidth] = []
    k.after_tick(cpu_decode(40.0), updates.append)
    assert k.wait(30)
    assert [(u.gbps, u.confidence, u.change) for u in updates] == [
        (13.0, "suspect", None),
        (13.0, "quiet", None),
    ]
    assert stored(cache)["gbps"] == 13.0


# --------------------------------------------------------------------------- hardware change


def test_a_hardware_change_replaces_the_figure_even_when_lower(tmp_path: Path) -> None:
    cache, wall = tmp_path / "rb.json", Clock(WALL0)
    keeper(cache, Script(quiet(36.0)), Clock(0.0), wall).load_or_measure()
    smaller = {**FP, "ram_total_bytes": 32_000_000_000}  # half the RAM: other hardware
    wall.now_s = WALL0 + 86400
    record = keeper(cache, Script(quiet(20.0)), Clock(0.0), wall, smaller).load_or_measure()
    assert (record.gbps, record.confidence) == (20.0, "quiet")
    assert record.change == RamBandwidthChange(36.0, 20.0, WALL0 + 86400, "hardware changed")
    assert stored(cache)["fingerprint"] == smaller and stored(cache)["gbps"] == 20.0


def test_a_few_mb_less_ram_after_a_kernel_update_is_the_same_hardware(tmp_path: Path) -> None:
    cache, wall = tmp_path / "rb.json", Clock(WALL0)
    keeper(cache, Script(quiet(36.0)), Clock(0.0), wall).load_or_measure()
    kernel_update = {**FP, "ram_total_bytes": 64_000_000_000 - 50_000_000}  # 0.08 % less
    record = keeper(cache, Script(), Clock(0.0), wall, kernel_update).load_or_measure()
    assert (record.gbps, record.change) == (36.0, None)


def test_a_running_keeper_notices_a_hardware_change(tmp_path: Path) -> None:
    cache, mono, wall = tmp_path / "rb.json", Clock(0.0), Clock(WALL0)
    fp = dict(FP)
    k = RamBandwidthKeeper(
        cache, measure=Script(quiet(36.0), quiet(20.0)), clock=mono, wall_clock=wall, fingerprint=lambda: fp
    )
    k.load_or_measure()
    fp["cpu_count"] = 8  # half the cores (a VM resized, SMT off)
    mono.now_s, wall.now_s = 120.0, WALL0 + 120
    updates: list[RamBandwidth] = []
    k.after_tick(idle(), updates.append)
    assert k.wait(30)
    assert [(u.gbps, u.change) for u in updates] == [
        (20.0, RamBandwidthChange(36.0, 20.0, WALL0 + 120, "hardware changed"))
    ]


# --------------------------------------------------------------------------- several processes, one file


def test_a_second_process_never_lowers_the_stored_figure(tmp_path: Path) -> None:
    """Tray and agent start together, neither finding a cache: both measure; the higher one stays."""
    cache, wall = tmp_path / "rb.json", Clock(WALL0)
    agent = keeper(cache, Script(quiet(36.0)), Clock(0.0), wall)
    tray_script = Script(quiet(31.3))

    def tray_measures(skip_pct: float | None) -> BenchResult:
        agent.load_or_measure()  # the agent stores its 36 GB/s while the tray's benchmark runs
        return tray_script(skip_pct)

    tray = RamBandwidthKeeper(
        cache, measure=tray_measures, clock=Clock(0.0), wall_clock=wall, fingerprint=lambda: FP
    )
    record = tray.load_or_measure()
    assert record.gbps == 36.0 and tray.current == agent.current
    assert stored(cache)["gbps"] == 36.0


def test_every_process_adopts_the_higher_figure_another_one_stored(tmp_path: Path) -> None:
    cache, wall = tmp_path / "rb.json", Clock(WALL0)
    tray_mono = Clock(0.0)
    tray = keeper(cache, Script(quiet(31.3)), tray_mono, wall)
    assert tray.load_or_measure().gbps == 31.3
    # the agent's own measurement comes in higher (it started before the tray's figure was stored)
    wall.now_s = WALL0 + 60
    write_cached(cache, RamBandwidth(36.0, WALL0 + 60, "quiet", 1.0, 20, WALL0 + 60), FP)
    updates: list[RamBandwidth] = []
    tray_mono.now_s = 1.0
    tray.after_tick(idle(), updates.append)
    assert [(u.gbps, u.change) for u in updates] == [
        (36.0, RamBandwidthChange(31.3, 36.0, WALL0 + 60, "a higher measurement"))
    ]
    tray.after_tick(idle(), updates.append)  # nothing new in the file: nothing to adopt
    assert len(updates) == 1
    # a writer that knows no better (an older version) stores a lower figure: the keeper restores the max
    cache.write_text(json.dumps({**stored(cache), "gbps": 29.0}), encoding="utf-8")
    tray.after_tick(idle(), updates.append)
    assert len(updates) == 1 and stored(cache)["gbps"] == 36.0


def test_concurrent_writers_keep_the_highest(tmp_path: Path) -> None:
    """8 writers × 25 writes of distinct figures at once: the file ends with the highest, 199.0."""
    cache = tmp_path / "rb.json"
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            start.wait(30)
            for i in range(25):
                gbps = float(i * 8 + index)  # 0 … 199, each once
                write_cached(cache, RamBandwidth(gbps, WALL0, "quiet", 1.0, 20, WALL0), FP)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert stored(cache)["gbps"] == 199.0
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def test_write_cached_rereads_and_returns_what_is_stored(tmp_path: Path) -> None:
    cache = tmp_path / "rb.json"
    write_cached(cache, RamBandwidth(36.0, WALL0, "quiet"), FP)
    kept = write_cached(cache, RamBandwidth(31.3, WALL0 + 60, "quiet"), FP)
    assert (kept.gbps, kept.measured_at_wall_s) == (36.0, WALL0)


# --------------------------------------------------------------------------- the snapshot says so


CHANGE = RamBandwidthChange(28.4, 31.3, WALL0 + 2 * 3600 + 120, "first quiet measurement")  # 16:02 UTC


def test_the_change_reaches_the_hardware_snapshot_and_its_json() -> None:
    probe = HardwareProbe(NoGpu(), NoGpu(), NoGpu(), HostProbe())
    probe.set_measured_ram_bandwidth(RamBandwidth(31.3, CHANGE.changed_at_wall_s, "quiet", change=CHANGE))
    host = probe.read().host
    assert host.ram_bandwidth_change == CHANGE
    assert hardware_json(HardwareSnapshot((), host))["ram_bandwidth_change"] == {
        "previous_gbps": 28.4,
        "gbps": 31.3,
        "at": "2025-12-02T16:02:00Z",
        "reason": "first quiet measurement",
    }
    probe.set_ram_bandwidth(60.0, "given")
    assert probe.read().host.ram_bandwidth_change is None
    assert hardware_json(HardwareSnapshot((), HostReading(1, 1, 54.0)))["ram_bandwidth_change"] is None


def test_the_change_line() -> None:
    same_day = CHANGE.changed_at_wall_s + 3600
    assert ram_bandwidth_change_line(CHANGE, same_day) == (
        "ceiling changed 28.4 → 31.3 GB/s RAM at 16:02 UTC: first quiet measurement"
    )
    next_day = CHANGE.changed_at_wall_s + 86400
    assert ram_bandwidth_change_line(CHANGE, next_day) == (
        "ceiling changed 28.4 → 31.3 GB/s RAM at 2025-12-02 16:02 UTC: first quiet measurement"
    )
    assert ram_bandwidth_change_line(None, same_day) is None
