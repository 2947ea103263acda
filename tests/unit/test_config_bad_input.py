"""Bad local input never stops the app (#25): a config value out of range (inf, NaN, a number no
machine has) or nesting deeper than any setting is the `.broken-` backup and defaults, with the
message, as the README promises; never an exception at start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trayapp.config.settings import Settings
from trayapp.config.settings_file import load_settings


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[hardware]\nvram_gb = inf\n", "hardware.vram_gb"),
        ("[hardware]\nbandwidth_gbps = nan\n", "hardware.bandwidth_gbps"),
        ("[hardware]\nram_bandwidth_gbps = -inf\n", "hardware.ram_bandwidth_gbps"),
        ("[hardware]\nvram_gb = 1e300\n", "hardware.vram_gb"),
        ('[[endpoints]]\nurl = "http://10.0.0.5:8080"\nvram_gb = inf\n', "endpoints[0].vram_gb"),
        ("[thresholds]\nkv_slowdown_pct = nan\n", "thresholds.kv_slowdown_pct"),
        ("[store]\nretention_days = inf\n", "store.retention_days"),
    ],
)
def test_a_number_out_of_range_is_the_backup_and_defaults(tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(toml)
    result = load_settings(path)
    assert result.backup_path is not None and result.backup_path.read_text() == toml
    assert any(key in error for error in result.errors), result.errors
    settings = result.settings
    settings.hardware.profile()  # what every command does at start: no OverflowError
    for endpoint in settings.endpoints:
        endpoint.hardware_profile(settings.hardware.profile())


def test_deep_nesting_is_the_backup_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    result = load_settings(path)
    assert result.settings == Settings()
    assert result.backup_path is not None
    assert any("nest" in error for error in result.errors), result.errors


def test_moderate_nesting_in_a_setting_is_a_key_path_error_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[notifications]\nmuted_kinds = " + "[" * 200 + "]" * 200 + "\n[monitor]\npoll_idle_s = 7\n"
    )
    result = load_settings(path)
    assert result.backup_path is not None
    assert any("nest" in error or "notifications.muted_kinds" in error for error in result.errors)
    assert all(len(error) < 400 for error in result.errors)  # the message quotes no megabyte of brackets


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_the_backup_is_private(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[hardware]\nvram_gb = inf\n")
    backup = load_settings(path).backup_path
    assert backup is not None and stat.S_IMODE(os.stat(backup).st_mode) == 0o600


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_as_config_is_defaults_not_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    os.mkfifo(path)  # reading it would block every command at start
    result = load_settings(path)
    assert result.settings == Settings()
    assert any("not a regular file" in error for error in result.errors)


def test_a_directory_or_a_huge_file_as_config_is_defaults(tmp_path: Path) -> None:
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    assert load_settings(folder).settings == Settings()
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    result = load_settings(huge)
    assert result.settings == Settings() and any("no config file" in e for e in result.errors)
