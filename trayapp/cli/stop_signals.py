"""SIGTERM and SIGINT for the long-running commands (`agent`, `proxy`, `watch`): a stop request, not a
crash."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | None


@contextmanager
def on_stop_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """Call `stop(signum)` on SIGTERM or SIGINT while inside; the handlers from before come back on
    exit (the commands also run in-process: tests, embedders). SIGINT stays ignored where the process
    started with it ignored (a script's background job: the terminal's Ctrl-C is not for it). Off the
    main thread no handler can be set, and none is. `stop` runs inside the signal handler: it must not
    take a lock the interrupted code may hold (`threading.Event.set` does; see `event_setter`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Handler] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, lambda signum, _frame: stop(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def event_setter(event: threading.Event) -> Callable[[int], None]:
    """A `stop` for `on_stop_signals` that sets `event` from another thread: set() in the handler itself
    would take the event's lock, which the main thread holds for a moment inside `event.wait()`, and a
    signal arriving in that moment would deadlock it."""

    def stop(_signum: int) -> None:
        threading.Thread(target=event.set, name="stop-signal", daemon=True).start()

    return stop


class StopFlag:
    """A `stop` for a loop on the main thread (`watch`): the signal is remembered (`requested`, which
    the loop checks each round: a KeyboardInterrupt raised while a finaliser runs is lost, Python
    prints "Exception ignored" and goes on) and KeyboardInterrupt is raised to cut a sleep short."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, _signum: int) -> None:
        self.requested = True
        raise KeyboardInterrupt
