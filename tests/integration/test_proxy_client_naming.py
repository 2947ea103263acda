"""Naming a burst of loopback clients (#22, #26): real sockets of this process, the kernel's sock_diag
and /proc; the lookups of a burst go together."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.proxy import running_proxy
from trayapp.services.proxy import clients
from trayapp.services.proxy.clients import ClientNamer
from trayapp.sources import socket_owners

pytestmark = pytest.mark.usefixtures("each_event_loop")  # each test on uvloop and on asyncio


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_burst_of_connections_is_named_in_one_pass_over_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 clients connecting at once (this process) are each named this process; their lookups go
    together: at most two passes over the processes' descriptors on a worker thread (the first alone,
    the rest in one), not 20 (issue #26: one each was a fifth of the proxy's CPU at 50 streams,
    holding the GIL). The next burst from the same process (now the last client) is named on the
    event loop from that process's descriptors alone: no thread, no pass over /proc."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {})  # this process has never been a client
    passes: list[int] = []
    real_holders = socket_owners._holders

    def counted(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
        passes.append(len(inodes))
        return real_holders(inodes, first_pids)

    monkeypatch.setattr(socket_owners, "_holders", counted)
    first = _name_a_burst(20)
    after_first = list(passes)
    second = _name_a_burst(20)
    me = (psutil.Process().name(), os.getpid())
    assert first.names == second.names == [me] * 20
    assert sum(after_first) == 20 and len(after_first) <= 2, after_first
    assert passes == after_first  # the second burst: no pass over /proc
    assert second.threads == {second.loop_thread}  # its descriptors read on the event loop


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_last_client_with_many_descriptors_is_looked_up_on_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The event loop reads at most QUICK_LOOKUP_MAX_FDS of the last client's descriptors: past that the
    lookup goes to a worker thread, as for a new client."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {os.getpid(): None})  # the last client: this process
    monkeypatch.setattr(socket_owners, "QUICK_LOOKUP_MAX_FDS", 1)  # it has more descriptors than that
    burst = _name_a_burst(5)
    assert burst.names == [(psutil.Process().name(), os.getpid())] * 5
    assert burst.threads and burst.loop_thread not in burst.threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_burst_named_one_by_one_reads_the_last_clients_descriptors_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 connections of the last client named one after another (each stream's lookup begins at its
    first text, so a burst's come one by one) read that process's descriptors once, not 20 times; a
    socket it opens afterwards is not among those read, and is found by a new pass."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {os.getpid(): None})  # the last client: this process
    monkeypatch.setattr(socket_owners, "_LAST_CLIENT_SOCKETS", socket_owners._SocketsSeen())
    monkeypatch.setattr(socket_owners, "LAST_CLIENT_SOCKETS_KEPT_S", 60.0)  # one pass for both bursts below
    passes: list[int] = []
    real_socket_inodes = socket_owners._socket_inodes

    def counted(pid: int, fds: list[str]) -> list[int]:
        passes.append(pid)
        return real_socket_inodes(pid, fds)

    monkeypatch.setattr(socket_owners, "_socket_inodes", counted)
    me = (psutil.Process().name(), os.getpid())
    assert _name_a_burst(20, one_by_one=True).names == [me] * 20
    assert passes == [os.getpid()]
    assert _name_a_burst(3, one_by_one=True).names == [me] * 3  # new sockets: not in the pass kept
    assert passes == [os.getpid()] * 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
@pytest.mark.parametrize("recent_client", [False, True], ids=["new client", "the last client"])
@pytest.mark.parametrize("closed", ["client end closed", "both ends reset"])
def test_a_client_gone_before_its_lookup_is_named_by_its_user_agent_without_a_scan(
    monkeypatch: pytest.MonkeyPatch, recent_client: bool, closed: str
) -> None:
    """A short answer is read and the socket closed before its lookup runs: no process holds that
    socket (FIN_WAIT2 or TIME_WAIT, the kernel's inode 0, or none at all after a reset), so no pass
    over /proc can find one. The client is named by its User-Agent at once, with no scan (each was a
    pass over every process's descriptors on a worker thread, holding the GIL, a request)."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {os.getpid(): None} if recent_client else {})
    passes: list[object] = []
    real_holders = socket_owners._holders

    def holders(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
        if inodes:  # a pass looking for a socket
            passes.append(inodes)
        return real_holders(inodes, first_pids)

    monkeypatch.setattr(socket_owners, "_holders", holders)
    monkeypatch.setattr(socket_owners, "scan", lambda port: passes.append(port) or {})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        local = listener.getsockname()
        client = socket.create_connection(local)
        peer = client.getsockname()
        served, _ = listener.accept()
        if socket_owners.inodes_of([(peer, local)]) == [None]:
            pytest.skip("sock_diag refused here")
        if closed == "both ends reset":
            for end in (client, served):  # SO_LINGER 0: closed with a reset, no TIME_WAIT left
                end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            served.close()
        else:
            client.close()  # the proxy's end still open: the client's socket waits in FIN_WAIT2
        try:
            assert socket_owners.inodes_of([(peer, local)]) == [0]

            async def name() -> clients.Named:
                return await asyncio.wait_for(ClientNamer().name(peer, local[1], "aider/0.86", local), 10)

            named = asyncio.run(name())
        finally:
            served.close()
    assert named == ("aider", None)
    assert passes == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_client_closing_during_the_pass_over_proc_is_not_called_another_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The socket was there when looked up, and its client closed it while the descriptors were read:
    no process holds it, yet it is not another user's process (as records said of ~1 % of short
    answers read and closed at once). Asked again, the socket is gone: named by its User-Agent."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {})  # a new client: looked up on a worker thread
    real_holders = socket_owners._holders
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        local = listener.getsockname()
        client = socket.create_connection(local)
        peer = client.getsockname()
        served, _ = listener.accept()

        def closing_meanwhile(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
            client.close()  # the client reads its short answer and hangs up during the pass
            return real_holders(inodes, first_pids)

        monkeypatch.setattr(socket_owners, "_holders", closing_meanwhile)
        try:
            if socket_owners.inodes_of([(peer, local)]) == [None]:
                pytest.skip("sock_diag refused here")

            async def name() -> clients.Named:
                return await asyncio.wait_for(ClientNamer().name(peer, local[1], "aider/0.86", local), 10)

            named = asyncio.run(name())
        finally:
            client.close()
            served.close()
    assert named == ("aider", None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_new_client_process_is_found_among_the_newest_processes_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A client never seen before is most often a process just started (a script, a `curl`): the pass
    over /proc reads the newest processes first and finds it after a few, where from the oldest it
    came after every process of the machine (~70 here, hundreds on a desktop: each descriptor a
    readlink, on a worker thread holding the GIL in turns with the proxy's event loop). A recent
    client that has exited is dropped from those looked at first."""
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    gone_pid = int(exited.stdout)  # a client that has exited since: not looked at first any more
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {gone_pid: None})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        local = listener.getsockname()
        ready = tmp_path / "port"
        child = subprocess.Popen(  # a client process just started, holding a connection to the listener
            [
                sys.executable,
                "-c",
                "import socket, sys, pathlib; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
                "pathlib.Path(sys.argv[2]).write_text(str(s.getsockname()[1])); sys.stdin.read()",
                str(local[1]),
                str(ready),
            ],
            stdin=subprocess.PIPE,
        )
        try:
            served, _ = listener.accept()
            with served:
                for _ in range(1000):  # the child writes its port right after connecting
                    if ready.exists() and ready.read_text():
                        break
                    time.sleep(0.01)
                peer = ("127.0.0.1", int(ready.read_text()))
                (inode,) = socket_owners.inodes_of([(peer, local)])
                if inode is None:
                    pytest.skip("sock_diag refused here")
                read: list[int] = []
                real_sockets_among = socket_owners._sockets_among

                def counted(pid: int, fds: list[str], wanted: set[int]) -> list[int]:
                    read.append(pid)
                    return real_sockets_among(pid, fds, wanted)

                with _patched(socket_owners, "_sockets_among", counted):
                    holders = socket_owners._holders({inode}, [gone_pid])
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(10)
    assert holders == {inode: child.pid}
    assert gone_pid not in socket_owners._RECENT_PIDS
    assert read[-1] == child.pid
    assert len(read) <= 16, read  # the child among the newest few (a busy host starts others too)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_client_whose_process_is_gone_when_its_name_is_read_is_named_by_its_user_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its socket is found held by its process, which exits before its name is read (a `curl` that
    read a short answer, as used through the tray): named by its User-Agent, its pid kept (it was
    "pid N")."""
    monkeypatch.setattr(socket_owners, "_RECENT_PIDS", {os.getpid(): None})  # the last client: this process
    monkeypatch.setattr(clients, "_process_name", lambda pid: None)  # gone when its name is read
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        local = listener.getsockname()
        with socket.create_connection(local) as client:
            served, _ = listener.accept()
            with served:
                peer = client.getsockname()
                if socket_owners.inodes_of([(peer, local)]) == [None]:
                    pytest.skip("sock_diag refused here")

                async def name() -> clients.Named:
                    return await asyncio.wait_for(ClientNamer().name(peer, local[1], "curl/8.5.0", local), 10)

                named = asyncio.run(name())
    assert named == ("curl", os.getpid())


@dataclass
class _Burst:
    names: list[clients.Named]
    threads: set[int]  # the threads that read a process's descriptors for these names
    loop_thread: int


def _name_a_burst(count: int, one_by_one: bool = False) -> _Burst:
    """Name `count` connections of this process, asked together (one batch) or `one_by_one` (each
    asked once the one before is named: one batch each, as a burst's streams reach their first text)."""
    threads: set[int] = set()
    real_sockets_among, real_socket_inodes = socket_owners._sockets_among, socket_owners._socket_inodes

    def watched(pid: int, fds: list[str], wanted: set[int]) -> list[int]:
        threads.add(threading.get_ident())
        return real_sockets_among(pid, fds, wanted)

    def watched_all(pid: int, fds: list[str]) -> list[int]:
        threads.add(threading.get_ident())
        return real_socket_inodes(pid, fds)

    with (
        socket.socket() as listener,
        _patched(socket_owners, "_sockets_among", watched),
        _patched(socket_owners, "_socket_inodes", watched_all),
    ):
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        local = listener.getsockname()
        conns = [socket.create_connection(local) for _ in range(count)]
        try:
            if socket_owners.inodes_of([(conns[0].getsockname(), local)]) == [None]:
                pytest.skip("sock_diag refused here")
            namer = ClientNamer()

            async def name_all() -> list[clients.Named]:
                if one_by_one:
                    return [
                        await namer.name(conn.getsockname(), local[1], "curl/8.5", local) for conn in conns
                    ]
                asks = [namer.name(conn.getsockname(), local[1], "curl/8.5", local) for conn in conns]
                return list(await asyncio.gather(*asks))

            names = asyncio.run(name_all())
        finally:
            for conn in conns:
                conn.close()
    return _Burst(names, threads, threading.get_ident())


@contextmanager
def _patched(owner: object, name: str, value: object) -> Iterator[None]:
    real = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, real)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_client_that_hangs_up_before_any_answer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's lookup waits for the answer's first bytes (nothing stands before them), but never
    longer than limits.NAME_CLIENT_AFTER_S: a client that gives up while the server still reads its
    prompt (no byte of answer yet) is named in its record, which says it was aborted."""
    named = threading.Event()
    real_name = ClientNamer.name

    async def spied(self: ClientNamer, *args: object, **kwargs: object) -> clients.Named:
        found = await real_name(self, *args, **kwargs)  # type: ignore[arg-type]
        named.set()
        return found

    monkeypatch.setattr(ClientNamer, "name", spied)
    with _silent_upstream() as upstream, running_proxy(upstream.url) as proxy:
        body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        host, port = proxy.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
            )
            assert upstream.got_request.wait(10)  # the request went up; the upstream never answers
            assert named.wait(10)  # looked up while the client waits
        (record,) = proxy.records.wait_for(1)
    assert record.aborted and record.http_status is None
    assert (record.client_name, record.client_pid) == (psutil.Process().name(), os.getpid())


@dataclass
class _SilentUpstream:
    url: str
    got_request: threading.Event


@contextmanager
def _silent_upstream() -> Iterator[_SilentUpstream]:
    """A loopback upstream that reads a request and never answers (a server reading a long prompt)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    upstream = _SilentUpstream(f"http://127.0.0.1:{server.getsockname()[1]}", threading.Event())
    done = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError), server.accept()[0] as conn:
            conn.settimeout(10)
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(65536)
            upstream.got_request.set()
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield upstream
    finally:
        done.set()
        thread.join(10)
        server.close()
