"""`[[agents]]` in the config file (config/agents.py, #15): good entries load, a bad one is reported
by key path and skipped, tokens never go in the file, and the section survives a save."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trayapp.config.agents import AgentConfig, agent_keyring_user
from trayapp.config.settings import Settings, parse_settings
from trayapp.config.settings_file import load_settings, save_settings


def agents_of(toml: str) -> tuple[tuple[AgentConfig, ...], list[str]]:
    settings, errors = parse_settings(tomllib.loads(toml))
    return settings.agents, errors


def test_entries_with_and_without_a_name() -> None:
    agents, errors = agents_of(
        '[[agents]]\nurl = "http://gpu-box:9465/"\n'
        '[[agents]]\nurl = "https://10.0.0.9:9466"\nname = "rack-2"\ntoken_env = "RACK2_TOKEN"\n'
    )
    assert errors == []
    assert agents == (
        AgentConfig(url="http://gpu-box:9465", name="gpu-box"),  # the host part; trailing slash dropped
        AgentConfig(url="https://10.0.0.9:9466", name="rack-2", token_env="RACK2_TOKEN"),
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('name = "box"', "agents[0].url: every agent needs a url"),
        ('url = "gpu-box:9465"', "agents[0].url: expected http://HOST:PORT"),
        ('url = "ftp://gpu-box:9465"', "agents[0].url: expected http://HOST:PORT"),
        ('url = "http://gpu-box"', "agents[0].url: expected http://HOST:PORT"),  # no port
        ('url = "http://gpu-box:9465/v1/snapshot"', "agents[0].url: expected http://HOST:PORT"),
        ('url = "http://user:pw@gpu-box:9465"', "agents[0].url: expected http://HOST:PORT"),
        ('url = "http://gpu-box:99999"', "agents[0].url: bad port"),
        ('url = "http://[::1]:9465"', "agents[0].name: '::1' is not a machine name"),  # a name is needed
        ('url = "http://box:9465"\nname = "my box"', "agents[0].name: 'my box' is not a machine name"),
        ('url = "http://box:9465"\nname = ""', "agents[0].name: '' is not a machine name"),
        ('url = "http://box:9465"\ntoken = "s3cret"', "agents[0].token: tokens never go in the config file"),
        ('url = "http://box:9465"\ntoken_env = "1BAD"', "agents[0].token_env: '1BAD' is not"),
        ('url = "http://box:9465"\nport = 3', "agents[0].port: unknown setting"),
        ("url = 9465", "agents[0].url: expected a string"),
    ],
)
def test_a_bad_entry_says_where_and_what(entry: str, message: str) -> None:
    agents, errors = agents_of(f"[[agents]]\n{entry}\n")
    assert agents == ()
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_a_bad_entry_does_not_take_the_others_with_it() -> None:
    agents, errors = agents_of(
        '[[agents]]\nurl = "http://a:1"\n[[agents]]\nurl = "nonsense"\n[[agents]]\nurl = "http://b:2"\n'
    )
    assert [a.name for a in agents] == ["a", "b"]
    assert len(errors) == 1 and errors[0].startswith("agents[1].url")


def test_two_machines_cannot_share_a_name() -> None:
    agents, errors = agents_of(
        '[[agents]]\nurl = "http://127.0.0.1:9001"\n[[agents]]\nurl = "http://127.0.0.1:9002"\n'
    )
    assert agents == (AgentConfig(url="http://127.0.0.1:9001", name="127.0.0.1"),)
    assert errors == ["agents[1].name: '127.0.0.1' names another agent too: give each a name of its own"]


def test_not_a_list() -> None:
    agents, errors = agents_of('agents = "http://a:1"\n')
    assert agents == () and errors == ["agents: expected a list of [[agents]] tables"]


def test_saved_and_loaded_again(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    settings = Settings(agents=(AgentConfig(url="http://gpu-box:9465", name="gpu", token_env="GPU_TOKEN"),))
    save_settings(settings, path)
    loaded = load_settings(path)
    assert loaded.errors == () and loaded.settings.agents == settings.agents
    save_settings(Settings(), path)
    assert "agents" not in path.read_text()  # no empty section


def test_the_keyring_entry_is_not_an_endpoints() -> None:
    assert agent_keyring_user("http://gpu-box:9465") == "agent http://gpu-box:9465"
