"""Tray icon, tooltip and menu state from snapshots; the menu's actions."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from tests.support.snapshots import LLAMA, OLLAMA, alert, model, server, snap
from trayapp.config.agents import AgentConfig
from trayapp.config.settings import EndpointConfig, Settings
from trayapp.core.diagnostics import diagnostics_text
from trayapp.core.glance import IconState
from trayapp.core.model import Snapshot
from trayapp.core.thresholds import Thresholds
from trayapp.ui.menu_text import server_line, settings_summary
from trayapp.ui.tray import TrayController


class FakeWorker:
    def __init__(self) -> None:
        self.calls: list[bool] = []

    def set_paused(self, paused: bool) -> None:
        self.calls.append(paused)


@pytest.fixture
def worker() -> FakeWorker:
    return FakeWorker()


@pytest.fixture
def tray(qtbot: QtBot, worker: FakeWorker) -> TrayController:
    return TrayController(worker, min_redraw_interval_s=0.0, template=False)


def two_servers(t: float = 1.0, rate: float = 42.0) -> Snapshot:
    qwen = model(
        name="qwen3:30b",
        phase="idle",
        gpu_fraction=0.48,
        quantization=None,
        context_length=32768,
        context_tokens=None,
    )
    return snap(t, server(model(rate=rate)), server(qwen, url=OLLAMA, kind="ollama"))


def test_menu_is_rebuilt_from_the_snapshot(tray: TrayController) -> None:
    assert tray.server_lines() == ["Looking for LLM servers…"]
    tray.update_snapshot(two_servers())
    tray.menu.aboutToShow.emit()  # what opening the menu does
    assert tray.server_lines() == [
        "● llama-server 127.0.0.1:8080 — decoding ~42 tok/s",  # ~: polled
        "   llama3.1:8b Q4_K_M  ·  6.1k/8k ctx",
        "○ Ollama 127.0.0.1:11434 — idle",
        "   qwen3:30b  ·  —/32k ctx  ·  52 % CPU ⚠",
    ]
    texts = [a.text() for a in tray.menu.actions() if not a.isSeparator()]
    assert texts[4:] == [
        "Open dashboard",
        "Pause monitoring",
        "Benchmark llama3.1:8b…",  # the model the icon speaks for (decoding)
        "Export session log…",
        "Copy diagnostics",
        "Settings…",
        "Start at login",
        "Quit",
    ]
    assert tray.bench_action.isEnabled()  # tests/qt/test_tray_bench_action.py has the rest
    tray.update_snapshot(snap(2.0, server(model(phase="idle"))))
    tray.menu.aboutToShow.emit()
    assert tray.server_lines()[0] == "○ llama-server 127.0.0.1:8080 — idle"


def test_no_server_menu_says_what_was_probed(tray: TrayController) -> None:
    tray.update_snapshot(snap(1.0, server(url=LLAMA, status="unreachable")))
    tray.rebuild_menu()
    assert tray.server_lines() == ["No LLM server found", "   probed 127.0.0.1:8080"]
    assert tray.shown_state is not None and tray.shown_state.health == "none"
    assert tray.tray.toolTip().startswith("No LLM server found\nprobed: 127.0.0.1:8080")


def test_tooltip_and_icon_follow_snapshots(qtbot: QtBot, tray: TrayController) -> None:
    with qtbot.waitSignal(tray.icon_changed) as blocker:
        tray.update_snapshot(two_servers())
    state: IconState = blocker.args[0]
    assert (state.health, state.text, state.ring) == ("ok", "42", 0.7)
    assert tray.tray.toolTip() == (
        "llama3.1:8b Q4_K_M · llama-server\n~42 tok/s · 68 % of 62 tok/s ceiling\n"  # ~: polled
        "context 6.1k / 8k · 100 % GPU"
    )
    assert not tray.tray.icon().isNull()
    draws = tray.icon_draws
    with qtbot.assertNotEmitted(tray.icon_changed):
        tray.update_snapshot(two_servers(2.0, rate=42.4))  # same picture: no redraw
    assert tray.icon_draws == draws
    with qtbot.waitSignal(tray.icon_changed) as blocker:
        tray.update_snapshot(snap(3.0, server(model(rate=42.0)), alerts=(alert(),)))
    assert blocker.args[0].health == "alert"
    assert "⚠ qwen3:30b spilled to the CPU (52 %)" in tray.tray.toolTip()


def test_icon_redraws_at_most_twice_a_second(qtbot: QtBot, worker: FakeWorker) -> None:
    tray = TrayController(worker, min_redraw_interval_s=0.5, template=False)
    tray.update_snapshot(snap(1.0, server(model(rate=20.0))))
    drawn = tray.icon_draws
    tray.update_snapshot(snap(2.0, server(model(rate=30.0))))
    tray.update_snapshot(snap(3.0, server(model(rate=40.0))))
    assert tray.icon_draws == drawn  # held back
    with qtbot.waitSignal(tray.icon_changed, timeout=2000) as blocker:
        pass
    assert blocker.args[0].text == "40"  # only the latest is drawn
    assert tray.icon_draws == drawn + 1


def test_pause_toggles_the_worker_and_shows_paused(
    qtbot: QtBot, tray: TrayController, worker: FakeWorker
) -> None:
    tray.update_snapshot(two_servers())
    tray.rebuild_menu()
    with qtbot.waitSignal(tray.pause_changed) as blocker:
        tray.pause_action.trigger()
    assert blocker.args == [True]
    assert worker.calls == [True]
    assert tray.shown_state is not None and tray.shown_state.paused
    assert "monitoring paused" in tray.tray.toolTip()
    tray.update_snapshot(two_servers(5.0))  # a late snapshot does not unpause the icon
    assert tray.shown_state.paused
    tray.rebuild_menu()
    assert tray.pause_action.isChecked()
    tray.pause_action.trigger()
    assert worker.calls == [True, False]
    assert tray.shown_state is not None and not tray.shown_state.paused and tray.shown_state.text == "42"


def test_click_opens_the_dashboard(qtbot: QtBot, tray: TrayController) -> None:
    from PySide6.QtWidgets import QSystemTrayIcon

    with qtbot.waitSignal(tray.open_dashboard):
        tray.tray.activated.emit(QSystemTrayIcon.ActivationReason.Trigger)
    with qtbot.waitSignal(tray.open_dashboard):
        tray.dashboard_action.trigger()
    with qtbot.assertNotEmitted(tray.open_dashboard):
        tray.tray.activated.emit(QSystemTrayIcon.ActivationReason.Context)


def test_copy_diagnostics_is_redacted(qtbot: QtBot, worker: FakeWorker) -> None:
    settings = Settings(
        endpoints=(EndpointConfig(url="http://bob:pw@127.0.0.1:8080/?token=abc", api_key_env="K"),),
        agents=(AgentConfig(url="http://gpu-box:9465", name="gpu-box", token_env="BOX_TOKEN"),),
    )
    summary = settings_summary(settings)
    tray = TrayController(worker, diagnostics=lambda s: diagnostics_text(s, summary), template=False)
    tray.update_snapshot(two_servers())
    tray.rebuild_menu()
    tray.diagnostics_action.trigger()
    text = QGuiApplication.clipboard().text()
    assert "llama3.1:8b" in text and "qwen3:30b" in text
    assert "endpoint http://127.0.0.1:8080/ kind=auto, api key from env K" in text
    assert "agent gpu-box http://gpu-box:9465, token from env BOX_TOKEN" in text
    assert "bob" not in text and "pw@" not in text and "abc" not in text


def test_export_runs_off_the_gui_thread(
    qtbot: QtBot, tmp_path: Path, worker: FakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran_on: list[int] = []

    def export(path: Path) -> str:
        ran_on.append(threading.get_ident())
        path.write_text("t_wall_s,decode_tok_s\n")
        return f"1 row → {path}"

    tray = TrayController(worker, export_callback=export, template=False)
    target = tmp_path / "log.csv"
    monkeypatch.setattr(tray, "ask_export_path", lambda: target)
    with qtbot.waitSignal(tray.export_finished, timeout=5000) as blocker:
        tray.export_action.trigger()
    assert blocker.args == [f"1 row → {target}"]
    assert target.read_text().startswith("t_wall_s")
    assert ran_on and ran_on[0] != threading.get_ident()

    def broken(path: Path) -> str:
        raise OSError("disk full")

    tray = TrayController(worker, export_callback=broken, template=False)
    monkeypatch.setattr(tray, "ask_export_path", lambda: target)
    with qtbot.waitSignal(tray.export_failed, timeout=5000) as blocker:
        tray.export_session_log()
    assert blocker.args == ["OSError: disk full"]
    cancelled = TrayController(worker, export_callback=export, template=False)
    monkeypatch.setattr(cancelled, "ask_export_path", lambda: None)
    with qtbot.assertNotEmitted(cancelled.export_finished, wait=100):
        cancelled.export_session_log()


def test_start_at_login_toggle(qtbot: QtBot, worker: FakeWorker) -> None:
    calls: list[bool] = []
    tray = TrayController(worker, set_autostart=calls.append, autostart_enabled=False, template=False)
    assert not tray.autostart_action.isChecked()
    tray.autostart_action.trigger()
    qtbot.waitUntil(lambda: calls == [True], timeout=2000)
    assert tray.autostart_enabled
    tray.rebuild_menu()
    assert tray.autostart_action.isChecked()

    def refuse(_on: bool) -> None:
        raise PermissionError("read-only home")

    failing = TrayController(worker, set_autostart=refuse, template=False)
    failing.autostart_action.trigger()
    qtbot.waitUntil(lambda: not failing.autostart_enabled, timeout=2000)


@pytest.mark.parametrize(
    ("phase", "line"),
    [
        ("loading", "● llama-server 127.0.0.1:8080 — loading a model"),  # busy for the menu's dot
        ("prefill", "● llama-server 127.0.0.1:8080 — reading a prompt"),
        ("stalled", "● llama-server 127.0.0.1:8080 — stalled"),
        ("idle", "○ llama-server 127.0.0.1:8080 — idle"),
    ],
)
def test_server_dot_shows_work_and_loading(tray: TrayController, phase: str, line: str) -> None:
    tray.update_snapshot(snap(1.0, server(model(phase=phase))))
    tray.menu.aboutToShow.emit()
    assert tray.server_lines()[0] == line


def test_offload_mark_in_the_menu_follows_the_threshold(tray: TrayController) -> None:
    tray.update_snapshot(snap(1.0, server(model(phase="idle", gpu_fraction=0.9))))
    tray.menu.aboutToShow.emit()
    assert tray.server_lines()[1].endswith("·  10 % CPU ⚠")  # under the default 98 %
    tray.set_thresholds(Thresholds(offload_gpu_fraction=0.85))  # what the app calls on new settings
    tray.menu.aboutToShow.emit()
    assert "CPU" not in tray.server_lines()[1]


def test_an_exact_rate_in_the_menu_has_no_mark() -> None:
    exact = server(model(rate=40.0, exact=True))
    assert server_line(exact) == "● llama-server 127.0.0.1:8080 — decoding 40 tok/s"


def test_the_menu_copies_each_active_alerts_fix(qtbot: QtBot, tray: TrayController) -> None:
    """#20: "Copy fix: <headline>" for each active alert with commands puts them on the clipboard,
    one per line; alerts without commands, and ended ones, get no entry."""
    commands = ("llama-server -c 16384 -np 2 -ngl 999", "llama-server -fa on -ctk q8_0 -ctv q8_0")
    fixed = alert("offload-1", evidence={"cpu_share": 0.52}, fix_commands=commands)
    plain = alert("floor-2", kind="below_floor")
    ended = alert("offload-3", fix_commands=("ollama stop x",), ended_wall_s=2.0)
    tray.update_snapshot(snap(1.0, server(model()), alerts=(fixed, plain, ended)))
    tray.menu.aboutToShow.emit()
    assert [a.text() for a in tray.fix_copy_actions] == ["Copy fix: qwen3:30b spilled to the CPU (52 %)"]
    assert tray.fix_copy_actions[0].toolTip() == "\n".join(commands)
    QGuiApplication.clipboard().clear()
    tray.fix_copy_actions[0].trigger()
    qtbot.waitUntil(lambda: QGuiApplication.clipboard().text() == "\n".join(commands))
    tray.update_snapshot(snap(2.0, server(model()), alerts=(plain,)))
    tray.menu.aboutToShow.emit()
    assert tray.fix_copy_actions == []
