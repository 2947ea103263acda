"""The settings file: read (never raising: defaults plus the errors, and a private backup without
secrets of a file it cannot use) and written atomically, readable by this user only."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trayapp.config import paths
from trayapp.config.files import PRIVATE_PERMISSIONS, atomic_write_bytes, atomic_write_text, read_at_most
from trayapp.config.list_sections import ConfigError
from trayapp.config.settings import LIST_SECTIONS, MAX_NESTING, Settings, nesting_depth, parse_settings

_TOO_DEEP = f"lists or tables nested deeper than any setting (more than {MAX_NESTING} levels)"


@dataclass(frozen=True)
class LoadResult:
    settings: Settings
    errors: tuple[str, ...] = ()
    backup_path: Path | None = None


MAX_CONFIG_BYTES = 1 << 20  # a config of settings is a few kB; a bigger file is not one


def _read_config(path: Path) -> bytes:
    """The file's bytes: a regular file of at most MAX_CONFIG_BYTES (a FIFO or a device there would
    hang or flood every command at start). Raises OSError, or ConfigError saying what it is."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("not a regular file: the app starts on defaults (replace it with a file)")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{st.st_size} bytes is no config file (at most {MAX_CONFIG_BYTES}): "
                "the app starts on defaults"
            )
        data = read_at_most(fd, MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"more than {MAX_CONFIG_BYTES} bytes is no config file: the app starts on defaults")
    return data


def load_settings(path: Path | None = None) -> LoadResult:
    """Read the config file. Never raises for a bad file: returns defaults plus the errors."""
    path = path or paths.config_file()
    try:
        raw = _read_config(path)
    except FileNotFoundError:
        return LoadResult(Settings())
    except OSError as exc:
        return LoadResult(Settings(), (f"{path}: cannot read ({exc.strerror or exc})",))
    except ConfigError as exc:
        return LoadResult(Settings(), (f"{path}: {exc}",))
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return LoadResult(Settings(), (f"{path}: not UTF-8 text ({exc.reason})",), _backup(path))
    except tomllib.TOMLDecodeError as exc:
        return LoadResult(Settings(), (f"{path}: syntax error: {exc}",), _backup(path))
    except RecursionError:  # tomllib recurses once per nested array or inline table
        return LoadResult(Settings(), (f"{path}: {_TOO_DEEP}",), _backup(path))
    if nesting_depth(data) > MAX_NESTING:
        return LoadResult(Settings(), (f"{path}: {_TOO_DEEP}",), _backup(path))
    try:
        settings, errors = parse_settings(data)
    except Exception as exc:  # a value no check foresaw: still the backup and defaults, never a crash
        return LoadResult(
            Settings(), (f"{path}: cannot use this file ({type(exc).__name__}: {exc})",), _backup(path)
        )
    backup = _backup(path) if errors else None
    return LoadResult(settings, tuple(f"{path}: {e}" for e in errors), backup)


# A secret typed into the file by mistake (`api_key = "sk-..."`): its backup keeps the line, not the value.
_SECRET_LINE = re.compile(
    r"(?im)^(\s*[\"']?(?:api[_-]?key|apikey|key|token|access[_-]?token|secret|password|passwd|authorization)"
    r"[\"']?\s*=\s*)\S.*$"
)
SECRET_REMOVED = '"<removed: API keys belong in the OS keyring or api_key_env>"'


# A password in a URL (`http://user:password@host`): the backup keeps the user name, not the password.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:\"']*:)[^\s/@\"']*@")


def _without_secrets(raw: bytes) -> bytes:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw  # not text: kept as it is, so nothing the user wrote is lost
    text = _SECRET_LINE.sub(lambda m: m.group(1) + SECRET_REMOVED, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + "<removed>@", text).encode("utf-8")


def _backup(path: Path) -> Path | None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.broken-{stamp}")
    try:  # private (0600) and never written through a link planted at its name
        atomic_write_bytes(backup, _without_secrets(path.read_bytes()), permissions=PRIVATE_PERMISSIONS)
    except OSError:
        return None  # a read-only config folder: the errors are still said, and defaults used
    return backup


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _to_plain(getattr(value, f.name))
            for f in fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value


def settings_to_toml(settings: Settings) -> str:
    plain = _to_plain(settings)
    for key in LIST_SECTIONS:
        if not plain.get(key):
            plain.pop(key, None)
    header = "# llm-tray settings. API keys are kept in the OS keyring, never here.\n"
    return header + tomli_w.dumps(plain)


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically (`config/files.py`), readable by this user only."""
    path = path or paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, settings_to_toml(settings), permissions=PRIVATE_PERMISSIONS)
    return path
