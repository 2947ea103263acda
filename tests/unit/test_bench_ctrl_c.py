"""Ctrl-C stops `llm-tray bench` even when its KeyboardInterrupt is lost (#24: on a busy host a Ctrl-C
once reached the bench where Python swallowed it, and the bench ran on to its end)."""

from __future__ import annotations

import os
import signal

import pytest

from trayapp.cli.bench import _ctrl_c_cancels


def test_ctrl_c_sets_the_cancel_and_interrupts_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with _ctrl_c_cancels() as cancel:
        assert not cancel.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode boundary
            cancel.wait(5.0)
        assert cancel.is_set()  # the next run boundary stops the bench, whatever became of the interrupt
    assert signal.getsignal(signal.SIGINT) is before
