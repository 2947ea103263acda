"""The proxy's slots at the cap (services/proxy/admission.py), over real loopback sockets: a waiting
connection whose request bytes have arrived keeps its slot, an idle one gives it up, and a new
connection is refused when none can. The burst case this guards against was seen beside a busy
neighbour (tests/integration/test_soak.py): 8 % of well-behaved clients closed unanswered."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from trayapp.services.proxy.admission import Slots
from trayapp.sinks.listener import kernel_bytes_waiting

pytestmark = pytest.mark.usefixtures("each_event_loop")  # each test on uvloop and on asyncio


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for ours, theirs in made:
        ours.close()
        theirs.close()


def _pair(pairs: list[tuple[socket.socket, socket.socket]], sent: bytes = b"") -> socket.socket:
    """Our end of a connected pair; `sent` is what the peer has written to it (unread)."""
    ours, theirs = socket.socketpair()
    pairs.append((ours, theirs))
    if sent:
        theirs.sendall(sent)
    return ours


def test_the_kernel_count_is_what_the_peer_sent(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n\r\n"
    assert kernel_bytes_waiting(_pair(pairs, head).fileno()) == len(head)
    assert kernel_bytes_waiting(_pair(pairs).fileno()) == 0
    assert kernel_bytes_waiting(-1) == 0


def test_at_the_cap_an_idle_connection_gives_way_and_one_with_its_request_here_does_not(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    async def scenario() -> None:
        never = asyncio.Event()
        tasks = [asyncio.create_task(never.wait()) for _ in range(5)]
        arrived, idle, buffered, newcomer, last = tasks
        slots = Slots(cap=3)
        for task in (arrived, idle, buffered):
            assert slots.admit(task) == "free"
        # the oldest waiting one has its request in the kernel; the third's was read by asyncio
        slots.waiting(arrived, lambda: False, _pair(pairs, b"GET / HTTP/1.1\r\n\r\n").fileno())
        slots.waiting(idle, lambda: False, _pair(pairs).fileno())
        slots.waiting(buffered, lambda: True, _pair(pairs).fileno())

        assert slots.admit(newcomer) == "evicted"  # the idle one made room, though it is not the oldest
        await asyncio.sleep(0)
        assert idle.cancelled() and not arrived.done() and not buffered.done()
        assert slots.held == {arrived, buffered, newcomer} and slots.evicted == 1

        assert slots.admit(last) is None  # every waiting connection has a request to read: 503
        assert slots.refused == 1 and last not in slots.held
        slots.busy(arrived)
        slots.release(buffered)
        assert slots.admit(last) == "free"  # a slot freed by a connection that ended
        never.set()
        await asyncio.gather(*(t for t in tasks if t is not idle))

    asyncio.run(scenario())
