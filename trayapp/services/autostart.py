"""Start llm-tray at login: XDG autostart on Linux, a LaunchAgent on macOS, the Run key on Windows.

No Qt here. The command written starts the tray with `--at-login`, which makes
it wait for the system tray to appear instead of failing. Every function takes
`platform` (default `sys.platform`) and, for the file-based platforms, honours
`$XDG_CONFIG_HOME` / `home` so tests write into a temp dir.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trayapp.config.files import atomic_write_bytes

APP_ID = "llm-tray"
LAUNCH_AGENT_LABEL = "io.github.llm-tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


class AutostartError(Exception):
    """Start at login could not be changed; the message says where and why."""


def autostart_command() -> list[str]:
    """The command line that starts the tray at login."""
    if getattr(sys, "frozen", False):  # a PyInstaller build: the executable is the app
        exe = Path(sys.executable)
        if exe.stem.lower() == "llm-tray-cli":  # Windows' console twin: login starts the windowed one
            exe = exe.with_name("llm-tray" + exe.suffix)
        return [str(exe), "--at-login"]
    python = Path(sys.executable)
    script_dir = python.parent
    for name in ("llm-tray", "llm-tray.exe"):
        script = shutil.which(name, path=str(script_dir))
        if script:
            return [script, "--at-login"]
    if python.name.lower() == "python.exe" and (script_dir / "pythonw.exe").exists():
        python = script_dir / "pythonw.exe"  # no console window at login
    return [str(python), "-m", "trayapp", "--at-login"]


# --------------------------------------------------------------------------- Linux (XDG)


def xdg_autostart_file() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "autostart" / f"{APP_ID}.desktop"


def _desktop_quote(arg: str) -> str:
    """Quote one argument for a .desktop Exec key (Desktop Entry spec, 'The Exec key')."""
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in " \t\n\"'\\><~|&;$*?#()`"):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return f'"{escaped}"'


def desktop_entry(command: Sequence[str]) -> str:
    exec_line = " ".join(_desktop_quote(arg) for arg in command)
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=llm-tray\n"
        "Comment=Live decode speed of local LLM servers against the memory-bandwidth ceiling\n"
        f"Exec={exec_line}\n"
        "Icon=llm-tray\n"
        "Terminal=false\n"
        "Categories=Utility;Monitor;\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


# --------------------------------------------------------------------------- macOS


def launch_agent_file(home: Path | None = None) -> Path:
    return (home or Path.home()) / "Library" / "LaunchAgents" / f"{LAUNCH_AGENT_LABEL}.plist"


def launch_agent_plist(command: Sequence[str]) -> bytes:
    return plistlib.dumps(
        {
            "Label": LAUNCH_AGENT_LABEL,
            "ProgramArguments": list(command),
            "RunAtLoad": True,
            "KeepAlive": False,
            "ProcessType": "Interactive",
        }
    )


# --------------------------------------------------------------------------- file helpers


def _write(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise AutostartError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise AutostartError(f"cannot remove {path}: {exc.strerror or exc}") from exc


def _winreg() -> Any:
    """The Windows registry module (imported only on Windows, typed loosely for other platforms)."""
    import winreg

    return winreg


# --------------------------------------------------------------------------- public API


def enable(
    command: Sequence[str] | None = None, *, platform: str | None = None, home: Path | None = None
) -> str:
    """Register the tray to start at login; returns where (a path or a registry key)."""
    command = list(command or autostart_command())
    platform = platform or sys.platform
    if platform.startswith("linux") or platform.startswith("freebsd"):
        path = xdg_autostart_file()
        _write(path, desktop_entry(command).encode("utf-8"))
        return str(path)
    if platform == "darwin":
        path = launch_agent_file(home)
        _write(path, launch_agent_plist(command))
        return str(path)
    if platform == "win32":
        winreg = _winreg()
        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
                winreg.SetValueEx(key, APP_ID, 0, winreg.REG_SZ, subprocess.list2cmdline(command))
        except OSError as exc:
            raise AutostartError(f"cannot write HKCU\\{RUN_KEY}\\{APP_ID}: {exc}") from exc
        return f"HKCU\\{RUN_KEY}\\{APP_ID}"
    raise AutostartError(f"start at login is not supported on {platform}")


def disable(*, platform: str | None = None, home: Path | None = None) -> None:
    platform = platform or sys.platform
    if platform.startswith("linux") or platform.startswith("freebsd"):
        _remove(xdg_autostart_file())
    elif platform == "darwin":
        _remove(launch_agent_file(home))
    elif platform == "win32":
        winreg = _winreg()
        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
                winreg.DeleteValue(key, APP_ID)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise AutostartError(f"cannot change HKCU\\{RUN_KEY}: {exc}") from exc
    else:
        raise AutostartError(f"start at login is not supported on {platform}")


def is_enabled(*, platform: str | None = None, home: Path | None = None) -> bool:
    platform = platform or sys.platform
    if platform.startswith("linux") or platform.startswith("freebsd"):
        return _xdg_enabled(xdg_autostart_file())
    if platform == "darwin":
        return launch_agent_file(home).is_file()
    if platform == "win32":
        winreg = _winreg()
        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, APP_ID)
        except OSError:
            return False
        return True
    return False


def _xdg_enabled(path: Path) -> bool:
    """Present and not switched off (Hidden=true / X-GNOME-Autostart-enabled=false)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("Hidden", "X-GNOME-Autostart-enabled"):
            off = value.strip().lower() == ("true" if key.strip() == "Hidden" else "false")
            if off:
                return False
    return True


def describe(command: Sequence[str] | None = None) -> str:
    """The command as a shell would read it (for logs and the settings dialog)."""
    return shlex.join(command or autostart_command())
