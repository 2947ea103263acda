"""Start at login: the XDG .desktop file and the macOS LaunchAgent, written into temp dirs."""

from __future__ import annotations

import plistlib
import shlex
from pathlib import Path

import pytest

from trayapp.services import autostart


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    return tmp_path / "cfg" / "autostart" / "llm-tray.desktop"


def _exec_args(desktop: str) -> list[str]:
    line = next(x for x in desktop.splitlines() if x.startswith("Exec="))
    return shlex.split(line.removeprefix("Exec=").replace("%%", "%"))


def test_xdg_enable_disable_round_trip(xdg: Path) -> None:
    assert not autostart.is_enabled(platform="linux")
    where = autostart.enable(["/opt/my apps/python3", "-m", "trayapp", "--at-login"], platform="linux")
    assert where == str(xdg)
    text = xdg.read_text()
    assert text.startswith("[Desktop Entry]\n") and "Type=Application" in text
    assert _exec_args(text) == ["/opt/my apps/python3", "-m", "trayapp", "--at-login"]
    assert autostart.is_enabled(platform="linux")
    autostart.disable(platform="linux")
    assert not xdg.exists()
    assert not autostart.is_enabled(platform="linux")
    autostart.disable(platform="linux")  # idempotent


def test_xdg_file_switched_off_by_the_desktop_counts_as_disabled(xdg: Path) -> None:
    autostart.enable(["llm-tray", "--at-login"], platform="linux")
    xdg.write_text(
        xdg.read_text().replace("X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-enabled=false")
    )
    assert not autostart.is_enabled(platform="linux")


def test_default_command_starts_the_tray_at_login(xdg: Path) -> None:
    command = autostart.autostart_command()
    assert command[-1] == "--at-login"
    assert command[1:3] == ["-m", "trayapp"] or Path(command[0]).name.startswith("llm-tray")
    autostart.enable(platform="linux")
    assert _exec_args(xdg.read_text()) == command


def test_exec_quoting_of_special_characters() -> None:
    entry = autostart.desktop_entry(['/p/with "quote"', "100%", "$HOME"])
    assert 'Exec="/p/with \\"quote\\"" 100%% "\\$HOME"' in entry


def test_macos_launch_agent(tmp_path: Path) -> None:
    where = autostart.enable(
        ["/usr/bin/python3", "-m", "trayapp", "--at-login"], platform="darwin", home=tmp_path
    )
    plist = plistlib.loads(Path(where).read_bytes())
    assert Path(where) == tmp_path / "Library" / "LaunchAgents" / "io.github.llm-tray.plist"
    assert plist["ProgramArguments"] == ["/usr/bin/python3", "-m", "trayapp", "--at-login"]
    assert plist["RunAtLoad"] is True
    assert autostart.is_enabled(platform="darwin", home=tmp_path)
    autostart.disable(platform="darwin", home=tmp_path)
    assert not autostart.is_enabled(platform="darwin", home=tmp_path)


def test_unwritable_location_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    with pytest.raises(autostart.AutostartError, match="cannot write"):
        autostart.enable(["llm-tray"], platform="linux")


def test_unknown_platform_is_refused() -> None:
    with pytest.raises(autostart.AutostartError, match="not supported"):
        autostart.enable(["x"], platform="plan9")
    assert not autostart.is_enabled(platform="plan9")
