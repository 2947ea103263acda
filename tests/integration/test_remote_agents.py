"""Remote machines (#15): real `llm-tray agent` processes, each with its own LLM_TRAY_HOME and a token
made by `llm-tray agent --new-token`, on loopback ports; one tray-side `Monitor` (the real one)
configured with both as `[[agents]]`. One box watches a real llama-server, the other a fake Ollama
(shaped like tests/fixtures/ollama) whose model spilled to the CPU, so its agent raises `offload`.
Child output goes to files, never an unread pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.agent import Agent
from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.llama import LlamaServer, decode_rate, generate_in_background, tokens_lasting
from tests.support.memory_keyring import MemoryKeyring
from trayapp.config.agents import AgentConfig
from trayapp.config.settings import EndpointConfig, MonitorConfig, Settings
from trayapp.core.model import RemoteMachine, ServerStatus, Snapshot
from trayapp.services.monitor import Monitor
from trayapp.sources import remote_agent
from trayapp.sources.remote_agent import store_agent_token

WAIT_S = 30.0


class Box(Agent):
    """A remote machine: `llm-tray agent --new-token`, then `llm-tray agent` watching `upstream`."""

    def __init__(self, root: Path, upstream: str, kind: str, gpu: str | None = "RTX 4090") -> None:
        config = "[thresholds]\nconfirm_s = 0\n"
        super().__init__(root, upstream, kind=kind, config=config, gpu=gpu, new_token=True)
        self.url = str(self.wait_ready(WAIT_S)["url"])

    def own_doc(self) -> dict[str, Any]:
        """The agent's document, read directly (the reference for what the tray shows)."""
        doc: dict[str, Any] = httpx.get(self.url + "/v1/snapshot", headers=self.headers, timeout=5).json()
        return doc


@pytest.fixture
def spilled_ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.load("qwen3:30b")  # the fixture's /api/ps: 10.6 of 22.2 GB in GPU memory (48 %)
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[list[Box]]:
    started: list[Box] = []
    try:
        yield started
    finally:
        for box in started:
            box.stop()


def tray_monitor(agents: list[AgentConfig], local: str | None = None) -> Monitor:
    settings = Settings(
        monitor=MonitorConfig(discover=False, poll_active_s=0.3, poll_idle_s=0.3), agents=tuple(agents)
    )
    extra = [EndpointConfig(url=local, kind="ollama")] if local else []
    return Monitor(settings, extra_endpoints=extra, discover=False, record=False, measure_ram=False)


def tick_until(monitor: Monitor, done: Callable[[Snapshot], bool], timeout_s: float = WAIT_S) -> Snapshot:
    seen: list[Snapshot] = []

    def step() -> Snapshot | None:
        snapshot = monitor.tick(budget_s=2.5)
        seen.append(snapshot)
        return snapshot if done(snapshot) else None

    try:
        return wait_until(step, timeout_s, 0.05)
    except AssertionError:
        last = seen[-1] if seen else None
        raise AssertionError(f"not reached; last machines {last.machines if last else None}") from None


def machine(snapshot: Snapshot, name: str) -> RemoteMachine:
    (found,) = [m for m in snapshot.machines if m.name == name]
    return found


def servers_of(snapshot: Snapshot, name: str | None) -> list[ServerStatus]:
    return [s for s in snapshot.servers if s.machine == name]


def port_of(url: str) -> int:
    return int(url.rpartition(":")[2].rstrip("/"))


# --------------------------------------------------------------------------- the token file


def test_new_token_writes_a_0600_file_and_the_agent_then_requires_it(
    tmp_path: Path, spilled_ollama: FakeOllama, boxes: list[Box]
) -> None:
    box = Box(tmp_path, spilled_ollama.url, "ollama")
    boxes.append(box)
    assert str(box.token_file) in box.new_token_output
    assert oct(box.token_file.stat().st_mode & 0o777) == "0o600" and len(box.token) >= 32
    assert f"token required, from {box.token_file}" in box.err_path.read_text()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": box.token}):
        for path in ("/v1/snapshot", "/v1/glance", "/v1/events", "/v1/snapshot?format=text"):
            refused = httpx.get(box.url + path, headers=headers, timeout=5)
            assert refused.status_code == 401
            assert refused.json() == {"error": "unauthorized: send Authorization: Bearer <token>"}
    doc = box.own_doc()
    assert [m["name"] for m in doc["servers"][0]["models"]] == ["qwen3:30b"]


def test_an_agent_off_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLM_TRAY_TOKEN"}
    env["LLM_TRAY_HOME"] = str(tmp_path / "home")
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "agent", "--no-discover", "--metrics-port", "0",
         "--ram-bandwidth-gbps", "50", "--snapshot-address", "0.0.0.0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "is not loopback: set LLM_TRAY_TOKEN to a token first (or run llm-tray agent --new-token)" in (
        result.stderr
    )


