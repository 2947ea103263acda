"""Settings dialog: round trip through the real config file, connection test, keyring failure."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest
from PySide6.QtWidgets import QFormLayout
from pytestqt.qtbot import QtBot

from tests.support.memory_keyring import MemoryKeyring
from trayapp.app.tray_app import settings_services, store_api_key
from trayapp.config.settings import EndpointConfig, NotificationConfig, Settings
from trayapp.config.settings_file import load_settings, save_settings
from trayapp.ui.settings_dialog import SettingsDialog, SettingsServices

REAL = settings_services()  # the app's: real HTTP identify, the real keyring module


@pytest.fixture
def use_keyring() -> Iterator[None]:
    previous = keyring.get_keyring()
    yield
    keyring.set_keyring(previous)


def test_round_trip_through_the_config_file(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    start = Settings(
        endpoints=(EndpointConfig(url="http://127.0.0.1:8080", kind="llamacpp", bandwidth_gbps=936.0),),
        notifications=NotificationConfig(muted_kinds=("cold_load",)),
    )
    save_settings(start, path)
    dialog = SettingsDialog(load_settings(path).settings, services=REAL, config_path=path)
    qtbot.addWidget(dialog)
    assert dialog.settings() == start  # opening and reading back changes nothing

    dialog.add_endpoint()
    dialog.url_edit.setText("http://127.0.0.1:11434")
    dialog.url_edit.textEdited.emit("http://127.0.0.1:11434")
    dialog.kind_combo.setCurrentIndex(dialog.kind_combo.findData("ollama"))
    dialog.env_edit.setText("OLLAMA_KEY")
    dialog.env_edit.textEdited.emit("OLLAMA_KEY")
    dialog.poll_active_spin.setValue(0.5)
    dialog.poll_idle_spin.setValue(8.0)
    dialog.discover_check.setChecked(False)
    dialog.threshold_spins["below_floor_tok_s"].setValue(4.0)
    dialog.threshold_spins["low_efficiency_ratio"].setValue(0.4)
    dialog.dnd_check.setChecked(True)
    dialog.mute_checks["offload"].setChecked(True)
    dialog.mute_checks["cold_load"].setChecked(False)
    dialog.exporter_check.setChecked(True)
    dialog.port_spin.setValue(9500)
    dialog.retention_spin.setValue(7.0)
    with qtbot.waitSignal(dialog.settings_changed, timeout=5000) as blocker:
        dialog.buttons.button(dialog.buttons.StandardButton.Ok).click()
    saved: Settings = blocker.args[0]
    result = load_settings(path)
    assert result.errors == ()
    assert result.settings == saved
    assert saved.endpoints[0].bandwidth_gbps == 936.0  # a field the dialog does not edit survives
    assert saved.endpoints[1] == EndpointConfig(
        url="http://127.0.0.1:11434", kind="ollama", api_key_env="OLLAMA_KEY"
    )
    assert (saved.monitor.poll_active_s, saved.monitor.poll_idle_s, saved.monitor.discover) == (
        0.5,
        8.0,
        False,
    )
    assert saved.thresholds.below_floor_tok_s == 4.0 and saved.thresholds.low_efficiency_ratio == 0.4
    assert saved.notifications == NotificationConfig(
        enabled=True, do_not_disturb=True, muted_kinds=("offload",)
    )
    assert (saved.exporter.enabled, saved.exporter.port) == (True, 9500)
    assert saved.store.retention_days == 7.0
    assert not dialog.isVisible()


def test_mute_list_has_every_alert_kind_with_its_label(qtbot: QtBot) -> None:
    dialog = SettingsDialog(
        Settings(notifications=NotificationConfig(muted_kinds=("old_kind",))), services=REAL
    )
    qtbot.addWidget(dialog)
    assert list(dialog.mute_checks) == [
        "offload",
        "kv_slowdown",
        "context_full",
        "context_overflow",
        "below_floor",
        "low_efficiency",
        "draft_acceptance",
        "vram_pressure",
        "regression",
        "server_down",
        "cold_load",
        "old_kind",  # muted in the config, unknown now: still shown, so it can be unmuted
    ]
    assert dialog.mute_checks["offload"].text() == "offload: part of a model spilled to system RAM"
    assert dialog.mute_checks["old_kind"].text() == "old_kind" and dialog.mute_checks["old_kind"].isChecked()


def test_bad_values_are_refused_with_the_key_path(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    dialog = SettingsDialog(Settings(), services=REAL, config_path=path)
    qtbot.addWidget(dialog)
    dialog.add_endpoint()
    dialog.url_edit.setText("ftp://nope")
    dialog.url_edit.textEdited.emit("ftp://nope")
    with qtbot.assertNotEmitted(dialog.settings_changed, wait=200):
        dialog.accept()
    assert "endpoints[0].url" in dialog.error_label.text()
    assert not path.exists()
    dialog.remove_endpoint()
    assert dialog.endpoint_editor.list.count() == 0
    with qtbot.waitSignal(dialog.settings_changed, timeout=5000):
        dialog.accept()
    assert load_settings(path).settings == Settings()


def test_keyring_failure_says_why_and_offers_the_env_var(qtbot: QtBot, use_keyring: None) -> None:
    keyring.set_keyring(keyring.backends.fail.Keyring())  # what a headless Linux box has
    dialog = SettingsDialog(Settings(endpoints=(EndpointConfig(url="http://127.0.0.1:8080"),)), services=REAL)
    qtbot.addWidget(dialog)
    dialog.api_key.edit.setText("sk-secret")
    dialog.api_key.button.click()
    qtbot.waitUntil(lambda: dialog.api_key.status.text().startswith("✗"), timeout=5000)
    text = dialog.api_key.status.text()
    assert "no OS keyring is available" in text and "api_key_env" in text
    assert "sk-secret" not in text
    assert dialog.settings().endpoints[0].use_keyring is False


def test_key_goes_to_the_keyring_not_the_file(qtbot: QtBot, tmp_path: Path, use_keyring: None) -> None:
    memory = MemoryKeyring()
    keyring.set_keyring(memory)
    path = tmp_path / "config.toml"
    dialog = SettingsDialog(
        Settings(endpoints=(EndpointConfig(url="http://127.0.0.1:8080"),)), services=REAL, config_path=path
    )
    qtbot.addWidget(dialog)
    dialog.api_key.edit.setText("sk-secret")
    dialog.api_key.button.click()
    qtbot.waitUntil(lambda: dialog.api_key.status.text().startswith("✓"), timeout=5000)
    assert memory.store == {("llm-tray", "http://127.0.0.1:8080"): "sk-secret"}
    with qtbot.waitSignal(dialog.settings_changed, timeout=5000):
        dialog.accept()
    assert load_settings(path).settings.endpoints[0].use_keyring is True
    assert "sk-secret" not in path.read_text()


def test_connection_test_runs_off_the_gui_thread(qtbot: QtBot) -> None:
    calls: list[tuple[str, str | None, int]] = []

    def identify(url: str, key: str | None) -> tuple[str | None, str]:
        calls.append((url, key, threading.get_ident()))
        return "llamacpp", "/props has model_path/build_info"

    dialog = SettingsDialog(
        Settings(endpoints=(EndpointConfig(url="http://127.0.0.1:8080"),)),
        services=SettingsServices(identify=identify, store_api_key=store_api_key),
    )
    qtbot.addWidget(dialog)
    dialog.test_connection()
    qtbot.waitUntil(lambda: dialog.test_result.text().startswith("✓"), timeout=5000)
    assert dialog.test_result.text() == "✓ llama-server (/props has model_path/build_info)"
    assert calls[0][:2] == ("http://127.0.0.1:8080", None)
    assert calls[0][2] != threading.get_ident()


def test_hung_server_times_out_without_blocking(qtbot: QtBot) -> None:
    release = threading.Event()

    def identify(url: str, key: str | None) -> tuple[str | None, str]:
        release.wait(10)  # a server that accepts and never answers
        return "ollama", "late"

    dialog = SettingsDialog(
        Settings(endpoints=(EndpointConfig(url="http://127.0.0.1:9"),)),
        services=SettingsServices(identify=identify, store_api_key=store_api_key),
        test_timeout_s=0.3,
    )
    qtbot.addWidget(dialog)
    dialog.test_connection()
    assert dialog.test_result.text() == "Testing http://127.0.0.1:9…"  # returned at once
    qtbot.waitUntil(lambda: "no answer within 0.3 s" in dialog.test_result.text(), timeout=3000)
    assert dialog.test_button.isEnabled()
    release.set()
    qtbot.wait(100)
    assert "no answer within" in dialog.test_result.text()  # the late answer is ignored


def test_real_identify_against_a_closed_port(qtbot: QtBot) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens there
    dialog = SettingsDialog(
        Settings(endpoints=(EndpointConfig(url=f"http://127.0.0.1:{port}"),)), services=REAL
    )
    qtbot.addWidget(dialog)
    dialog.test_connection()
    qtbot.waitUntil(lambda: dialog.test_result.text().startswith("✗"), timeout=8000)
    assert "unreachable" in dialog.test_result.text()


def test_each_threshold_spin_has_its_fields_label_and_range(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings(), services=REAL)
    qtbot.addWidget(dialog)
    assert len(dialog.threshold_spins) == 13  # one per Thresholds field
    floor = dialog.threshold_spins["below_floor_tok_s"]
    form = floor.parentWidget().layout()
    assert isinstance(form, QFormLayout)
    assert form.labelForField(floor).text() == "Floor (tok/s)"
    cold = dialog.threshold_spins["cold_load_min_s"]
    assert form.labelForField(cold).text() == "Cold load: a model load longer than (s)"  # was its field name
    kv = dialog.threshold_spins["kv_slowdown_pct"]
    assert (kv.minimum(), kv.maximum(), kv.value()) == (1.0, 95.0, 15.0)


def test_the_servers_add_button_adds_a_server_ready_to_edit(qtbot: QtBot) -> None:
    # The button once passed Qt's `checked` (False) as the URL: a TypeError, and a list out of step.
    dialog = SettingsDialog(Settings(), services=REAL)
    qtbot.addWidget(dialog)
    dialog.endpoint_editor.add_button.click()
    assert dialog.endpoint_editor.items == [EndpointConfig(url="http://127.0.0.1:8080")]
    assert dialog.endpoint_editor.list.item(0).text() == "http://127.0.0.1:8080"
    assert (
        dialog.url_edit.text() == "http://127.0.0.1:8080"
        and dialog.url_edit.selectedText() == dialog.url_edit.text()
    )
    assert dialog.settings().endpoints == (EndpointConfig(url="http://127.0.0.1:8080"),)
