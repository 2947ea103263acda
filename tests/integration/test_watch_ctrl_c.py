"""`watch` stops on Ctrl-C even when the KeyboardInterrupt is lost (raised inside a finaliser), and on
SIGTERM as on Ctrl-C: its store closed, exit code 0."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys

import pytest

from tests.support.cli import Watch
from tests.support.fake_http import FakeServer, json_reply
from trayapp.cli.stop_signals import StopFlag, on_stop_signals


class _Finalised:
    """An object whose finaliser runs while Ctrl-C arrives: Python prints "Exception ignored" for
    the KeyboardInterrupt raised there and goes on, as it did for `watch` in CI."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at one of these bytecodes, inside __del__
            pass


# Python reports the lost KeyboardInterrupt as an unraisable exception, which pytest turns into this
# warning: that report is the loss this test is about.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_lost_in_a_finaliser_is_still_seen_by_the_loop() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop = StopFlag()
    with on_stop_signals(stop):
        assert not stop.requested
        obj = _Finalised()
        del obj  # CPython finalises at once; the KeyboardInterrupt dies inside __del__
        gc.collect()
        # here, so no KeyboardInterrupt came out of it; the loop's own check ends it next round
        assert stop.requested
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_ctrl_c_outside_a_finaliser_still_interrupts_at_once() -> None:
    interrupted = False
    stop = StopFlag()
    with on_stop_signals(stop):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1_000_000):  # bounded: the handler runs long before the end
                pass
        except KeyboardInterrupt:
            interrupted = True
    assert interrupted and stop.requested


def test_where_sigint_is_ignored_it_stays_ignored() -> None:
    """`llm-tray watch &` in a script starts with SIGINT ignored, as the shell meant: no handler."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stop = StopFlag()
        with on_stop_signals(stop):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)  # ignored by the kernel: nothing runs
        assert not stop.requested
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_suites_children_get_ctrl_c_as_from_a_terminal() -> None:
    """Started in the background by a script, the suite inherits SIGINT ignored; tests/conftest.py
    restores it, so the CLI children the tests press Ctrl-C on can hear it."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_sigterm_stops_watch_as_ctrl_c_does() -> None:
    """A service manager or `kill` stops `watch` with SIGTERM: it closes its store and exits 0, as on
    Ctrl-C (SIGTERM's default would end it at once, 128 + 15)."""
    with FakeServer({"/health": json_reply({"status": "ok"})}) as server:
        watch = Watch("--interval", "0.5", "--duration", "60", "--endpoint", server.url, "--no-discover")
        try:
            assert watch.next_line() is not None
            assert watch.stop_with(signal.SIGTERM) == 0, watch.stderr()
        finally:
            watch.stop()
