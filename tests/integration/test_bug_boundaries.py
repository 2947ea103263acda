"""No bug ever hidden (#19): a bug injected into a probe's parser, the store's row writer or a
dashboard background job is logged once with its traceback, the status says "internal error",
and monitoring goes on; the same bug at the next tick is not logged again. A bad answer from a
server (`UnexpectedAnswer`) is a status, never a traceback.

Real parts: the real `Monitor`, `OllamaProbe` against the Ollama fake on loopback, a real SQLite
store under a temporary LLM_TRAY_HOME. The background job's test is tests/qt/test_worker.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_servers import FakeOllama
from tests.support.llama import monitor_for
from trayapp.services.monitor import Monitor
from trayapp.sinks.store.writer import Store
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers import ollama


@pytest.fixture
def fake_ollama() -> Iterator[FakeOllama]:
    server = FakeOllama()
    server.load("llama3.1:8b")
    try:
        yield server
    finally:
        server.close()


def tracebacks(caplog: pytest.LogCaptureFixture, kind: type[BaseException]) -> list[logging.LogRecord]:
    """The log records that carry a traceback of `kind`."""
    return [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], kind)]


def _watch(fake: FakeOllama, **kwargs: Any) -> Monitor:
    return monitor_for(f"ollama={fake.url}", **kwargs)


def _broken_entries(data: Any) -> Any:
    fields: dict[str, Any] = {}
    return fields["models"]  # a KeyError, as an unpack bug in the parser would raise


def test_a_bug_in_a_probe_parser_is_logged_once_and_shown(
    fake_ollama: FakeOllama, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trayapp")
    monitor = _watch(fake_ollama)
    try:
        assert monitor.tick().servers[0].status == "ok"
        with monkeypatch.context() as patch:
            patch.setattr(ollama, "_ps_entries", _broken_entries)
            broken = [monitor.tick().servers[0] for _ in range(3)]
        healed = monitor.tick().servers[0]
    finally:
        monitor.close()
    assert {s.status for s in broken} == {"error"}
    assert all((s.reason or "").startswith("internal error: KeyError") for s in broken), broken
    logged = tracebacks(caplog, KeyError)
    assert len(logged) == 1, [r.getMessage() for r in logged]  # three ticks, one traceback
    assert "_broken_entries" in caplog.text  # the traceback names the function that failed
    assert healed.status == "ok" and healed.models  # monitoring went on


@pytest.mark.parametrize(
    ("bug", "reason_start", "has_traceback"),
    [
        (ValueError("invalid literal for int() with base 10: 'x'"), "internal error: ValueError", True),
        (UnexpectedAnswer("no 'models' list"), "unexpected answer: no 'models' list", False),
    ],
)
def test_a_bare_value_error_is_a_bug_and_an_unexpected_answer_is_not(
    fake_ollama: FakeOllama,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    bug: Exception,
    reason_start: str,
    has_traceback: bool,
) -> None:
    """`int("x")` inside a parser used to be filed under "unexpected answer" with no traceback."""

    def raising(data: Any) -> Any:
        raise bug

    caplog.set_level(logging.INFO, logger="trayapp")
    monkeypatch.setattr(ollama, "_ps_entries", raising)
    monitor = _watch(fake_ollama)
    try:
        server = monitor.tick().servers[0]
    finally:
        monitor.close()
    assert server.status == "error"
    assert (server.reason or "").startswith(reason_start), server.reason
    assert bool(tracebacks(caplog, type(bug))) is has_traceback


def test_a_bug_in_the_store_row_writer_is_logged_once_and_shown(
    fake_ollama: FakeOllama,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.INFO, logger="trayapp")
    monkeypatch.setenv("LLM_TRAY_HOME", str(tmp_path / "home"))

    def broken_write(self: Store, rows: Any) -> None:
        raise KeyError("sessions")

    monitor = _watch(fake_ollama, record=True)
    try:
        monitor.tick()
        assert monitor.store_error is None
        with monkeypatch.context() as patch:
            patch.setattr(Store, "_write", broken_write)
            snapshots = [monitor.tick() for _ in range(3)]
            error_while_broken = monitor.store_error
        after = monitor.tick()
        error_after = monitor.store_error
    finally:
        monitor.close()
    assert all(s.servers[0].status == "ok" for s in [*snapshots, after])  # the tick goes on
    assert (error_while_broken or "").startswith("internal error: KeyError"), error_while_broken
    assert len(tracebacks(caplog, KeyError)) == 1
    assert "broken_write" in caplog.text
    assert error_after is None  # recording again clears it
