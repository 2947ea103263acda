"""Who sent a proxied request (#22) when no loopback process can be asked: the User-Agent's product
token; and a client that is another user's process. (The loopback case, with real processes, is
tests/integration/test_proxy_queue_wait.py.)"""

from __future__ import annotations

import asyncio
import logging

import pytest

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy import clients
from trayapp.services.proxy.clients import OTHER_USER, ClientNamer, user_agent_product


@pytest.mark.parametrize(
    ("user_agent", "product"),
    [
        ("aider/0.86.1 python-httpx/0.28", "aider"),
        ("Mozilla/5.0 (X11; Linux x86_64)", "Mozilla"),
        ("  continue-dev  ", "continue-dev"),
        ("", None),
        (None, None),
        ("(no product)", None),
    ],
)
def test_the_user_agents_product_token(user_agent: str | None, product: str | None) -> None:
    assert user_agent_product(user_agent) == product


def test_a_remote_client_is_named_by_its_user_agent_without_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scan(port: int) -> dict[int, int | None]:
        raise AssertionError("a remote peer needs no scan of this machine's sockets")

    monkeypatch.setattr(clients, "_scan", no_scan)
    named = asyncio.run(ClientNamer().name(("192.168.1.20", 51234), 8081, "aider/0.86"))
    assert named == ("aider", None)


def test_a_loopback_client_of_another_user_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "_scan", lambda port: {51234: None})  # psutil gave no pid: not ours
    named = asyncio.run(ClientNamer().name(("127.0.0.1", 51234), 8081, "aider/0.86"))
    assert named == (OTHER_USER, None)


def test_a_loopback_client_the_scan_did_not_see_falls_back_to_its_user_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans: list[int] = []

    def scan(port: int) -> dict[int, int | None]:
        scans.append(port)
        return {}

    monkeypatch.setattr(clients, "_scan", scan)
    named = asyncio.run(ClientNamer().name(("::1", 40000, 0, 0), 8081, "curl/8.5"))
    assert named == ("curl", None) and scans == [8081]


def test_a_bug_in_the_naming_is_logged_once_and_the_record_goes_out_unnamed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A naming that fails (a bug, not a timeout) still hands every record on, unnamed; the bug's
    traceback is logged once, not swallowed (it was: `except (TimeoutError, Exception)`)."""
    emitted: list[FinishedRequest] = []

    async def run() -> None:
        named = clients.NamedRecords(emitted.append)
        loop = asyncio.get_running_loop()
        for i in range(2):
            naming: asyncio.Future[clients.Named] = loop.create_future()
            naming.set_exception(RuntimeError("a bug in the naming"))
            named.hand_on(FinishedRequest(model="m", finished_wall_s=float(i)), naming)
        await named.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert [(r.model, r.client_name) for r in emitted] == [("m", None), ("m", None)]
    bugs = [r for r in caplog.records if "proxy client naming" in r.getMessage()]
    assert len(bugs) == 1 and bugs[0].exc_info is not None


@pytest.mark.parametrize(("kept_s", "expected"), [(30.0, ["aider", "aider"]), (-1.0, ["aider", "bash"])])
def test_a_clients_name_is_kept_for_a_while_then_read_again(
    monkeypatch: pytest.MonkeyPatch, kept_s: float, expected: list[str]
) -> None:
    """A pid's process name is cached for NAME_KEPT_S: past it, the pid may be another process's."""
    names = iter(["aider", "bash"])
    monkeypatch.setattr(clients, "_scan", lambda port: {51234: 4242})
    monkeypatch.setattr(clients, "_process_name", lambda pid: next(names))
    monkeypatch.setattr(clients, "NAME_KEPT_S", kept_s)
    namer = ClientNamer()

    async def twice() -> list[clients.Named]:
        return [await namer.name(("127.0.0.1", 51234), 8081, None) for _ in range(2)]

    assert asyncio.run(twice()) == [(name, 4242) for name in expected]
