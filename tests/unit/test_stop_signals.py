"""`on_stop_signals`: SIGTERM and SIGINT stop `agent` and `proxy`, and the handlers from before come
back when the command returns (it runs in-process in tests; a handler left behind made one test's
Ctrl-C depend on another having run first). Real signals sent to this process."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from trayapp.cli.stop_signals import event_setter, on_stop_signals


@pytest.fixture
def own_handlers() -> Iterator[tuple[object, object]]:
    """SIGTERM and SIGINT with handlers of the test's own, restored afterwards."""

    def before_term(_signum: int, _frame: object) -> None:
        raise AssertionError("the handler from before ran inside on_stop_signals")

    saved = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    signal.signal(signal.SIGTERM, before_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, saved[0])  # type: ignore[arg-type]
        signal.signal(signal.SIGINT, saved[1])  # type: ignore[arg-type]


def _received(seen: list[int], count: int) -> bool:
    """Python runs a handler between bytecodes of the main thread: wait for it (bounded)."""
    done = threading.Event()
    for _ in range(200):
        if len(seen) >= count:
            return True
        done.wait(0.01)
    return False


def test_both_signals_call_stop_and_the_old_handlers_come_back(own_handlers: tuple[object, object]) -> None:
    seen: list[int] = []
    with on_stop_signals(seen.append):
        os.kill(os.getpid(), signal.SIGTERM)
        assert _received(seen, 1)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: a stop request
        assert _received(seen, 2)
    assert seen == [signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == own_handlers


def test_an_ignored_sigint_stays_ignored(own_handlers: tuple[object, object]) -> None:
    """Started with SIGINT ignored (a script's background job): the terminal's Ctrl-C is not for it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: list[int] = []
    with on_stop_signals(seen.append):
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert _received(seen, 1)
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == own_handlers[0]


def test_off_the_main_thread_nothing_is_installed(own_handlers: tuple[object, object]) -> None:
    inside: list[object] = []

    def run() -> None:
        with on_stop_signals(lambda _signum: None):
            inside.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert inside == [own_handlers[0]]


def test_the_event_is_set_from_another_thread_not_inside_the_handler() -> None:
    event = threading.Event()
    setters: list[str] = []
    original_set = event.set

    def recording_set() -> None:
        setters.append(threading.current_thread().name)
        original_set()

    event.set = recording_set  # type: ignore[method-assign]
    event_setter(event)(signal.SIGTERM)
    assert event.wait(10)
    assert setters == ["stop-signal"] and threading.current_thread().name not in setters
