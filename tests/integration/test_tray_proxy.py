"""The tray app runs the recording proxies in its settings (#12): real HTTP through the proxy to a fake
streaming Ollama on loopback, the request in the next snapshot, the proxy's menu line with its address
copied, a taken port warned about (the app keeps running), settings applied live, quit stops it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.support.fake_streaming import Capture, FakeStreamingUpstream
from trayapp.app import tray_app as app_module
from trayapp.app.tray_app import settings_services
from trayapp.app.tray_main import default_monitor_factory
from trayapp.config.settings import HardwareConfig, MonitorConfig, ProxyConfig, Settings
from trayapp.config.settings_file import load_settings
from trayapp.core.model import RequestRecord, Snapshot
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.ui.qtcompat import apply_workarounds
from trayapp.ui.settings_dialog import SettingsDialog

apply_workarounds()

TOKENS = 6
PROMPT_TOKENS = 26  # the fake's default prompt_eval_count
WAIT_MS = 20_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    """Whether something listens on the port: binding it fails (no connection is opened to a live proxy,
    so none is left half-accepted when the proxy is stopped right after)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's listener does
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


@pytest.fixture
def ollama() -> Iterator[FakeStreamingUpstream]:
    with FakeStreamingUpstream("ollama", tokens=TOKENS, prefill_delay_s=0.05, token_delay_s=0.01) as fake:
        yield fake


class Running:
    """A TrayApp built as run_tray builds it (the real Monitor, one RecordInbox), and its snapshots."""

    def __init__(self, qapp: QApplication, settings: Settings, tmp_path: Path) -> None:
        inbox = RecordInbox()
        factory = default_monitor_factory(settings, (), False, None, inbox)
        events = app_module.TestEvents(str(tmp_path / "events.jsonl"))
        self.app = app_module.TrayApp(qapp, settings, factory, events=events, proxy_inbox=inbox)
        self.snapshots: list[Snapshot] = []
        self.app.runner.snapshot_ready.connect(self.snapshots.append)

    def proxy_records(self) -> list[RequestRecord]:
        return [r for s in self.snapshots for r in s.requests if r.source == "proxy"]


