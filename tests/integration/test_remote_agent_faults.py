"""`RemoteAgent.poll` against a fake agent on loopback: every failure becomes the machine's status
and reason (the request and its transport failures are sources/http.py's `fetch`, the HTTP statuses
mean what the agent says with them), and a bug in the poll is logged once with its traceback, shown
as "internal error", and polling goes on (#19, house-review §6 item 9).

The snapshot document is `snapshot_json` of a hand-made snapshot (tests/support/snapshots.py); the
`llm-tray agent` itself is tests/integration/test_remote_agents.py's.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.support import snapshots as s
from tests.support.fake_http import FakeServer, hang, json_reply, text_reply
from tests.support.memory_keyring import MemoryKeyring
from trayapp.config.agents import AgentConfig
from trayapp.core.jsonview import snapshot_json
from trayapp.sources import remote_agent
from trayapp.sources.remote_agent import RemoteAgent

DOC = snapshot_json(s.snap(1.0, s.server()))
NO_TOKEN = "none is stored in the OS keyring (Settings → Remote machines)"


def test_a_good_answer_carries_the_token_and_the_document(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOX_TOKEN", "tok-3")
    with FakeServer({"/v1/snapshot": json_reply(DOC)}) as fake:
        agent = RemoteAgent(AgentConfig(fake.url, "box", token_env="BOX_TOKEN"))
        try:
            result = agent.poll()
        finally:
            agent.close()
        (_, path, headers) = fake.requests[0]
    assert path == "/v1/snapshot"
    assert {k.lower(): v for k, v in headers.items()}["authorization"] == "Bearer tok-3"
    assert (result.machine.status, result.machine.reason) == ("ok", None)
    assert result.machine.t_wall_s == s.T0 + 1.0
    assert [server.machine for server in result.servers] == ["box"]


@pytest.mark.parametrize(
    ("reply", "status", "reason"),
    [
        (json_reply({"error": "no snapshot yet"}, 503), "loading", "the agent has no snapshot yet"),
        (json_reply({"error": "boom"}, 500), "error", "HTTP 500 from the agent"),
        (json_reply({"error": "forbidden"}, 403), "error", "HTTP 403 from the agent"),
        (
            json_reply({"error": "unauthorized"}, 401),
            "unauthorized",
            f"the agent wants a token (401): {NO_TOKEN}",
        ),
        (
            text_reply("<html>"),
            "error",
            "not a snapshot document: invalid JSON (Expecting value at char 0)",
        ),
        (
            json_reply({"schema": 2}),
            "error",
            "not a snapshot document: schema 2: this version reads schema 1",
        ),
        (hang, "error", "/v1/snapshot: no answer within 0.5 s (hung?)"),
    ],
)
def test_each_failed_answer_becomes_the_machines_status(
    memory_keyring: MemoryKeyring, reply: Any, status: str, reason: str
) -> None:
    with FakeServer({"/v1/snapshot": reply}) as fake:
        agent = RemoteAgent(AgentConfig(fake.url, "box"), timeout_s=0.5)
        try:
            machine = agent.poll().machine
        finally:
            agent.close()
    assert (machine.status, machine.reason) == (status, reason)
    assert machine.hardware is None


def test_an_agent_that_is_not_running_is_unreachable_with_the_hint(memory_keyring: MemoryKeyring) -> None:
    with FakeServer() as fake:
        url = fake.url
    agent = RemoteAgent(AgentConfig(url, "box"))  # nothing listens there any more
    try:
        machine = agent.poll().machine
    finally:
        agent.close()
    assert machine.status == "unreachable"
    assert (machine.reason or "").startswith("connection refused or unreachable ("), machine.reason
    assert (machine.reason or "").endswith(" — is `llm-tray agent` running there?"), machine.reason


def test_the_agents_token_never_goes_through_an_environment_proxy(memory_keyring: MemoryKeyring) -> None:
    agent = RemoteAgent(AgentConfig("http://gpu-box:9465", "box"))
    try:
        assert agent._client.trust_env is False  # HTTP(S)_PROXY, .netrc: none of them
    finally:
        agent.close()


def _broken_parser(doc: Any) -> Any:
    fields: dict[str, Any] = {}
    return fields["servers"]  # a KeyError, as an unpack bug in the parser would raise


def test_a_bug_in_the_agent_poll_is_logged_once_and_shown(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trayapp")
    with FakeServer({"/v1/snapshot": json_reply(DOC)}) as fake:
        agent = RemoteAgent(AgentConfig(fake.url, "box"))
        try:
            assert agent.poll().machine.status == "ok"
            with monkeypatch.context() as patch:
                patch.setattr(remote_agent, "snapshot_from_json", _broken_parser)
                broken = [agent.poll().machine for _ in range(2)]
            healed = agent.poll()
        finally:
            agent.close()
    assert [m.status for m in broken] == ["error", "error"]
    assert [m.reason for m in broken] == ["internal error: KeyError: 'servers'"] * 2
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], KeyError)]
    assert len(logged) == 1, [r.getMessage() for r in logged]  # two polls, one traceback
    assert logged[0].getMessage() == "agent box: poll: internal error (logged once)"
    assert "_broken_parser" in caplog.text  # the traceback names the function that failed
    assert healed.machine.status == "ok" and healed.servers  # polling went on
