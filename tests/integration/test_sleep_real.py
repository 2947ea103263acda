"""A sleeping llama-server is shown as sleeping and never kept awake (issue #11).

First the server's own behaviour that the probe builds on (`--sleep-idle-seconds`): `/props`,
`/health` and `/metrics` neither keep it awake nor wake it, `/slots` keeps it awake. Then the
monitor itself — `llm-tray watch --json` as a real subprocess (with and without `--metrics`: the
server process's CPU use is the local sign of work) and the tray's in-process `Monitor` — lets it
fall asleep, shows "sleeping" (never down), and follows it when a new request wakes it.

Every wait is on a condition with a generous, bounded timeout; the durations in the docstrings
are what these take on a 2-core host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.cli import WatchToFile, wait_for
from tests.support.llama import (
    LlamaServer,
    decode_rate,
    generate,
    generate_in_background,
    monitor_for,
    tokens_lasting,
)
from trayapp.config.settings import Settings
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import Snapshot

pytestmark = pytest.mark.llamacpp

POLL_S = 0.5  # how often the tests themselves ask the server
SLEEP_LIMIT_S = 40.0  # generous: the idle timers below are 3-6 s
WAKE_LIMIT_S = 60.0
ENTER_SLEEP_LOG = "entering sleeping state"
RAM_GBPS = "54"  # given, so that no RAM benchmark competes with the server for the 2 cores

T = TypeVar("T")


def _is_sleeping(client: httpx.Client, server: LlamaServer) -> bool:
    """What the server itself says (`/props` neither wakes it nor resets its idle timer: proven below)."""
    return bool(client.get(server.url + "/props").json()["is_sleeping"])


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30.0) as http:
        yield http


def _sleepy_server(tmp_path: Path, idle_s: int, *, metrics: bool = True) -> LlamaServer:
    return LlamaServer(metrics=metrics, extra_args=["--sleep-idle-seconds", str(idle_s)], log_dir=tmp_path)


# --------------------------------------------------------------------------- the server's own behaviour


def test_props_health_and_metrics_neither_keep_the_server_awake_nor_wake_it(
    llama_binary: Path, model_path: Path, tmp_path: Path, client: httpx.Client
) -> None:
    """About 10 s: polled every 0.5 s it falls asleep after ~3 s idle and stays asleep for 3 s more."""
    with _sleepy_server(tmp_path, 3) as server:

        def poll_all() -> bool:
            assert client.get(server.url + "/health").json() == {"status": "ok"}
            assert client.get(server.url + "/metrics").status_code == 200
            return _is_sleeping(client, server)

        wait_for(
            poll_all, SLEEP_LIMIT_S, "/props to say is_sleeping while /props, /health, /metrics are polled"
        )
        wait_for(lambda: ENTER_SLEEP_LOG in server.log_tail(), 10.0, f"the log to say {ENTER_SLEEP_LOG!r}")
        log_asleep = server.log_tail()
        for _ in range(6):  # 3 s more of the same polling: still asleep, nothing logged about waking
            assert poll_all(), "polling /props, /health or /metrics woke the server"
            time.sleep(POLL_S)
        assert "exiting sleeping state" not in server.log_tail()[len(log_asleep) - 200 :]


def test_slots_polling_keeps_the_server_awake(
    llama_binary: Path, model_path: Path, tmp_path: Path, client: httpx.Client
) -> None:
    """About 14 s: /slots every 0.5 s for 9 s (3× the idle time) keeps it awake; without it, it sleeps."""
    idle_s = 3
    with _sleepy_server(tmp_path, idle_s) as server:
        deadline = time.monotonic() + 3 * idle_s
        while time.monotonic() < deadline:  # bounded by the deadline
            assert client.get(server.url + "/slots").status_code == 200
            assert not _is_sleeping(client, server), "asleep although /slots was polled every 0.5 s"
            time.sleep(POLL_S)
        assert ENTER_SLEEP_LOG not in server.log_tail()
        # The control: the same server falls asleep once /slots is no longer asked.
        wait_for(lambda: _is_sleeping(client, server), SLEEP_LIMIT_S, "sleep once /slots polling stopped")


# --------------------------------------------------------------------------- `llm-tray watch --json`


def _model(line: dict[str, Any]) -> dict[str, Any]:
    models: list[dict[str, Any]] = line["servers"][0]["models"]
    assert len(models) == 1, models
    return models[0]


def _woken_and_followed(line: dict[str, Any], since_wall_s: float, rate_before: float | None) -> bool:
    """A line after `since_wall_s` that shows the woken model working, or idle with a new last rate."""
    if line["t"] < since_wall_s or not line["servers"] or not line["servers"][0]["models"]:
        return False
    model = _model(line)
    fresh_rate = model["last_decode_tok_s"] is not None and model["last_decode_tok_s"] != rate_before
    return model["phase"] in ("prefill", "decoding") or (model["phase"] == "idle" and fresh_rate)


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics", "no-metrics"])
def test_watch_lets_the_server_sleep_shows_it_and_follows_the_wake(
    llama_binary: Path, model_path: Path, tmp_path: Path, client: httpx.Client, metrics: bool
) -> None:
    """About 25 s each: a request, asleep ~5 s later although watched every second, a wake request.

    Without `--metrics` the server process's CPU use is the only sign of work the probe has.
    """
    with _sleepy_server(tmp_path, 5, metrics=metrics) as server:
        # Long enough (~5 s at the server's own speed now) for polls once a second to see it decode:
        # 120 tokens lasted ~1.5 s on a fast host, and without --metrics no poll saw them.
        tokens = tokens_lasting(decode_rate(server.url), 5.0)
        watch = WatchToFile(
            tmp_path, "--endpoint", server.url, "--no-discover", "--ram-bandwidth-gbps", RAM_GBPS,
            "--interval", "1", "--duration", "300",
        )  # fmt: skip
        try:
            watch.wait_line(lambda line: bool(line["servers"]), 60.0, "watch's first line")
            first = generate(server.url, "Tell me about the sea.", tokens, ignore_eos=True)
            assert first["timings"]["predicted_n"] == tokens
            watch.wait_line(
                lambda line: bool(_model(line)["last_decode_tok_s"]), 30.0, "watch to see the request"
            )

            wait_for(lambda: _is_sleeping(client, server), SLEEP_LIMIT_S, "the watched server to sleep")
            asleep = watch.wait_line(
                lambda line: _model(line)["phase"] == "sleeping", 20.0, "watch to show phase 'sleeping'"
            )
            assert asleep["servers"][0]["status"] == "ok", asleep["servers"][0]
            rate_before = _model(asleep)["last_decode_tok_s"]
            assert rate_before, "the last request's rate is kept while asleep"
            assert _model(asleep)["decode_tok_s"] is None and _model(asleep)["live_rate_reason"]
            lines_asleep = len(watch.lines())

            woken_at = time.time()
            # as long as the first (without --metrics a poll must see it decode: 64 tokens went unseen
            # beside a busy neighbour, cc48)
            second: Future[dict[str, Any]] = generate_in_background(
                server.url, "Tell me about lighthouses.", tokens, ignore_eos=True
            )
            woken = watch.wait_line(
                lambda line: _woken_and_followed(line, woken_at, rate_before),
                WAKE_LIMIT_S,
                "watch to follow the wake (decoding, or idle with a new last rate)",
            )
            assert second.result(timeout=WAKE_LIMIT_S)["timings"]["predicted_n"] == tokens
            assert _model(woken)["phase"] != "sleeping"
        finally:
            watch.stop()
        assert watch.process.returncode == 0, watch.err_path.read_text()[-2000:]

    lines = watch.lines()
    assert len(lines) > lines_asleep
    statuses = {line["servers"][0]["status"] for line in lines}
    assert statuses <= {"ok", "loading"}, f"the sleeping/waking server was shown as {statuses}"
    sleeping_statuses = {
        line["servers"][0]["status"] for line in lines if _model(line)["phase"] == "sleeping"
    }
    assert sleeping_statuses == {"ok"}
    kinds = {alert["kind"] for line in lines for alert in line["alerts"]}
    assert "server_down" not in kinds


# --------------------------------------------------------------------------- the tray's Monitor, in-process


def _phase(snapshot: Snapshot) -> str | None:
    models = snapshot.models()
    return models[0][1].phase if models else None


def test_the_trays_monitor_lets_the_server_sleep_and_follows_the_wake(
    llama_binary: Path, model_path: Path, tmp_path: Path, client: httpx.Client
) -> None:
    """About 25 s: the tray's default settings (polls every 5 s idle, 1 s busy) against a 6 s idle timer
    (shorter than one poll apart from the next, so /slots on each idle poll would keep it awake)."""
    settings = Settings()
    assert settings.monitor.poll_idle_s < 6
    with _sleepy_server(tmp_path, 6) as server:
        monitor = monitor_for(
            server.url, record=True, settings=settings, profile=HardwareProfile(ram_bandwidth_gbps=54.0)
        )
        snapshots: list[Snapshot] = []

        def tick_until(condition: Callable[[Snapshot], bool], limit_s: float, what: str) -> Snapshot:
            """Tick at the tray's own cadence (`next_interval_s`) until `condition` holds (bounded)."""
            deadline = time.monotonic() + limit_s
            while True:
                snapshots.append(monitor.tick())
                if condition(snapshots[-1]):
                    return snapshots[-1]
                if time.monotonic() >= deadline:
                    pytest.fail(f"timed out after {limit_s:g} s waiting for {what}; last {snapshots[-1]}")
                time.sleep(monitor.next_interval_s())

        try:
            assert monitor.tick().servers[0].status == "ok"
            first = generate_in_background(server.url, "Tell me about the sea.", 64, ignore_eos=True)
            tick_until(lambda s: first.done(), WAKE_LIMIT_S, "the first request to finish")
            tick_until(lambda s: _phase(s) == "sleeping", SLEEP_LIMIT_S, "the monitor to show 'sleeping'")
            assert _is_sleeping(client, server)
            assert snapshots[-1].servers[0].status == "ok"
            rate_before = snapshots[-1].models()[0][1].last_decode_tok_s
            assert rate_before, "the last request's rate is kept while asleep"

            future = generate_in_background(server.url, "Tell me about lighthouses.", 64, ignore_eos=True)

            def followed(snapshot: Snapshot) -> bool:
                model = snapshot.models()[0][1]
                fresh = model.last_decode_tok_s is not None and model.last_decode_tok_s != rate_before
                return model.phase in ("prefill", "decoding") or (model.phase == "idle" and fresh)

            tick_until(followed, WAKE_LIMIT_S, "the monitor to follow the wake")
            future.result(timeout=WAKE_LIMIT_S)
        finally:
            monitor.close()
    assert {s.servers[0].status for s in snapshots} <= {"ok", "loading"}
    assert not [a for s in snapshots for a in s.alerts if a.kind == "server_down"]
