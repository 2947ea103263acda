"""Config `[[proxies]]`: parsing, clear errors with the entry's index, a bad entry skipped (the rest load),
tokens never in the file, the round trip, and the upstreams the monitor must watch."""

from __future__ import annotations

from pathlib import Path

import pytest

from trayapp.config.settings import (
    EndpointConfig,
    ProxyConfig,
    Settings,
    parse_settings,
    proxy_token,
    watched_settings,
)
from trayapp.config.settings_file import load_settings, save_settings, settings_to_toml

OLLAMA = {"listen": "127.0.0.1:11435", "upstream": "http://127.0.0.1:11434", "kind": "ollama"}


def _parse(*entries: dict[str, object]) -> tuple[tuple[ProxyConfig, ...], list[str]]:
    settings, errors = parse_settings({"proxies": list(entries)})
    return settings.proxies, errors


def test_an_entry_parses_with_its_defaults() -> None:
    proxies, errors = _parse(OLLAMA)
    assert errors == []
    (proxy,) = proxies
    assert proxy == ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama")
    assert proxy.enabled and not proxy.allow_remote and proxy.token_env == "LLM_TRAY_TOKEN"
    assert (proxy.listen_host, proxy.listen_port) == ("127.0.0.1", 11435)
    assert proxy.client_url == "http://127.0.0.1:11435"
    assert not proxy.remote


