"""Settings → Remote machines (#15): "Add a remote machine…", its URL and name saved as `[[agents]]`,
its token in the OS keyring (an in-memory backend here), never in the config file."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from tests.support.memory_keyring import MemoryKeyring
from trayapp.app.tray_app import settings_services
from trayapp.config.agents import AgentConfig
from trayapp.config.settings import Settings
from trayapp.config.settings_file import load_settings, save_settings
from trayapp.ui.settings_dialog import SettingsDialog

TOKEN = "tok-3f9a1c7e5b2d4a6c8e0f"


def type_into(edit: object, text: str) -> None:
    edit.setText(text)  # type: ignore[attr-defined]
    edit.textEdited.emit(text)  # type: ignore[attr-defined]


def test_add_a_remote_machine_with_its_token_in_the_keyring(
    qtbot: QtBot, tmp_path: Path, memory_keyring: MemoryKeyring
) -> None:
    path = tmp_path / "config.toml"
    start = Settings(agents=(AgentConfig(url="http://rack-1:9465", name="rack-1", token_env="RACK_TOKEN"),))
    save_settings(start, path)
    dialog = SettingsDialog(load_settings(path).settings, services=settings_services(), config_path=path)
    qtbot.addWidget(dialog)
    tab = dialog.agents_tab
    assert dialog.tabs.tabText(dialog.tabs.indexOf(tab)) == "Remote machines"
    assert dialog.settings() == start  # opening and reading back changes nothing
    assert tab.list.item(0).text() == "rack-1 — http://rack-1:9465"

    assert tab.add_button.text() == "Add a remote machine…"
    tab.add_button.click()
    assert tab.list.count() == 2 and tab.list.currentRow() == 1
    type_into(tab.url_edit, "http://gpu-box:9465/")
    type_into(tab.name_edit, "")  # blank: the URL's host
    tab.token.edit.setText(TOKEN)
    tab.token.button.click()
    qtbot.waitUntil(lambda: tab.token.status.text() == "✓ Token saved in the OS keyring.", timeout=5000)
    assert memory_keyring.store == {("llm-tray", "agent http://gpu-box:9465"): TOKEN}
    assert tab.token.edit.text() == ""

    with qtbot.waitSignal(dialog.settings_changed, timeout=5000) as blocker:
        dialog.buttons.button(dialog.buttons.StandardButton.Ok).click()
    saved: Settings = blocker.args[0]
    assert saved.agents == (
        AgentConfig(url="http://rack-1:9465", name="rack-1", token_env="RACK_TOKEN"),
        AgentConfig(url="http://gpu-box:9465", name="gpu-box"),
    )
    assert load_settings(path).settings.agents == saved.agents
    text = path.read_text()
    assert 'name = "gpu-box"' in text and TOKEN not in text and "tok-" not in text


def test_a_bad_url_is_refused_with_its_key_path(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    dialog = SettingsDialog(Settings(), services=settings_services(), config_path=path)
    qtbot.addWidget(dialog)
    tab = dialog.agents_tab
    assert not tab.box.isEnabled()  # nothing selected yet
    tab.add_agent()
    type_into(tab.url_edit, "gpu-box:9465")
    type_into(tab.name_edit, "gpu-box")
    with qtbot.assertNotEmitted(dialog.settings_changed, wait=200):
        dialog.accept()
    assert "agents[0].url: expected http://HOST:PORT" in dialog.error_label.text()
    assert not path.exists()
    tab.remove_agent()
    assert tab.list.count() == 0
    with qtbot.waitSignal(dialog.settings_changed, timeout=5000):
        dialog.accept()
    assert load_settings(path).settings == Settings()


def test_saving_a_token_needs_a_url_and_a_token(qtbot: QtBot, memory_keyring: MemoryKeyring) -> None:
    dialog = SettingsDialog(Settings(), services=settings_services())
    qtbot.addWidget(dialog)
    tab = dialog.agents_tab
    tab.add_agent()
    tab.token.edit.setText(TOKEN)
    tab.token.button.click()
    assert tab.token.status.text() == "Type the agent URL and its token first."
    assert memory_keyring.store == {}


# --------------------------------------------------------------------------- the menu, grouped by machine


def test_the_menu_groups_models_by_machine(qtbot: QtBot) -> None:
    from dataclasses import replace

    from tests.support import snapshots as s
    from trayapp.core.model import RemoteMachine
    from trayapp.ui.tray import TrayController

    tray = TrayController(None, min_redraw_interval_s=0.0, template=False)
    local = s.server(s.model("llama3.1:8b", "idle"))
    remote = replace(
        s.server(s.model("qwen3:30b", "decoding", 30.0), url="http://gpu-box:11434", kind="ollama"),
        machine="gpu-box",
    )
    box = RemoteMachine("gpu-box", "http://gpu-box:9465", "ok", hardware=s.HW, t_wall_s=s.T0)
    gone = RemoteMachine("rack-2", "http://rack-2:9465", "unreachable", "connection refused")
    tray.update_snapshot(replace(s.snap(1.0, local, remote), machines=(box, gone)))
    tray.menu.aboutToShow.emit()
    assert tray.server_lines() == [
        "○ llama-server 127.0.0.1:8080 — idle",  # this machine first
        "   llama3.1:8b Q4_K_M  ·  6.1k/8k ctx",
        "gpu-box — NVIDIA GeForce RTX 4090 · 21.3/24 GB",  # s.HW's GPU: 21.3e9 of 24e9 bytes
        "● Ollama gpu-box:11434 — decoding ~30 tok/s",
        "   qwen3:30b Q4_K_M  ·  6.1k/8k ctx",
        "⚠ rack-2: unreachable — connection refused",
    ]
    tray.update_snapshot(replace(s.snap(2.0), machines=(gone,)))  # no local server, one machine
    tray.menu.aboutToShow.emit()
    assert tray.server_lines() == ["⚠ rack-2: unreachable — connection refused"]


def test_a_machine_line_leaves_out_a_memory_it_does_not_know() -> None:
    from dataclasses import replace

    from tests.support import snapshots as s
    from trayapp.core.model import RemoteMachine
    from trayapp.ui.menu_text import machine_line

    gpu = replace(s.HW.gpus[0], vram_used_bytes=None)
    box = RemoteMachine("gpu-box", "http://gpu-box:9465", "ok", hardware=replace(s.HW, gpus=(gpu, gpu)))
    assert machine_line(box) == "gpu-box — NVIDIA GeForce RTX 4090 (+1)"  # once '—/— GB'