@pytest.fixture
def running(qapp: QApplication, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(*proxies: ProxyConfig) -> Running:
        settings = Settings(
            monitor=MonitorConfig(discover=False, poll_active_s=0.2, poll_idle_s=0.3),
            hardware=HardwareConfig(ram_bandwidth_gbps=50.0),  # no RAM benchmark in the test
            proxies=proxies,
        )
        run = Running(qapp, settings, tmp_path)
        started.append(run)
        run.app.start()
        return run

    yield start
    for run in started:
        run.app.shutdown()
        with contextlib.suppress(RuntimeError, TypeError):
            qapp.aboutToQuit.disconnect(run.app.shutdown)


def test_a_request_through_the_proxy_reaches_the_snapshot_and_the_menu_copies_the_address(
    qtbot: QtBot, ollama: FakeStreamingUpstream, running: Callable[..., Running]
) -> None:
    port = _free_port()
    run = running(ProxyConfig(f"127.0.0.1:{port}", ollama.url, kind="ollama"))
    tray = run.app.tray
    address = f"http://127.0.0.1:{port}"
    assert [p.client_url for p in tray.proxies] == [address]
    assert run.app.proxies.inbox.upstreams == (ollama.url,)  # the monitor knows the server is proxied

    tray.rebuild_menu()  # as the menu opens
    texts = [a.text() for a in tray.menu.actions()]
    assert f"Proxy 127.0.0.1:{port} → Ollama" in texts
    assert len(tray.proxy_copy_actions) == 1 and tray.proxy_copy_actions[0].text().strip() == "Copy address"
    clipboard = QGuiApplication.clipboard()
    clipboard.setText("something else")
    tray.proxy_copy_actions[0].trigger()
    assert clipboard.text() == address

    body = {"model": "qwen3:30b", "messages": [{"role": "user", "content": "hi"}]}  # streams: no `stream`
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        response = client.post(address + "/api/chat", json=body)
    assert response.status_code == 200

    def chats() -> list[Capture]:  # the monitor's own polls (GET /api/version, …) are captured too
        return [c for c in list(ollama.captures) if c.path == "/api/chat" and c.finished.is_set()]

    qtbot.waitUntil(lambda: bool(chats()), timeout=WAIT_MS)
    (capture,) = chats()
    assert bytes(capture.response_body) == response.content  # reached the fake, bytes unchanged

    qtbot.waitUntil(lambda: bool(run.proxy_records()), timeout=WAIT_MS)
    (record,) = run.proxy_records()
    assert record.model == "qwen3:30b" and record.endpoint == "/api/chat"
    assert record.decode_tokens == TOKENS and record.prompt_tokens == PROMPT_TOKENS
    assert record.decode_tok_s == pytest.approx(TOKENS / (TOKENS * 0.01))  # eval_count / eval_duration
    server_urls = {s.url for s in run.snapshots[-1].servers}
    assert ollama.url in server_urls and address not in server_urls  # the upstream is watched, once

    run.app.shutdown()
    assert not _listening(port)  # quitting stops the proxy


def test_a_taken_port_is_a_warning_and_the_other_proxies_run(
    qtbot: QtBot, ollama: FakeStreamingUpstream, running: Callable[..., Running]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = _free_port()
        run = running(
            ProxyConfig(f"127.0.0.1:{busy}", ollama.url, kind="ollama"),
            ProxyConfig(f"127.0.0.1:{free}", ollama.url, kind="ollama"),
        )
        warnings = [w for w in run.app.warnings if f"proxy 127.0.0.1:{busy} not started" in w]
        assert warnings == [
            f"proxy 127.0.0.1:{busy} not started: port {busy} is already in use. "
            "Choose another port in Settings."
        ], run.app.warnings
        assert [p.listen_port for p in run.app.tray.proxies] == [free]
        qtbot.waitUntil(lambda: len(run.snapshots) >= 2, timeout=WAIT_MS)  # still sampling
        assert run.app.runner.is_running()
        with httpx.Client(trust_env=False, timeout=10.0) as client:
            assert (
                client.post(f"http://127.0.0.1:{free}/api/generate", json={"prompt": "x"}).status_code == 200
            )


def test_settings_apply_live_and_remote_without_a_token_stays_off(
    qtbot: QtBot,
    ollama: FakeStreamingUpstream,
    running: Callable[..., Running],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = _free_port(), _free_port()
    proxy = ProxyConfig(f"127.0.0.1:{first}", ollama.url, kind="ollama")
    run = running(proxy)
    assert _listening(first)

    moved = ProxyConfig(f"127.0.0.1:{second}", ollama.url)  # another port, no kind
    run.app.apply_settings(Settings(monitor=run.app.settings.monitor, proxies=(moved,)))
    assert not _listening(first) and _listening(second)
    run.app.tray.rebuild_menu()
    assert f"Proxy 127.0.0.1:{second} → {ollama.url.removeprefix('http://')}" in [
        a.text() for a in run.app.tray.menu.actions()
    ]

    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    remote = ProxyConfig(f"0.0.0.0:{first}", ollama.url, allow_remote=True, token_env="NO_SUCH_TOKEN_VAR")
    run.app.apply_settings(Settings(monitor=run.app.settings.monitor, proxies=(moved, remote)))
    assert any("needs a token" in w and "NO_SUCH_TOKEN_VAR" in w for w in run.app.warnings)
    assert [p.listen_port for p in run.app.tray.proxies] == [second]  # unchanged one kept running
    assert not _listening(first)

    run.app.apply_settings(Settings(monitor=run.app.settings.monitor))
    assert not _listening(second) and run.app.tray.proxies == [] and run.app.tray.proxy_copy_actions == []
    assert run.app.proxies.inbox.upstreams == ()


def test_the_settings_dialog_edits_proxies_and_shows_the_client_address(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    dialog = SettingsDialog(Settings(), services=settings_services(), config_path=path)
    qtbot.addWidget(dialog)
    dialog.add_proxy()  # in front of Ollama by default
    assert dialog.proxy_listen_edit.text() == "127.0.0.1:11435"
    assert dialog.proxy_upstream_edit.text() == "http://127.0.0.1:11434"
    assert dialog.proxy_kind_combo.currentData() == "ollama" and dialog.proxy_enabled_check.isChecked()
    assert dialog.proxy_address.text() == "http://127.0.0.1:11435"
    dialog.add_proxy()
    assert dialog.proxy_listen_edit.text() == "127.0.0.1:11436"  # the next free port
    dialog.proxy_listen_edit.setText("127.0.0.1:99999")
    dialog.proxy_listen_edit.textEdited.emit("127.0.0.1:99999")
    with qtbot.assertNotEmitted(dialog.settings_changed, wait=200):
        dialog.accept()
    assert "proxies[1].listen: port 99999 is out of range" in dialog.error_label.text()
    dialog.proxy_listen_edit.setText("[::1]:8081")
    dialog.proxy_listen_edit.textEdited.emit("[::1]:8081")
    dialog.proxy_upstream_edit.setText("http://127.0.0.1:8080")
    dialog.proxy_upstream_edit.textEdited.emit("http://127.0.0.1:8080")
    dialog.proxy_kind_combo.setCurrentIndex(dialog.proxy_kind_combo.findData("llamacpp"))
    dialog.proxy_enabled_check.setChecked(False)
    assert dialog.proxy_address.text() == "http://[::1]:8081"
    assert dialog.proxy_list.item(1).text() == "[::1]:8081 → http://127.0.0.1:8080  (off)"
    dialog.copy_proxy_address()
    assert QGuiApplication.clipboard().text() == "http://[::1]:8081"
    with qtbot.waitSignal(dialog.settings_changed, timeout=5000) as blocker:
        dialog.accept()
    expected = (
        ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama"),
        ProxyConfig("[::1]:8081", "http://127.0.0.1:8080", kind="llamacpp", enabled=False),
    )
    assert blocker.args[0].proxies == expected
    assert load_settings(path).settings.proxies == expected

    again = SettingsDialog(load_settings(path).settings, services=settings_services(), config_path=path)
    qtbot.addWidget(again)
    assert again.proxy_list.count() == 2 and again.proxy_address.text() == "http://127.0.0.1:11435"
    again.proxy_list.setCurrentRow(0)
    again.remove_proxy()
    assert again.proxy_list.count() == 1 and again.proxy_address.text() == "http://[::1]:8081"
