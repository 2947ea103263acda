"""The tray's bench (#13): `llm-tray bench`'s run (services/bench_job.py) for the bench window.

The window (ui/bench_window.py) calls the runner made here on a thread of its own; the runner builds
a monitor of its own (not recording: its ticks only check placement), benches, and keeps the result
as the baseline through `store_result` — in the tray, the tray's own store writer, which holds the
store's lock (a second writer would be refused).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trayapp.config.settings import EndpointConfig, Settings
from trayapp.core.bench import BenchOptions, BenchOutcome, BenchResult
from trayapp.core.loopback import same_server
from trayapp.services.bench_job import BenchError, ProgressSink, find_target, run_job
from trayapp.services.bench_report import format_result
from trayapp.ui.worker import MonitorLike

log = logging.getLogger(__name__)

StoreResult = Callable[[BenchResult], tuple[bool, str | None]]  # → (stored, a note to show)
BenchReport = tuple[BenchOutcome | None, str, str]  # (outcome, its text, a one-line message)
BenchRunner = Callable[[BenchOptions, ProgressSink, threading.Event], BenchReport]


def make_bench_runner(
    settings: Settings, endpoint: EndpointConfig, model: str, store_result: StoreResult
) -> BenchRunner:
    """A runner that benches `model` at `endpoint` (blocking: call it off the GUI thread)."""

    def run(options: BenchOptions, progress: ProgressSink, cancel: threading.Event) -> BenchReport:
        from trayapp.services.monitor import Monitor

        try:
            monitor = Monitor(settings, extra_endpoints=[endpoint], discover=False, record=False)
        except Exception as exc:
            return None, "", f"could not start: {exc}"
        try:
            found = find_target(monitor, [endpoint.url], model, options.force)
            outcome = run_job(monitor, *found, options, progress, cancel)
        except BenchError as exc:
            return None, "", str(exc)
        except Exception as exc:  # the window says what broke, never nothing
            log.exception("bench failed")
            return None, "", f"{type(exc).__name__}: {exc}"
        finally:
            monitor.close()
        text = format_result(outcome.result)
        if outcome.result.interrupted:
            return outcome, text, "cancelled: the runs that finished are shown, not stored as the baseline"
        if outcome.failure and not outcome.measured:
            return outcome, text, outcome.failure
        stored, note = store_result(outcome.result)
        done = "stored as the baseline of this model on this hardware" if stored else ""
        return outcome, text, note or done

    return run


def store_through(monitor: Callable[[], MonitorLike | None]) -> StoreResult:
    """Store a bench's result through the tray's own monitor (`monitor()`: the one it runs now),
    the store's writer; a bench opens a writer of its own only when that monitor records nothing."""
    from trayapp.services.bench_report import store_baseline

    def store(result: BenchResult) -> tuple[bool, str | None]:
        current = monitor()
        done = current.record_bench(result) if current is not None else None
        return done if done is not None else store_baseline(result)

    return store


def endpoint_for(url: str, kind: str, settings: Settings) -> EndpointConfig:
    """The configured endpoint of `url` (its API key settings), or a bare one of that kind."""
    for config in settings.endpoints:
        if same_server(config.url, url):
            return config
    return EndpointConfig(url=url, kind=kind)
