"""One sampler per machine (#24 item 1): a real `llm-tray agent` started and stopped beside a
running tray never takes the sampler file over, so `llm-tray bar` and `status` follow the tray
before, during and after it; started first, the agent is the sampler, and the tray takes over once
it stops.

The tray's sampler runs in this process as the tray runs it: a real `Monitor` ticking on a thread
and publishing to a `SnapshotServer` that announces itself (no Qt needed). The tray watches one
fake Ollama (`llama3.1:8b`), the agent another (`qwen3:30b`), so every output says whose data it is.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.agent import Agent
from tests.support.cli import run_cli
from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.tray_sampler import TraySampler
from trayapp.sinks.snapshot_server import SnapshotServer

WAIT_S = 30.0  # a busy 2-core host: an agent's start, a claim, a CLI run
TICK_S = 0.3
TRAY_LINE = "llama3.1:8b idle"  # the tray's fake: `bar` printing this follows the tray
RECLAIM_S = 0.5  # the tray's re-claim, short for the test (5 s by default)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One LLM_TRAY_HOME for the tray here and the agent (Agent uses `tmp_path / "home"`)."""
    path = tmp_path / "home"
    monkeypatch.setenv("LLM_TRAY_HOME", str(path))
    return path


@pytest.fixture
def tray_fake() -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.load("llama3.1:8b")
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def agent_fake() -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.load("qwen3:30b")
    try:
        yield fake
    finally:
        fake.close()


def _sampler_pid(home: Path) -> int | None:
    try:
        return int(json.loads((home / "data" / "sampler.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _agent_endpoint(agent: Agent) -> str:
    """The agent's own snapshot URL (from its stderr), once it serves a snapshot."""

    def serving() -> str | None:
        assert agent.process.poll() is None, agent.err_path.read_text()
        found = re.search(r"snapshots on (http://\S+)/v1/snapshot", agent.err_path.read_text())
        if found is None:
            return None
        try:
            ok = httpx.get(found.group(1) + "/v1/glance", timeout=2).status_code == 200
        except httpx.HTTPError:
            return None
        return found.group(1) if ok else None

    return str(wait_until(serving, WAIT_S, 0.05))


def _bar(env: dict[str, str]) -> str:
    result = run_cli("bar", env=env, timeout_s=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.rstrip("\n")


def _assert_status_follows_tray(env: dict[str, str], tray_fake: FakeOllama) -> None:
    status = run_cli("status", "--json", env=env, timeout_s=60)
    assert status.returncode == 0, status.stderr
    assert f"answering from the running sampler (pid {os.getpid()}," in status.stderr
    assert [server["url"] for server in json.loads(status.stdout)["servers"]] == [tray_fake.url]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_agent_started_and_stopped_beside_the_tray_leaves_bar_on_the_tray(
    home: Path, tmp_path: Path, tray_fake: FakeOllama, agent_fake: FakeOllama, stop_signal: signal.Signals
) -> None:
    tray = TraySampler(tray_fake.url, tick_s=TICK_S, reclaim_s=RECLAIM_S).start()
    agent: Agent | None = None
    try:
        assert _sampler_pid(home) == os.getpid()
        env = {k: v for k, v in os.environ.items() if k != "LLM_TRAY_TOKEN"}
        bar = {"before": _bar(env)}

        agent = Agent(tmp_path, agent_fake.url)
        own = _agent_endpoint(agent)  # the agent samples and serves its own endpoint all the same
        assert httpx.get(own + "/v1/glance", timeout=2).json()["model"]["name"] == "qwen3:30b"
        bar["during"] = _bar(env)
        owner_during = _sampler_pid(home)

        agent.process.send_signal(stop_signal)
        assert agent.process.wait(timeout=WAIT_S) == 0, agent.err_path.read_text()
        bar["after"] = _bar(env)
        assert bar == dict.fromkeys(("before", "during", "after"), TRAY_LINE)
        assert owner_during == os.getpid() == _sampler_pid(home)  # the tray's entry, untouched
        _assert_status_follows_tray(env, tray_fake)
        said = agent.err_path.read_text()
        assert (
            f"llm-tray agent: the tray (pid {os.getpid()}, {tray.server.url}) is this machine's sampler: "
            "status, watch and bar follow it"
        ) in said, said
    finally:
        if agent is not None:
            agent.stop()
        tray.stop()
    assert not (home / "data" / "sampler.json").exists()  # the tray's own entry goes with it


def test_a_tray_started_beside_an_agent_takes_over_when_the_agent_stops(
    home: Path, tmp_path: Path, tray_fake: FakeOllama, agent_fake: FakeOllama
) -> None:
    agent = Agent(tmp_path, agent_fake.url)
    tray: TraySampler | None = None
    try:
        info = agent.wait_ready()  # the agent first: it is this machine's sampler
        assert info["pid"] == agent.process.pid and info["role"] == "agent"
        tray = TraySampler(tray_fake.url, tick_s=TICK_S, reclaim_s=RECLAIM_S).start()
        assert tray.server.machine_sampler is not None
        assert tray.server.machine_sampler.pid == agent.process.pid and not tray.server.is_machine_sampler
        assert _sampler_pid(home) == agent.process.pid
        while_agent = _bar(agent.env)  # the agent's data while it is the sampler
        assert while_agent != TRAY_LINE and "not running" not in while_agent
        assert agent.stop() == 0
        wait_until(lambda: _sampler_pid(home) == os.getpid(), WAIT_S, 0.05)  # the tray's re-claim
        assert tray.server.is_machine_sampler
        assert _bar(agent.env) == TRAY_LINE
    finally:
        agent.stop()
        if tray is not None:
            tray.stop()


def test_the_claim_judges_real_endpoints(home: Path) -> None:
    """In process: a second announced endpoint finds the first live and leaves its entry; once the
    first is stopped, an entry naming its closed port is stale and the next claim replaces it."""
    path = home / "data" / "sampler.json"
    tray = SnapshotServer().start(announce=True)
    agent = SnapshotServer(role="agent").start(announce=True)
    try:
        assert tray.is_machine_sampler and not agent.is_machine_sampler
        assert agent.machine_sampler == tray.machine_sampler
        tray_entry = path.read_text()
        agent.stop(2.0)
        assert path.read_text() == tray_entry  # the agent removed nothing it did not own
        old_url = tray.url
    finally:
        agent.stop(2.0)
        tray.stop(2.0)
    assert not path.exists()
    path.write_text(json.dumps({"url": old_url, "pid": os.getppid(), "started": ""}))  # running, no answer
    late = SnapshotServer(role="agent").start(announce=True)
    try:
        assert late.is_machine_sampler and json.loads(path.read_text())["url"] == late.url
    finally:
        late.stop(2.0)
    assert not path.exists()
