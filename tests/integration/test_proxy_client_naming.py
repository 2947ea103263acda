"""Naming a burst of loopback clients (#22, #26): real sockets of this process, the kernel's sock_diag
and /proc; the lookups of a burst go together."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Iterable

import psutil
import pytest

from trayapp.services.proxy import clients
from trayapp.services.proxy.clients import ClientNamer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag and /proc: Linux")
def test_a_burst_of_connections_is_named_in_one_pass_over_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 clients connecting at once (this process) are each named this process; their lookups go
    together: at most two passes over the processes' descriptors (the first alone, the rest in one),
    not 20 (issue #26: one each was a fifth of the proxy's CPU at 50 streams, holding the GIL)."""
    passes: list[int] = []
    real_holders = clients._holders

    def counted(inodes: set[int], first_pids: Iterable[int]) -> dict[int, int]:
        passes.append(len(inodes))
        return real_holders(inodes, first_pids)

    monkeypatch.setattr(clients, "_holders", counted)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(32)
        local = listener.getsockname()
        conns = [socket.create_connection(local) for _ in range(20)]
        try:
            if clients._inode_of(conns[0].getsockname(), local) is None:
                pytest.skip("sock_diag refused here")
            namer = ClientNamer()

            async def name_all() -> list[clients.Named]:
                asks = [namer.name(conn.getsockname(), local[1], "curl/8.5", local) for conn in conns]
                return list(await asyncio.gather(*asks))

            named = asyncio.run(name_all())
        finally:
            for conn in conns:
                conn.close()
    me = psutil.Process().name()
    assert named == [(me, os.getpid())] * 20
    assert sum(passes) == 20 and len(passes) <= 2, passes
