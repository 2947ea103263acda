"""The composition root: no-tray fallback, waiting for the tray at login, settings, test events."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.support.fake_monitor import FakeMonitor
from tests.support.snapshots import model, server, snap
from trayapp.app import tray_app as app_module
from trayapp.app import tray_main
from trayapp.app.single_instance import single_instance
from trayapp.config.settings import NotificationConfig, Settings


@pytest.fixture
def restore_globals(qapp: QApplication) -> Iterator[None]:
    """run_tray touches process-wide state: put it back for the next tests."""
    logger = logging.getLogger("trayapp")
    saved = (
        list(logger.handlers),
        logger.level,
        logger.propagate,
        sys.excepthook,
        qapp.quitOnLastWindowClosed(),
    )
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for handler in logger.handlers:
        if handler not in saved[0]:
            handler.close()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]
    sys.excepthook = saved[3]
    qapp.setQuitOnLastWindowClosed(saved[4])
    for sig, handler in saved_signals.items():
        signal.signal(sig, handler)


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _make(
    qapp: QApplication, tmp_path: Path, monitors: list[FakeMonitor], at_login: bool = False
) -> app_module.TrayApp:
    def factory() -> FakeMonitor:
        monitors.append(FakeMonitor())
        return monitors[-1]

    events = app_module.TestEvents(str(tmp_path / "events.jsonl"))
    return app_module.TrayApp(qapp, Settings(), factory, at_login=at_login, events=events)


def test_without_a_tray_the_dashboard_opens_and_plots(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    monitors: list[FakeMonitor] = []
    tray_app = _make(qapp, tmp_path, monitors)
    try:
        tray_app.start()  # offscreen: QSystemTrayIcon.isSystemTrayAvailable() is False
        assert tray_app.dashboard.isVisible()
        assert "No system tray is available" in tray_app.dashboard.banner.text()
        assert qapp.quitOnLastWindowClosed()  # the window is the app: closing it quits
        qtbot.waitUntil(lambda: tray_app.dashboard.redraw_count >= 4, timeout=5000)
        _, y = tray_app.dashboard.time_plot.decode_curve.getData()
        assert list(y[:3]) == [41.0, 42.0, 43.0]
        assert tray_app.tray.shown_state is not None
        qtbot.waitUntil(lambda: tray_app.tray.shown_state.health == "alert", timeout=5000)
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    assert monitors[0].closed and monitors[0].thread != threading.get_ident()
    kinds = [e["event"] for e in _events(tmp_path / "events.jsonl")]
    assert kinds[:2] == ["started", "icon"]
    for expected in ("no_tray", "dashboard_shown", "snapshot", "curve", "notified", "quit"):
        assert expected in kinds
    icons = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "icon"]
    assert icons[0]["health"] == "none"  # before the first reading
    assert any(str(e["text"]).isdigit() and 41 <= int(str(e["text"])) < 100 for e in icons)  # a live number
    curves = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "curve"]
    assert curves[-1]["points"] >= 3 and curves[-1]["model"] == "llama3.1:8b"


def test_at_login_waits_for_the_tray_then_falls_back(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_globals: None
) -> None:
    monkeypatch.setenv(app_module.TRAY_WAIT_ENV, "0.5")
    tray_app = _make(qapp, tmp_path, [], at_login=True)
    try:
        tray_app.start()
        assert not tray_app.dashboard.isVisible()  # waiting, not failing
        assert tray_app._tray_timer.isActive()
        qtbot.waitUntil(tray_app.dashboard.isVisible, timeout=5000)
        assert "No system tray appeared after login" in tray_app.dashboard.banner.text()
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


def test_at_login_shows_the_tray_when_it_appears(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_globals: None
) -> None:
    answers = iter([False, False, True])
    monkeypatch.setattr(
        app_module.QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: next(answers))
    )
    monkeypatch.setattr(app_module, "TRAY_POLL_MS", 50)
    tray_app = _make(qapp, tmp_path, [], at_login=True)
    try:
        tray_app.start()
        qtbot.waitUntil(lambda: tray_app.tray_visible, timeout=5000)
        assert not tray_app.dashboard.isVisible()
        assert "tray_shown" in [e["event"] for e in _events(tmp_path / "events.jsonl")]
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


def test_settings_are_applied_without_a_restart(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    monitors: list[FakeMonitor] = []
    tray_app = _make(qapp, tmp_path, monitors)
    try:
        tray_app.start()
        qtbot.waitUntil(lambda: bool(monitors) and monitors[0].ticks > 0, timeout=5000)
        new = Settings(notifications=NotificationConfig(do_not_disturb=True))
        tray_app.apply_settings(new)
        qtbot.waitUntil(lambda: monitors[0].applied == [new], timeout=5000)
        assert tray_app.notifier.gate.config.do_not_disturb
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


def test_diagnostics_include_versions_and_settings(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    tray_app = _make(qapp, tmp_path, [])
    text = tray_app.diagnostics(snap(1.0, server(model())))
    assert "PySide6 " in text and "pyqtgraph " in text and "discover=True" in text
    tray_app.shutdown()
    qapp.aboutToQuit.disconnect(tray_app.shutdown)


def test_a_store_that_stops_recording_shows_in_the_menu_and_diagnostics(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    monitors: list[FakeMonitor] = []
    tray_app = _make(qapp, tmp_path, monitors)
    try:
        tray_app.start()
        qtbot.waitUntil(lambda: bool(monitors) and monitors[0].ticks > 0, timeout=5000)
        monitors[0].store_error = "could not write: database or disk is full"
        qtbot.waitUntil(lambda: tray_app.store_error is not None, timeout=5000)
        tray_app.tray.rebuild_menu()
        lines = [a.text() for a in tray_app.tray.menu.actions()]
        assert lines[0] == "⚠ Session log: could not write: database or disk is full"
        assert "session log: could not write: database or disk is full" in tray_app.diagnostics(None)
        monitors[0].store_error = None
        qtbot.waitUntil(lambda: tray_app.store_error is None, timeout=5000)
        tray_app.tray.rebuild_menu()
        assert not [a.text() for a in tray_app.tray.menu.actions() if "Session log" in a.text()]
        assert "session log" not in tray_app.diagnostics(None)
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    events = _events(tmp_path / "events.jsonl")
    states = [e.get("error", "?") for e in events if e.get("event") == "store_state"]
    assert states == ["could not write: database or disk is full", None]


def test_the_session_log_notifies_when_a_failure_starts_and_ends_not_when_its_text_changes(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    tray_app = _make(qapp, tmp_path, [])
    shown: list[tuple[str, str, bool]] = []
    tray_app.tray.show_message = lambda title, body, critical=False: shown.append((title, body, critical))
    try:
        dropped = "the store x is full: dropped the 300 oldest samples to make room"
        lost = "the store x is full: kept sessions and requests, lost samples"
        for state in (dropped, lost, dropped, None, lost):
            tray_app.on_store_state(state)
        assert shown == [
            ("llm-tray: session log", dropped, True),
            ("llm-tray: session log", "recording again", False),
            ("llm-tray: session log", lost, True),
        ]
        tray_app.tray.rebuild_menu()
        assert tray_app.tray.menu.actions()[0].text() == f"⚠ Session log: {lost}"  # the latest text
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)


def test_second_start_asks_the_first_and_exits_0(qtbot: QtBot, restore_globals: None) -> None:
    first = single_instance()
    assert first.listen()
    try:
        with qtbot.waitSignal(first.show_requested, timeout=5000):
            code = tray_main.run_tray(Settings(), monitor_factory=FakeMonitor)
        assert code == 0
    finally:
        first.close()


def test_run_tray_runs_and_quits_on_sigint(tmp_path: Path) -> None:
    """The whole app in its own process (app.exec() must not run in the test's QApplication)."""
    events = tmp_path / "run.jsonl"
    home = tmp_path / "home"
    code = (
        "import sys; from tests.support.fake_monitor import FakeMonitor;"
        "from trayapp.app.tray_main import run_tray;"
        "from trayapp.config.settings import Settings;"
        "sys.exit(run_tray(Settings(), monitor_factory=FakeMonitor))"
    )
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        LLM_TRAY_HOME=str(home),
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),  # the repository: tests.support
    )
    env[tray_main.EVENTS_ENV] = str(events)
    with subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            deadline = time.monotonic() + 30
            while not any(e["event"] == "curve" for e in _events(events)):  # running and plotting
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "the app never plotted"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)  # Ctrl+C
            _, stderr_text = process.communicate(timeout=20)  # read as it comes: a full pipe blocks the app
        finally:
            if process.poll() is None:
                process.kill()
    kinds = [e["event"] for e in _events(events)]
    log_text = (home / "data" / "llm-tray.log").read_text()
    said = f"events {kinds}; exit {process.returncode}; log:\n{log_text[-3000:]}"
    said += f"\nstderr:\n{stderr_text[-2000:]}"
    assert process.returncode == 0, said
    assert kinds[0] == "started" and kinds[-1] == "quit", said  # failed once (cc42): last 'proxies'
    assert "no_tray" in kinds  # offscreen has no tray: it ran as a window
    assert "signal 2: quitting" in log_text and "stopped (exit code 0)" in log_text, said
    assert "failed (the rest is stopped all the same)" not in log_text, said  # every part stopped


