"""`status`, `watch` and `bar` on an agent's own box send its token (#15): $LLM_TRAY_TOKEN, else the
token file `llm-tray agent --new-token` wrote under this test's LLM_TRAY_HOME."""

from __future__ import annotations

from trayapp.cli.agent import agent_token, write_new_token
from trayapp.config import paths
from trayapp.sinks.sampler_file import auth_headers


def test_no_token_no_header() -> None:
    assert auth_headers({}) == {}


def test_the_agents_token_file_is_used_when_no_variable_is_set() -> None:
    path = write_new_token()
    assert path == paths.agent_token_file()
    token, source = agent_token({})
    assert token and source == str(path)
    assert auth_headers({}) == {"Authorization": f"Bearer {token}"}  # what the agent requires
    assert auth_headers({"LLM_TRAY_TOKEN": "from-env"}) == {"Authorization": "Bearer from-env"}
