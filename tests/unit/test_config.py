"""Config: TOML round trip, clear errors with line / key path, defaults + backup on a broken file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trayapp.config import paths
from trayapp.config.settings import EndpointConfig, Settings, parse_settings
from trayapp.config.settings_file import load_settings, save_settings
from trayapp.core.thresholds import Thresholds


def test_llm_tray_home_relocates_config_and_data(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))
    assert paths.config_file() == tmp_path / "home" / "config" / "config.toml"
    assert paths.store_file().parent == tmp_path / "home" / "data"
    assert paths.store_file().parent.is_dir()


def test_missing_file_gives_defaults_without_errors(tmp_path: Path) -> None:
    result = load_settings(tmp_path / "none.toml")
    assert result.settings == Settings()
    assert result.errors == ()
    assert result.backup_path is None


def test_round_trip_keeps_every_value(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    settings = Settings(
        thresholds=Thresholds(kv_slowdown_pct=22.0, confirm_s=3.0),
        endpoints=(
            EndpointConfig(url="http://127.0.0.1:8080", kind="llamacpp", api_key_env="LLAMA_KEY"),
            EndpointConfig(url="http://10.0.0.5:11434", kind="ollama", gpu="RTX 4090", vram_gb=24.0),
        ),
    )
    save_settings(settings, path)
    loaded = load_settings(path)
    assert loaded.errors == ()
    assert loaded.settings == settings
    assert "api_key =" not in path.read_text()


def test_syntax_error_names_the_line_and_keeps_a_backup(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    broken = "[monitor]\npoll_active_s = 1.0\n[thresholds\nkv_slowdown_pct = 10\n"
    path.write_text(broken)
    result = load_settings(path)
    assert result.settings == Settings()
    assert len(result.errors) == 1
    assert "line 3" in result.errors[0]
    assert result.backup_path is not None and result.backup_path.read_text() == broken
    assert path.read_text() == broken  # the user's file is never destroyed


def test_bad_value_names_the_key_path_and_keeps_good_sections(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[thresholds]\nkv_slowdown_pct = "lots"\n[monitor]\npoll_active_s = 2.5\n'
        '[[endpoints]]\nurl = "ftp://x"\n[exporter]\nport = 70000\n'
    )
    result = load_settings(path)
    text = "\n".join(result.errors)
    assert "thresholds.kv_slowdown_pct" in text
    assert "endpoints[0].url" in text
    assert "exporter.port" in text and "out of range" in text
    assert result.settings.monitor.poll_active_s == 2.5  # a valid section still applies
    assert result.settings.thresholds == Thresholds()  # the broken one falls back to defaults
    assert result.backup_path is not None and result.backup_path.exists()


def test_unknown_keys_and_kinds_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[monitor]\npoll_fast = 1\n[[endpoints]]\nurl = "http://127.0.0.1:1"\nkind = "tgi"\n')
    errors = "\n".join(load_settings(path).errors)
    assert "monitor.poll_fast: unknown setting" in errors
    assert "endpoints[0].kind" in errors and "tgi" in errors


KINDS_TO_NAME = "use one of ollama, llamacpp, lmstudio, vllm, sglang, mlx, openai"


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        # what a reading says when identification failed: no probe serves it (make_probe refused it)
        ("unknown", f"unknown server kind 'unknown': {KINDS_TO_NAME}"),
        ("llamcpp", f"unknown server kind 'llamcpp' (did you mean 'llamacpp'?): {KINDS_TO_NAME}"),
        ("LMStudio", f"unknown server kind 'LMStudio' (did you mean 'lmstudio'?): {KINDS_TO_NAME}"),
        ("llamacpp-router", "unknown server kind 'llamacpp-router' (did you mean 'llamacpp'?)"),
    ],
)
@pytest.mark.parametrize(
    ("section", "entry"),
    [
        ("endpoints", {"url": "http://127.0.0.1:8080"}),
        ("proxies", {"listen": "127.0.0.1:11435", "upstream": "http://127.0.0.1:11434"}),
    ],
)
def test_a_kind_is_one_a_user_may_name_as_on_the_command_line(
    section: str, entry: dict[str, object], kind: str, why: str
) -> None:
    settings, errors = parse_settings({section: [{**entry, "kind": kind}]})
    assert len(errors) == 1 and errors[0].startswith(f"{section}[0].kind: {why}"), errors
    assert getattr(settings, section) == ()


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    save_settings(Settings(), path)
    save_settings(Settings(thresholds=Thresholds(regression_pct=30.0)), path)
    assert load_settings(path).settings.thresholds.regression_pct == 30.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]