def test_benchmark_this_model_opens_one_bench_window(
    qtbot: QtBot, qapp: QApplication, tmp_path: Path, restore_globals: None
) -> None:
    """The menu action asks the app; the app opens the bench window for that model (once: a second
    ask raises the same window). The bench itself is tests/integration/test_bench_window.py."""
    tray_app = _make(qapp, tmp_path, [])
    try:
        tray_app.start()
        qtbot.waitUntil(lambda: tray_app.tray.bench_target() is not None, timeout=5000)
        tray_app.tray.rebuild_menu()
        tray_app.tray.bench_action.trigger()
        window = tray_app._bench_window
        assert window is not None and window.isVisible()
        assert window.windowTitle() == "Benchmark llama3.1:8b"
        tray_app.tray.bench_action.trigger()
        assert tray_app._bench_window is window
        assert tray_app.monitor is not None  # what the bench stores through (the sampler's store)
    finally:
        tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    shown = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "bench_shown"]
    assert shown == [{**shown[0], "model": "llama3.1:8b"}] and len(shown) == 1


def test_a_part_that_fails_to_stop_leaves_the_rest_stopped(
    qtbot: QtBot,
    qapp: QApplication,
    tmp_path: Path,
    restore_globals: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Quitting stops every part even when one raises: the failure is logged, the sampler, the
    snapshot endpoint and the single-instance listener after it still stop, and the app says quit."""
    monitors: list[FakeMonitor] = []
    tray_app = _make(qapp, tmp_path, monitors)
    closed: list[str] = []

    def broken_stop() -> None:
        raise RuntimeError("a proxy that will not stop")

    class Instance:
        def close(self) -> None:
            closed.append("instance")

    tray_app.instance = Instance()  # type: ignore[assignment]
    tray_app.proxies.stop = broken_stop  # type: ignore[method-assign]
    try:
        tray_app.start()
        qtbot.waitUntil(lambda: bool(monitors) and tray_app.last_snapshot is not None, timeout=5000)
    finally:
        with caplog.at_level("ERROR"):
            tray_app.shutdown()
        qapp.aboutToQuit.disconnect(tray_app.shutdown)
    assert monitors[0].closed  # the sampler, stopped before the proxies
    assert tray_app.snapshots._closed and closed == ["instance"]  # both stopped after the failure
    assert [e["event"] for e in _events(tmp_path / "events.jsonl")][-1] == "quit"
    failed = [r for r in caplog.records if "stopping the proxies failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
