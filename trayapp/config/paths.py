"""Where config, data and logs live. `LLM_TRAY_HOME` relocates everything (tests use it).

The config and data folders are this user's only (0700: created so, tightened when llm-tray owns
them; `config/files.py` `private_dir`). Asking for a folder never raises: in a read-only home the
commands that only read still work, and what must write says so where it writes (docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from trayapp.config.files import private_dir

APP_NAME = "llm-tray"


def _home_override() -> Path | None:
    value = os.environ.get("LLM_TRAY_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    home = _home_override()
    return private_dir(
        home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    )


def data_dir() -> Path:
    home = _home_override()
    return private_dir(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)))


def config_file() -> Path:
    return config_dir() / "config.toml"


def store_file() -> Path:
    return data_dir() / "llm-tray.sqlite3"


def log_file() -> Path:
    return data_dir() / "llm-tray.log"


def cache_dir() -> Path:
    return private_dir(data_dir() / "cache")


def agent_token_file() -> Path:
    """The agent's token (`llm-tray agent --new-token`): `agent-token` in the config dir."""
    return config_dir() / "agent-token"


def unwritable(folder: Path) -> str | None:
    """Why nothing can be written in `folder` (a read-only home), or None when it can be."""
    if not folder.is_dir():
        return f"{folder} does not exist and cannot be created"
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None
