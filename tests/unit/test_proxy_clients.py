"""Who sent a proxied request (#22) when no loopback process can be asked: the User-Agent's product
token; and a client that is another user's process. (The loopback case, with real processes, is
tests/integration/test_proxy_queue_wait.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from trayapp.core.model import FinishedRequest
from trayapp.services.proxy import clients
from trayapp.services.proxy.clients import OTHER_USER, ClientNamer, user_agent_product
from trayapp.sources import socket_owners


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


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async def polled() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(polled(), timeout_s)


def named_once(*args: object) -> clients.Named:
    async def ask() -> clients.Named:
        return await ClientNamer().name(*args)  # type: ignore[arg-type]

    return asyncio.run(ask())


def test_a_remote_client_is_named_by_its_user_agent_without_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scan(port: int) -> dict[int, int | None]:
        raise AssertionError("a remote peer needs no scan of this machine's sockets")

    monkeypatch.setattr(socket_owners, "scan", no_scan)
    named = named_once(("192.168.1.20", 51234), 8081, "aider/0.86")
    assert named == ("aider", None)


def test_a_loopback_client_of_another_user_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket_owners, "scan", lambda port: {51234: None})  # psutil gave no pid: not ours
    named = named_once(("127.0.0.1", 51234), 8081, "aider/0.86")
    assert named == (OTHER_USER, None)


def test_a_loopback_client_the_scan_did_not_see_falls_back_to_its_user_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans: list[int] = []

    def scan(port: int) -> dict[int, int | None]:
        scans.append(port)
        return {}

    monkeypatch.setattr(socket_owners, "scan", scan)
    named = named_once(("::1", 40000, 0, 0), 8081, "curl/8.5")
    assert named == ("curl", None) and scans == [8081]


@pytest.mark.parametrize(("user_agent", "expected"), [("curl/8.5.0", "curl"), (None, "pid 4242")])
def test_a_client_gone_before_its_name_is_read_is_named_by_its_user_agent(
    monkeypatch: pytest.MonkeyPatch, user_agent: str | None, expected: str
) -> None:
    """Its socket was found held by pid 4242, which exited before its name was read (a `curl` that
    read its short answer): the request's User-Agent names it (it was "pid 4242"), the pid kept."""
    monkeypatch.setattr(socket_owners, "scan", lambda port: {51234: 4242})
    monkeypatch.setattr(clients, "_process_name", lambda pid: None)  # psutil: no such process
    assert named_once(("127.0.0.1", 51234), 8081, user_agent) == (expected, 4242)


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


def test_a_record_waits_for_its_clients_name_at_most_client_name_wait_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record goes out named once its name comes, or unnamed once CLIENT_NAME_WAIT_S passed (its
    lookup given up), whichever is first; one waiting never holds back another."""
    monkeypatch.setattr(clients, "CLIENT_NAME_WAIT_S", 0.3)
    emitted: list[FinishedRequest] = []

    async def run() -> asyncio.Future[clients.Named]:
        records = clients.NamedRecords(emitted.append)
        loop = asyncio.get_running_loop()
        never: asyncio.Future[clients.Named] = loop.create_future()
        later: asyncio.Future[clients.Named] = loop.create_future()
        records.hand_on(FinishedRequest(model="a", finished_wall_s=1.0), never)
        records.hand_on(FinishedRequest(model="b", finished_wall_s=2.0), later)
        assert emitted == []  # both wait
        later.set_result(("aider", 4242))
        await until(lambda: len(emitted) == 1)
        assert [(r.model, r.client_name, r.client_pid) for r in emitted] == [("b", "aider", 4242)]
        await until(lambda: len(emitted) == 2)  # the other given up by its own timer, before any close
        await records.close()
        return never

    never = asyncio.run(run())
    assert [(r.model, r.client_name) for r in emitted] == [("b", "aider"), ("a", None)]
    assert never.cancelled()


@pytest.mark.parametrize(("kept_s", "expected"), [(30.0, ["aider", "aider"]), (-1.0, ["aider", "bash"])])
def test_a_clients_name_is_kept_for_a_while_then_read_again(
    monkeypatch: pytest.MonkeyPatch, kept_s: float, expected: list[str]
) -> None:
    """A pid's process name is cached for NAME_KEPT_S: past it, the pid may be another process's."""
    names = iter(["aider", "bash"])
    monkeypatch.setattr(socket_owners, "scan", lambda port: {51234: 4242})
    monkeypatch.setattr(clients, "_process_name", lambda pid: next(names))
    monkeypatch.setattr(clients, "NAME_KEPT_S", kept_s)
    namer = ClientNamer()

    async def twice() -> list[clients.Named]:
        return [await namer.name(("127.0.0.1", 51234), 8081, None) for _ in range(2)]

    assert asyncio.run(twice()) == [(name, 4242) for name in expected]


def test_a_burst_of_clients_from_one_process_reads_its_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def process_name(pid: int) -> str:
        reads.append(pid)
        return "aider"

    monkeypatch.setattr(socket_owners, "scan", lambda port: {port: 4242 for port in range(51000, 51005)})
    monkeypatch.setattr(clients, "_process_name", process_name)
    namer = ClientNamer()

    async def burst() -> list[clients.Named]:
        asks = [namer.name(("127.0.0.1", port), 8081, None) for port in range(51000, 51005)]
        return list(await asyncio.gather(*asks))

    assert asyncio.run(burst()) == [("aider", 4242)] * 5
    assert reads == [4242]


def test_a_failing_socket_lookup_fails_the_name_it_was_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the batch lookup reaches each name asked in it (NamedRecords then logs it once and
    hands the record on unnamed), rather than leaving the name unanswered."""

    def broken(pairs: object) -> None:
        raise RuntimeError("a bug in the lookup")

    monkeypatch.setattr(socket_owners, "owners_if_the_last_client", broken)

    async def ask() -> clients.Named:
        return await ClientNamer().name(("127.0.0.1", 51234), 8081, None, ("127.0.0.1", 8081))

    with pytest.raises(RuntimeError, match="a bug in the lookup"):
        asyncio.run(ask())


@pytest.mark.parametrize(
    ("pids", "last_pid", "expected"),
    [
        ([5, 300, 90, 101, 7], 100, [90, 7, 5, 300, 101]),  # wrapped: 101 and 300 are older than 5
        ([5, 300, 90, 101, 7], 300, [300, 101, 90, 7, 5]),  # not wrapped: the highest is the newest
        ([], 10, []),
    ],
)
def test_processes_are_read_newest_first_across_a_pid_wrap(
    pids: list[int], last_pid: int, expected: list[int]
) -> None:
    assert socket_owners.newest_first(pids, last_pid) == expected
