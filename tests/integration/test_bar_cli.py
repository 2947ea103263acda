"""`llm-tray bar` as a bar runs it (#15): from a real agent's (or the tray app's) endpoint, every
format checked by its bar's own rules (the grammars of tests/support/bar_formats.py); `--follow` prints
a line when the glance changes and none while it does not; no sampler: a short line, exit 0."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import contextlib
import itertools
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.support.agent import Agent
from tests.support.bar_formats import check_polybar, check_swiftbar, check_tmux, check_waybar
from tests.support.cli import run_cli
from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.llama import LlamaServer, decode_rate, generate_in_background, tokens_lasting
from trayapp.app import tray_app as app_module
from trayapp.app.tray_main import default_monitor_factory
from trayapp.config.settings import EndpointConfig, HardwareConfig, MonitorConfig, Settings
from trayapp.ui.qtcompat import apply_workarounds

apply_workarounds()

WAIT_S = 20.0
IDLE = "llama3.1:8b idle"  # Ollama's /api/ps lists it; no request seen: the tray's "idle"


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.load("llama3.1:8b")
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def agent(tmp_path: Path, ollama: FakeOllama) -> Iterator[Agent]:
    running = Agent(tmp_path, ollama.url)
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


class Follow:
    """`bar --follow` with its output in a file (never an unread pipe)."""

    def __init__(self, env: dict[str, str], root: Path, *args: str) -> None:
        self.path = root / "follow.out"
        self._out = self.path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trayapp", "bar", "--follow", *args],
            env=env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8").splitlines()

    def wait_lines(self, count: int) -> list[str]:
        def enough() -> list[str] | None:
            assert self.process.poll() is None, self.path.read_text()
            lines = self.lines()
            return lines if len(lines) >= count else None

        return wait_until(enough, WAIT_S, 0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._out.close()


def test_every_format_from_a_running_agent(agent: Agent) -> None:
    waybar = agent.cli("bar", "--format", "waybar")
    assert waybar.returncode == 0 and waybar.stderr == ""
    data = check_waybar(waybar.stdout.rstrip("\n"))
    assert data["text"] == IDLE and data["class"] == "idle" and data["percentage"] == 0
    assert data["tooltip"].startswith("llama3.1:8b Q4_K_M · Ollama")  # the tray's tooltip
    assert agent.cli("bar").stdout == IDLE + "\n"
    assert check_tmux(agent.cli("bar", "--format", "tmux").stdout.rstrip("\n")) == IDLE
    for fmt in ("polybar", "lemonbar"):
        assert check_polybar(agent.cli("bar", "--format", fmt).stdout.rstrip("\n")) == IDLE
    assert agent.cli("bar", "--format", "i3blocks").stdout.endswith(f">{IDLE}</span>\n")
    assert agent.cli("bar", "--max-width", "8").stdout == "idle\n"  # the model name goes first
    for fmt in ("swiftbar", "xbar"):
        items = check_swiftbar(agent.cli("bar", "--format", fmt).stdout.rstrip("\n"))
        assert items[0][0] == IDLE and items[-1][0] == "Open dashboard"
        assert any(title.startswith("llama3.1:8b · idle · Ollama 127.0.0.1:") for title, _ in items)


def test_follow_prints_a_line_per_change_and_none_while_nothing_changes(
    agent: Agent, ollama: FakeOllama, tmp_path: Path
) -> None:
    follow = Follow(agent.env, tmp_path, "--format", "plain")
    try:
        assert follow.wait_lines(1) == [IDLE]
        time.sleep(1.5)  # five ticks of the agent (0.3 s) with nothing changing
        assert follow.lines() == [IDLE]
        ollama.load("qwen3:30b")  # 52 % on the CPU in the fixture: an offload alert at once
        second = follow.wait_lines(2)[1]
        assert second == "idle ⚠ part of a model spilled to syste…"  # 4 + 35 + 1 = 40 characters
    finally:
        follow.stop()


def test_follow_survives_the_sampler_going_away(agent: Agent, tmp_path: Path) -> None:
    follow = Follow(agent.env, tmp_path, "--format", "waybar")
    try:
        assert check_waybar(follow.wait_lines(1)[0])["text"] == IDLE
        assert agent.stop() == 0
        gone = check_waybar(follow.wait_lines(2)[1])
        assert gone["text"] == "llm-tray not running" and gone["class"] == "not-running"
        assert follow.process.poll() is None  # still there for when a sampler starts again
    finally:
        follow.stop()


@pytest.mark.parametrize(
    "fmt", ["waybar", "polybar", "i3blocks", "lemonbar", "tmux", "swiftbar", "xbar", "plain"]
)
def test_no_sampler_is_a_short_line_and_exit_0(fmt: str, tmp_path: Path) -> None:
    env = {**os.environ, "LLM_TRAY_HOME": str(tmp_path / "empty-home")}
    result = run_cli("bar", "--format", fmt, env=env, timeout_s=60)
    assert result.returncode == 0 and result.stderr == ""
    out = result.stdout.rstrip("\n")
    checks = {"waybar": lambda t: check_waybar(t)["text"], "tmux": check_tmux, "polybar": check_polybar,
              "lemonbar": check_polybar, "swiftbar": lambda t: check_swiftbar(t)[0][0],
              "xbar": lambda t: check_swiftbar(t)[0][0]}  # fmt: skip
    visible = checks.get(fmt, lambda t: t)(out)
    assert "llm-tray not running" in visible


def test_follow_without_a_sampler_keeps_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "LLM_TRAY_HOME": str(tmp_path / "empty-home")}
    result = run_cli("bar", "--follow", "--duration", "1.5", env=env, timeout_s=60)
    assert (result.returncode, result.stdout) == (0, "llm-tray not running\n")


def test_the_tray_app_publishes_for_bar_and_status(
    qtbot: QtBot, qapp: QApplication, ollama: FakeOllama
) -> None:
    settings = Settings(
        endpoints=(EndpointConfig(url=ollama.url, kind="ollama"),),
        monitor=MonitorConfig(discover=False, poll_active_s=0.2, poll_idle_s=0.3),
        hardware=HardwareConfig(ram_bandwidth_gbps=50.0),  # no RAM benchmark in the test
    )
    factory = default_monitor_factory(settings, (), False, None)
    tray = app_module.TrayApp(qapp, settings, factory)
    sampler = Path(os.environ["LLM_TRAY_HOME"]) / "data" / "sampler.json"
    try:
        tray.start()
        qtbot.waitUntil(lambda: sampler.exists() and tray.last_snapshot is not None, timeout=WAIT_S * 1000)
        assert json.loads(sampler.read_text())["pid"] == os.getpid()
        result = run_cli("bar", "--format", "waybar", timeout_s=60)  # the GUI loop is not needed
        assert check_waybar(result.stdout.rstrip("\n"))["text"] == IDLE
        status = run_cli("status", "--json", timeout_s=60)
        assert "answering from the running sampler" in status.stderr
        assert json.loads(status.stdout)["servers"][0]["url"] == ollama.url
    finally:
        tray.shutdown()
        with contextlib.suppress(RuntimeError, TypeError):
            qapp.aboutToQuit.disconnect(tray.shutdown)
    assert not sampler.exists()


@pytest.mark.llamacpp
def test_waybar_follows_the_real_servers_live_rate(llama_server: LlamaServer, tmp_path: Path) -> None:
    """idle → decoding (the live rate in the text) → idle, one line per change, from a real llama-server."""
    tokens = tokens_lasting(decode_rate(llama_server.url), 8.0)  # several live lines on any host; a warm-up
    agent = Agent(tmp_path, llama_server.url, kind="llamacpp", poll_s=0.3, gpu=None)
    follow: Follow | None = None
    try:
        agent.wait_ready()
        follow = Follow(agent.env, tmp_path, "--format", "waybar", "--max-width", "0")
        first = check_waybar(follow.wait_lines(1)[0])
        assert first["class"] == "idle" and first["text"].endswith(" idle"), first
        reply = generate_in_background(llama_server.url, "Tell me about the sea.", tokens, ignore_eos=True)
        lines_of = follow.lines

        def seen(pattern: str, after: int = 0) -> int | None:
            for i, line in enumerate(lines_of()[after:], after):
                if re.search(pattern, check_waybar(line)["text"]):
                    return i
            return None

        live = wait_until(lambda: seen(r" ~?\d+(\.\d)? tok/s"), WAIT_S * 3, 0.05)
        data = check_waybar(lines_of()[live])
        assert data["class"] in ("ok", "degraded", "alert") and data["tooltip"]
        server_rate = reply.result(timeout=180)["timings"]["predicted_per_second"]
        idle = wait_until(lambda: seen(r" idle( ⚠|$)", live), WAIT_S, 0.05)  # back to idle after the request
        lines = lines_of()
        assert all(a != b for a, b in itertools.pairwise(lines))  # a line only on a change
        # Each line's rate is a polled window of ~1 s (marked ~): on a busy host one window may run at
        # half the request's speed or double it. Their median follows the server's own mean rate.
        texts = [check_waybar(line)["text"] for line in lines[live:idle]]
        shown = [re.search(r" ~?(\d+(?:\.\d)?) tok/s", text) for text in texts]
        rates = [float(m.group(1)) for m in shown if m is not None]
        assert rates, lines[live:idle]
        assert 0.5 * server_rate <= statistics.median(rates) <= 1.5 * server_rate, (rates, server_rate)
    finally:
        if follow is not None:
            follow.stop()
        agent.stop()