def test_ipv6_and_localhost_listen_addresses() -> None:
    proxies, errors = _parse(
        {"listen": "[::1]:11436", "upstream": "http://127.0.0.1:8080"},
        {"listen": "localhost:11437", "upstream": "http://127.0.0.1:8080/"},
    )
    assert errors == []
    assert [p.client_url for p in proxies] == ["http://[::1]:11436", "http://localhost:11437"]
    assert proxies[1].upstream == "http://127.0.0.1:8080"  # the trailing slash goes
    assert proxies[0].kind is None  # OpenAI-compatible


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"listen": "127.0.0.1", "upstream": "http://127.0.0.1:1"}, "proxies[0].listen: expected HOST:PORT"),
        ({"listen": "127.0.0.1:abc", "upstream": "http://127.0.0.1:1"}, "expected HOST:PORT"),
        ({"listen": "127.0.0.1:0", "upstream": "http://127.0.0.1:1"}, "port 0 is out of range (1 to 65535)"),
        ({"listen": "127.0.0.1:70000", "upstream": "http://127.0.0.1:1"}, "port 70000 is out of range"),
        ({"listen": "my-box:8000", "upstream": "http://127.0.0.1:1"}, "'my-box' is not an IP address"),
        (
            {"listen": "127.0.0.1:9", "upstream": "https://127.0.0.1:1"},
            "proxies[0].upstream: expected http://",
        ),
        ({"listen": "127.0.0.1:9", "upstream": "127.0.0.1:11434"}, "proxies[0].upstream: expected http://"),
        ({"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:1/v1"}, "proxies[0].upstream: expected"),
        ({"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:99999"}, "proxies[0].upstream: bad port"),
        (
            {"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:1", "kind": "tgi"},
            "unknown server kind 'tgi'",
        ),
        (
            {"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:1", "enabled": "yes"},
            "expected true or false",
        ),
        ({"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:1", "port": 3}, "proxies[0].port: unknown"),
        ({"listen": "127.0.0.1:9"}, "proxies[0]: every proxy needs listen and upstream"),
        (
            {"listen": "127.0.0.1:9", "upstream": "http://127.0.0.1:1", "token_env": "MY-TOKEN"},
            "not an environment",
        ),
        ({"listen": "127.0.0.1:11434", "upstream": "http://localhost:11434"}, "would forward to itself"),
        (
            {"listen": "0.0.0.0:11435", "upstream": "http://127.0.0.1:11434"},
            "0.0.0.0 is not a loopback address: add allow_remote = true",
        ),
    ],
)
def test_a_bad_entry_is_reported_and_skipped(entry: dict[str, object], expected: str) -> None:
    proxies, errors = _parse(entry, OLLAMA)
    assert len(errors) == 1 and expected in errors[0], errors
    assert proxies == (ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama"),)


def test_a_token_in_the_file_is_refused_with_the_way_to_do_it() -> None:
    proxies, errors = _parse({**OLLAMA, "token": "s3cret-value"})
    assert proxies == ()
    assert len(errors) == 1 and "proxies[0].token" in errors[0] and "token_env" in errors[0]
    assert "s3cret-value" not in errors[0]


def test_the_same_listen_address_twice_keeps_the_first() -> None:
    second = {"listen": "localhost:11435", "upstream": "http://127.0.0.1:8080"}
    proxies, errors = _parse(OLLAMA, second)
    assert [p.upstream for p in proxies] == ["http://127.0.0.1:11434"]
    assert errors == ["proxies[1].listen: localhost:11435 is used by another proxy"]


def test_proxies_must_be_a_list_of_tables() -> None:
    settings, errors = parse_settings({"proxies": {"listen": "127.0.0.1:1"}})
    assert settings.proxies == () and errors == ["proxies: expected a list of [[proxies]] tables"]
    _, errors = _parse("127.0.0.1:11435")  # type: ignore[arg-type]
    assert errors == ["proxies[0]: every proxy needs listen and upstream"]


def test_remote_needs_a_token_from_the_environment() -> None:
    (remote,), errors = _parse(
        {
            "listen": "0.0.0.0:11435",
            "upstream": "http://127.0.0.1:11434",
            "allow_remote": True,
            "token_env": "T",
        }
    )
    assert errors == [] and remote.remote
    token, why = proxy_token(remote, {})
    assert token is None and why is not None
    assert "0.0.0.0:11435 is off" in why and "needs a token" in why and "T" in why
    assert proxy_token(remote, {"T": "abc"}) == ("abc", None)
    (local,), _ = _parse(OLLAMA)
    assert proxy_token(local, {}) == (None, None)  # loopback: no token needed
    assert proxy_token(local, {"LLM_TRAY_TOKEN": "xyz"}) == ("xyz", None)  # set: clients must send it
    assert proxy_token(local, {"LLM_TRAY_TOKEN": ""}) == (None, None)


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    settings = Settings(
        proxies=(
            ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama"),
            ProxyConfig("0.0.0.0:8081", "http://127.0.0.1:8080", allow_remote=True, token_env="PROXY_TOKEN"),
            ProxyConfig("[::1]:1235", "http://127.0.0.1:1234", kind="lmstudio", enabled=False),
        )
    )
    save_settings(settings, path)
    text = path.read_text()
    assert text.count("[[proxies]]") == 3 and 'listen = "127.0.0.1:11435"' in text
    loaded = load_settings(path)
    assert loaded.errors == () and loaded.backup_path is None
    assert loaded.settings == settings
    assert "[[proxies]]" not in settings_to_toml(Settings())  # none: no empty list written


def test_a_broken_entry_in_the_file_leaves_the_others_and_a_backup(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[[proxies]]\nlisten = "127.0.0.1:99999"\nupstream = "http://127.0.0.1:11434"\n'
        '[[proxies]]\nlisten = "127.0.0.1:8081"\nupstream = "http://127.0.0.1:8080"\ntoken = "s3cret"\n'
        '[[proxies]]\nlisten = "127.0.0.1:11435"\nupstream = "http://127.0.0.1:11434"\nkind = "ollama"\n'
    )
    loaded = load_settings(path)
    assert loaded.settings.proxies == (
        ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama"),
    )
    assert len(loaded.errors) == 2
    assert "proxies[0].listen: port 99999" in loaded.errors[0] and "proxies[1].token" in loaded.errors[1]
    assert loaded.backup_path is not None and "s3cret" not in loaded.backup_path.read_text()


def test_the_monitor_watches_each_enabled_upstream_once() -> None:
    settings = Settings(
        endpoints=(EndpointConfig(url="http://localhost:8080", kind="llamacpp"),),
        proxies=(
            ProxyConfig("127.0.0.1:11435", "http://127.0.0.1:11434", kind="ollama"),
            ProxyConfig("127.0.0.1:11436", "http://127.0.0.1:11434", kind="ollama"),  # same upstream
            ProxyConfig("127.0.0.1:8081", "http://127.0.0.1:8080"),  # already an endpoint
            ProxyConfig("127.0.0.1:1235", "http://127.0.0.1:1234", kind="lmstudio", enabled=False),
        ),
    )
    watched = watched_settings(settings)
    assert watched.endpoints == (
        EndpointConfig(url="http://localhost:8080", kind="llamacpp"),
        EndpointConfig(url="http://127.0.0.1:11434", kind="ollama"),
    )
    assert watched.proxies == settings.proxies
    assert watched_settings(Settings()) == Settings()
