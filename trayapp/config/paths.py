"""Where config, data and logs live. `LLM_TRAY_HOME` relocates everything (tests use it)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "llm-tray"


def _home_override() -> Path | None:
    value = os.environ.get("LLM_TRAY_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    home = _home_override()
    path = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    home = _home_override()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_file() -> Path:
    return config_dir() / "config.toml"


def store_file() -> Path:
    return data_dir() / "llm-tray.sqlite3"


def log_file() -> Path:
    return data_dir() / "llm-tray.log"


def cache_dir() -> Path:
    path = data_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def agent_token_file() -> Path:
    """The agent's token (`llm-tray agent --new-token`): `agent-token` in the config dir."""
    return config_dir() / "agent-token"