# --------------------------------------------------------------------------- two machines, one tray


@pytest.mark.llamacpp
def test_two_machines_in_one_tray(
    llama_server: LlamaServer,
    spilled_ollama: FakeOllama,
    tmp_path: Path,
    boxes: list[Box],
    memory_keyring: MemoryKeyring,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box_a = Box(tmp_path / "a", llama_server.url, "llamacpp", gpu=None)  # this machine's own hardware
    boxes.append(box_a)
    box_b = Box(tmp_path / "b", spilled_ollama.url, "ollama")
    boxes.append(box_b)
    monkeypatch.setenv("BOX_A_TOKEN", box_a.token)  # one token from an environment variable,
    store_agent_token(box_b.url, box_b.token)  # the other from the OS keyring
    tokens = tokens_lasting(decode_rate(llama_server.url), 10.0)  # seen through two pollers
    local = FakeOllama()
    local.load("llama3.1:8b")
    monitor = tray_monitor(
        [AgentConfig(box_a.url, "box-a", token_env="BOX_A_TOKEN"), AgentConfig(box_b.url, "box-b")], local.url
    )
    try:
        reply = generate_in_background(
            llama_server.url, "Count slowly from one to a thousand:", tokens, ignore_eos=True
        )

        def decoding_on_a(snapshot: Snapshot) -> bool:
            models = [m for s in servers_of(snapshot, "box-a") for m in s.models]
            return any(m.phase == "decoding" and (m.decode_tok_s or 0) > 0 for m in models)

        live = tick_until(monitor, decoding_on_a)
        reply.result(timeout=120)
        snapshot = tick_until(monitor, lambda s: any(a.machine == "box-b" for a in s.alerts))
    finally:
        monitor.close()
        local.close()

    # The machines, in config order, both answering.
    assert [(m.name, m.url, m.status, m.reason) for m in snapshot.machines] == [
        ("box-a", box_a.url, "ok", None),
        ("box-b", box_b.url, "ok", None),
    ]
    # This machine's server first, then each machine's, marked with its name; a server on the box's
    # loopback is shown at the machine's name.
    assert [(s.machine, s.kind) for s in snapshot.servers] == [
        (None, "ollama"),
        ("box-a", "llamacpp"),
        ("box-b", "ollama"),
    ]
    local_server, server_a, server_b = snapshot.servers
    assert local_server.url == local.url and [m.name for m in local_server.models] == ["llama3.1:8b"]
    assert server_a.url == f"http://box-a:{port_of(llama_server.url)}"
    assert server_b.url == f"http://box-b:{port_of(spilled_ollama.url)}"
    assert [m.name for m in server_a.models] == [m["name"] for m in box_a.own_doc()["servers"][0]["models"]]
    assert [m.name for m in server_b.models] == ["qwen3:30b"]

    # Live rates, as box-a's agent measured them.
    (rate,) = [m for s in servers_of(live, "box-a") for m in s.models]
    assert rate.phase == "decoding" and rate.decode_tok_s is not None and rate.decode_tok_s > 0
    assert rate.context_length == 8192  # the server's -c 8192, one slot

    # Placement and the alert come from box-b's agent (its --gpu RTX 4090), not recomputed here.
    (qwen,) = server_b.models
    assert qwen.gpu_fraction == pytest.approx(10649920512 / 22187335680, abs=0.001)  # /api/ps sizes
    (offload,) = [a for a in snapshot.alerts if a.machine == "box-b"]
    (theirs,) = box_b.own_doc()["alerts"]
    assert offload.id == f"box-b/{theirs['id']}" and offload.kind == theirs["kind"] == "offload"
    theirs_fix = (theirs["fix"]["text"], tuple(theirs["fix"]["commands"]))
    assert (offload.message, offload.severity) == (theirs["message"], "critical")
    assert (offload.fix, offload.fix_commands) == theirs_fix  # the text and the commands to copy (#20)
    assert offload.server == server_b.url and offload.model == "qwen3:30b"
    assert not [a for a in snapshot.alerts if a.machine is None]  # nothing raised here for a remote box

    # Each machine's hardware, as its agent read it (both run here: the same RAM as psutil says).
    for name, box in (("box-a", box_a), ("box-b", box_b)):
        hardware = machine(snapshot, name).hardware
        assert hardware is not None
        assert hardware.host.ram_total_bytes == psutil.virtual_memory().total
        theirs_hw = box.own_doc()["hardware"]
        assert [g.name for g in hardware.gpus] == [g["name"] for g in theirs_hw["gpus"]]
        assert [g.vram_total_bytes for g in hardware.gpus] == [
            g["vram_total_bytes"] for g in theirs_hw["gpus"]
        ]
        assert hardware.gpu_reason == theirs_hw["gpu_reason"]


# --------------------------------------------------------------------------- failures stay on their machine


def test_one_agent_stopping_marks_only_that_machine_unreachable(
    tmp_path: Path, boxes: list[Box], monkeypatch: pytest.MonkeyPatch
) -> None:
    fakes = [FakeOllama(), FakeOllama()]
    try:
        fakes[0].load("llama3.1:8b")
        fakes[1].load("qwen3:30b")
        box_a = Box(tmp_path / "a", fakes[0].url, "ollama")
        boxes.append(box_a)
        box_b = Box(tmp_path / "b", fakes[1].url, "ollama")
        boxes.append(box_b)
        monkeypatch.setenv("TOKEN_A", box_a.token)
        monkeypatch.setenv("TOKEN_B", box_b.token)
        monitor = tray_monitor(
            [AgentConfig(box_a.url, "box-a", "TOKEN_A"), AgentConfig(box_b.url, "box-b", "TOKEN_B")]
        )
        try:
            both = tick_until(monitor, lambda s: [m.status for m in s.machines] == ["ok", "ok"])
            assert [m.name for s in both.servers for m in s.models] == ["llama3.1:8b", "qwen3:30b"]
            assert box_a.stop() == 0
            gone = tick_until(monitor, lambda s: machine(s, "box-a").status == "unreachable")
            a, b = gone.machines
            assert a.reason is not None and "connection refused" in a.reason and a.hardware is None
            assert servers_of(gone, "box-a") == [] and not [x for x in gone.alerts if x.machine == "box-a"]
            assert b.status == "ok" and [m.name for s in servers_of(gone, "box-b") for m in s.models] == [
                "qwen3:30b"
            ]
            # box-b keeps updating: its agent's snapshots keep coming, each newer than the last.
            t_before = b.t_wall_s
            assert t_before is not None
            later = tick_until(monitor, lambda s: (machine(s, "box-b").t_wall_s or 0) > t_before)
            assert machine(later, "box-a").status == "unreachable" and machine(later, "box-b").status == "ok"
        finally:
            monitor.close()
    finally:
        for fake in fakes:
            fake.close()


def test_a_wrong_or_missing_token_is_shown_on_that_machine(
    tmp_path: Path,
    spilled_ollama: FakeOllama,
    boxes: list[Box],
    monkeypatch: pytest.MonkeyPatch,
    memory_keyring: MemoryKeyring,
) -> None:
    box = Box(tmp_path, spilled_ollama.url, "ollama")
    boxes.append(box)
    monkeypatch.setenv("WRONG", "not-" + box.token)
    monkeypatch.setenv("RIGHT", box.token)
    monitor = tray_monitor(
        [
            AgentConfig(box.url, "wrong", token_env="WRONG"),
            AgentConfig(box.url, "missing", token_env="UNSET_TOKEN_VAR"),
            AgentConfig(box.url, "right", token_env="RIGHT"),
        ]
    )
    try:
        snapshot = tick_until(monitor, lambda s: machine(s, "right").status == "ok")
        wrong, missing, right = snapshot.machines
        assert (wrong.status, wrong.reason) == ("unauthorized", "wrong token (401): the agent refused it")
        assert missing.status == "unauthorized"
        assert missing.reason == (
            "the agent wants a token (401): $UNSET_TOKEN_VAR is not set; "
            "none is stored in the OS keyring (Settings → Remote machines)"
        )
        assert wrong.hardware is None and missing.hardware is None and right.hardware is not None
        assert [s.machine for s in snapshot.servers] == ["right"]  # nothing of the refused ones
        assert [a.machine for a in snapshot.alerts] == ["right"]

        # The token saved in the keyring afterwards (the settings dialog) is picked up after a 401.
        monkeypatch.setattr(remote_agent, "TOKEN_RECHECK_S", 0.0)
        store_agent_token(box.url, box.token)
        later = tick_until(monitor, lambda s: machine(s, "missing").status == "ok")
        assert machine(later, "wrong").status == "unauthorized"  # its variable still wins, still wrong
        assert sorted(str(s.machine) for s in later.servers) == ["missing", "right"]

        # New settings without the refused entry: the machines follow them at the next tick.
        monitor.apply_settings(replace(monitor.settings, agents=(AgentConfig(box.url, "right", "RIGHT"),)))
        assert [m.name for m in monitor.tick(budget_s=2.5).machines] == ["right"]
    finally:
        monitor.close()
