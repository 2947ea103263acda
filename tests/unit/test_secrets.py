"""API keys: OS keyring or a named environment variable, never a file; clear messages otherwise."""

from __future__ import annotations

import keyring
import pytest
from keyring.backends import fail

from tests.support.memory_keyring import MemoryKeyring
from trayapp.config.agents import AgentConfig
from trayapp.sources import secrets
from trayapp.sources.remote_agent import agent_token, store_agent_token


@pytest.fixture
def no_keyring():  # type: ignore[no-untyped-def]
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())  # what a headless Linux box without Secret Service has
    try:
        yield
    finally:
        keyring.set_keyring(previous)


URL = "http://127.0.0.1:8080"


def test_key_round_trips_through_the_keyring(memory_keyring: MemoryKeyring, tmp_path) -> None:
    secrets.store_api_key(URL, "sk-local-123")
    assert memory_keyring.store[("llm-tray", URL)] == "sk-local-123"
    assert secrets.resolve_api_key(URL, api_key_env=None, use_keyring=True) == ("sk-local-123", None)
    secrets.delete_api_key(URL)
    key, why = secrets.resolve_api_key(URL, api_key_env=None, use_keyring=True)
    assert key is None and why is not None and "no key stored" in why


def test_without_a_keyring_backend_storing_fails_with_the_alternative(no_keyring: None) -> None:
    with pytest.raises(secrets.SecretStoreError) as caught:
        secrets.store_api_key(URL, "sk-local-123")
    message = str(caught.value)
    assert "no OS keyring" in message and "api_key_env" in message
    key, why = secrets.resolve_api_key(URL, api_key_env=None, use_keyring=True)
    assert key is None and why is not None and "api_key_env" in why


def test_environment_variable_wins_and_is_named_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_TEST_KEY", "from-env")
    assert secrets.resolve_api_key(URL, api_key_env="LLAMA_TEST_KEY", use_keyring=False) == ("from-env", None)
    monkeypatch.delenv("LLAMA_TEST_KEY")
    key, why = secrets.resolve_api_key(URL, api_key_env="LLAMA_TEST_KEY", use_keyring=False)
    assert key is None and why == "environment variable LLAMA_TEST_KEY is not set"


def test_no_key_configured_is_not_an_error() -> None:
    assert secrets.resolve_api_key(URL, api_key_env=None, use_keyring=False) == (None, None)


def test_read_secret_says_why_in_the_callers_words(memory_keyring: MemoryKeyring, no_keyring: None) -> None:
    words = {"no_backend": "no keyring, use an env var", "not_stored": "nothing saved"}
    assert secrets.read_secret("agent http://box:9465", **words) == (None, "no keyring, use an env var")
    keyring.set_keyring(memory_keyring)  # the fixtures restore the previous backend
    assert secrets.read_secret("agent http://box:9465", **words) == (None, "nothing saved")
    memory_keyring.store[("llm-tray", "agent http://box:9465")] = "tok-1"
    assert secrets.read_secret("agent http://box:9465", **words) == ("tok-1", "")


def test_an_agent_token_comes_through_secrets_with_the_agents_wording(
    memory_keyring: MemoryKeyring, no_keyring: None
) -> None:
    agent = AgentConfig("http://box:9465", "box", token_env="BOX_TOKEN")
    assert agent_token(agent, {"BOX_TOKEN": "from-env"}) == ("from-env", "")
    assert agent_token(agent, {}) == (
        None,
        "$BOX_TOKEN is not set; no OS keyring here (name an environment variable with token_env)",
    )
    keyring.set_keyring(memory_keyring)
    assert agent_token(agent, {}) == (
        None,
        "$BOX_TOKEN is not set; none is stored in the OS keyring (Settings → Remote machines)",
    )
    store_agent_token("http://box:9465", "tok-2")
    assert memory_keyring.store == {("llm-tray", "agent http://box:9465"): "tok-2"}
    assert agent_token(agent, {}) == ("tok-2", "")
