"""The monitor's polls on their own threads (issue #26: cheaper than a ThreadPoolExecutor's submit and
wait): every server polled at once, a tick waits at most its budget, a server still answering is not
polled again and its last reading is repeated with its age until HUNG_AFTER_S, then it is called hung;
a server no longer watched and a closed monitor leave no poll thread behind. Fake probes: nothing
real would hang on cue."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trayapp.config.settings import Settings
from trayapp.core.model import ServerReading
from trayapp.services.monitor import HUNG_AFTER_S, Monitor
from trayapp.sources.energy import HostEnergyProbe, MacmonProbe, RaplProbe
from trayapp.sources.gpu import AppleProbe, NvmlProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.hardware import HardwareProbe

BUDGET_S = 0.05


class FakeProbe:
    """Answers `ok` with its poll count; blocks while `gate` is clear."""

    kind = "llamacpp"

    def __init__(self, url: str, gate: threading.Event | None = None) -> None:
        self.url = url
        self.polls = 0
        self.gate = gate

    def poll(self, now_mono_s: float) -> ServerReading:
        self.polls += 1
        if self.gate is not None:
            self.gate.wait(30)
        return ServerReading(self.kind, self.url, "ok", reason=f"poll {self.polls}")

    def close(self) -> None:
        pass


def _poll_threads(*urls: str) -> list[str]:
    """The poll threads of these servers: another test's monitor (its threads still ending, on the
    same pytest worker) is not this one's business (counting every poll thread failed once so)."""
    return [t.name for t in threading.enumerate() if t.name in {f"llm-tray-poll {url}" for url in urls}]


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline_s, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def monitor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Monitor:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path))
    none = tmp_path / "nothing"
    hardware = HardwareProbe(
        NvmlProbe(driver_absent=lambda: True), AmdSysfsProbe(none), AppleProbe(platform="linux"),
        energy_probe=HostEnergyProbe(RaplProbe(none), MacmonProbe(platform="linux")),
    )  # fmt: skip
    now_s = [1000.0]
    made = Monitor(Settings(), record=False, measure_ram=False, discover=False, hardware_probe=hardware,
                   clock=lambda: now_s[0])  # fmt: skip
    made.now_s = now_s  # type: ignore[attr-defined]  # the test moves the monitor's clock
    return made


def test_servers_are_polled_at_once_and_a_slow_one_repeats_then_is_hung(monitor: Monitor) -> None:
    gate = threading.Event()
    fast, slow = FakeProbe("http://127.0.0.1:9001"), FakeProbe("http://127.0.0.1:9002", gate)
    gate.set()
    first = monitor._poll_all([fast, slow], 1000.0, BUDGET_S)
    assert [(r.url, r.reason, r.age_s) for r in first] == [
        (fast.url, "poll 1", None), (slow.url, "poll 1", None),
    ]  # fmt: skip
    gate.clear()  # the slow one's next poll does not return
    monitor.now_s[0] = 1001.0  # type: ignore[attr-defined]
    started_s = time.monotonic()
    second = monitor._poll_all([fast, slow], 1001.0, BUDGET_S)
    assert time.monotonic() - started_s < 5  # the budget, not the slow server, ends the wait
    assert second[0].reason == "poll 2" and second[0].age_s is None
    assert second[1].reason == "poll 1" and second[1].age_s == 1.0  # its last reading (at 1000 s), repeated
    monitor.now_s[0] = 1001.0 + HUNG_AFTER_S  # type: ignore[attr-defined]
    third = monitor._poll_all([fast, slow], 1001.0 + HUNG_AFTER_S, BUDGET_S)
    assert HUNG_AFTER_S == 10.0  # so: silent from 1001 s to 1011 s
    assert (third[1].status, third[1].reason) == ("error", "no answer for 10 s (server hung?)")
    assert (fast.polls, slow.polls) == (3, 2)  # the slow one was not asked again while answering
    gate.set()
    _wait_for(lambda: not monitor._polls[slow.url].running())
    fourth = monitor._poll_all([fast, slow], 1012.0, BUDGET_S)
    assert (fourth[1].status, fourth[1].reason, slow.polls) == ("ok", "poll 3", 3)  # answering: asked again
    monitor.close()


def test_no_poll_thread_outlives_its_server_or_the_monitor(monitor: Monitor) -> None:
    one, two = FakeProbe("http://127.0.0.1:9011"), FakeProbe("http://127.0.0.1:9012")
    assert _poll_threads(one.url, two.url) == []
    monitor._poll_all([one, two], 1000.0, BUDGET_S)
    assert sorted(_poll_threads(one.url, two.url)) == [f"llm-tray-poll {one.url}", f"llm-tray-poll {two.url}"]
    monitor._poll_all([one], 1001.0, BUDGET_S)  # the second server is no longer watched
    _wait_for(lambda: _poll_threads(one.url, two.url) == [f"llm-tray-poll {one.url}"])
    assert one.polls == 2 and two.polls == 1
    monitor.close()
    _wait_for(lambda: _poll_threads(one.url, two.url) == [])
