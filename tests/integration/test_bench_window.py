"""The tray's "Benchmark this model…" window (#13) against the session's real llama-server.

The window runs the same bench as `llm-tray bench` (trayapp/app/bench_service.py) on a thread of its
own: progress to the end, the result text, the sweep plot (measured beside the KV model's
prediction) and the result stored as the baseline through the store writer it is given (here a
real recording Monitor's store, as in the tray). Cancel stops before the next run and stores
nothing. Every wait is on a signal, bounded.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists

import statistics
import time
from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from tests.support.llama import LlamaServer, monitor_for
from trayapp.app.bench_service import endpoint_for, make_bench_runner, store_through
from trayapp.config import paths
from trayapp.config.settings import Settings
from trayapp.core.bench import BenchResult
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.services.monitor import Monitor
from trayapp.sinks.store import Store
from trayapp.ui.bench_window import BenchWindow

pytestmark = pytest.mark.llamacpp

BENCH_LIMIT_MS = 240_000
PROFILE = HardwareProfile(ram_bandwidth_gbps=54.0)  # given: no RAM benchmark competes for the cores


@pytest.fixture
def recording_monitor(llama_server: LlamaServer) -> Iterator[Monitor]:
    """The tray's side: a recording Monitor (its store is the writer) watching the server."""
    monitor = monitor_for(llama_server.url, record=True, profile=PROFILE)
    try:
        monitor.tick()
        yield monitor
    finally:
        monitor.close()


def _window(
    qtbot: QtBot, server: LlamaServer, monitor: Monitor | None, stored: list[BenchResult]
) -> BenchWindow:
    finder = monitor_for(server.url, profile=PROFILE)
    try:
        (model,) = [m for _, m in finder.tick().models()]
    finally:
        finder.close()
    settings = Settings()

    def store(result: BenchResult) -> tuple[bool, str | None]:
        stored.append(result)
        return store_through(lambda: monitor)(result)

    run = make_bench_runner(settings, endpoint_for(server.url, "llamacpp", settings), model.name, store)
    window = BenchWindow(model.name, server.url, run)
    qtbot.addWidget(window)
    window.show()
    return window


def test_the_window_benches_plots_the_sweep_and_stores_the_baseline(
    qtbot: QtBot, llama_server: LlamaServer, recording_monitor: Monitor
) -> None:
    stored: list[BenchResult] = []
    window = _window(qtbot, llama_server, recording_monitor, stored)
    window.tokens.setValue(16)
    window.runs.setValue(2)
    window.warmup.setValue(0)
    window.depths.setText("0,512")
    with qtbot.waitSignal(window.finished_bench, timeout=BENCH_LIMIT_MS) as done:
        window.start_button.click()
        assert not window.start_button.isEnabled() and window.cancel_button.isEnabled()
    outcome = done.args[0]
    assert outcome is not None, window.status.text()
    result = outcome.result
    # Every planned run ran: 2 decode, 2 long prompt, 2 at depth 512 (no warm-ups).
    assert window.progress.maximum() == 6 and window.progress.value() == 6
    assert [r.kind for r in result.runs] == ["decode", "decode", "prompt", "prompt", "sweep", "sweep"]
    assert result.decode_exact and result.decode_tok_s and result.decode_tok_s > 0
    assert "decode" in window.result_text.toPlainText() and "sweep" in window.result_text.toPlainText()
    depths, rates = window.measured_curve.getData()
    assert list(depths) == [0, 512]
    assert list(rates) == [p.decode_tok_s for p in result.sweep]
    predicted_depths, predicted = window.predicted_curve.getData()
    assert list(predicted_depths) == [0, 512] and all(v > 0 for v in predicted)
    # Stored through the tray's own store writer (the tray holds the store's lock), when its two
    # decode runs agree within 10 % (CV, from the server's own timings); else refused as unstable.
    assert stored == [result]
    server_rates = [r.server_decode_tok_s for r in result.runs if r.kind == "decode"]
    assert all(server_rates)
    server_cv = statistics.stdev(server_rates) / statistics.mean(server_rates)  # type: ignore[arg-type]
    if server_cv > 0.10:
        assert "unstable" in window.status.text() and f"{server_cv * 100:.1f} %" in window.status.text()
        with contextlib.closing(sqlite3.connect(paths.store_file())) as raw:
            assert raw.execute("SELECT COUNT(*) FROM bench").fetchone() == (0,)
        return
    assert "stored as the baseline" in window.status.text(), window.status.text()
    with Store(paths.store_file(), writer=False) as store:
        baseline = store.baseline(
            model=result.target.model, quantization=result.target.quantization,
            hardware=result.target.hardware, context_tokens=None, before_wall_s=time.time() + 1,
        )  # fmt: skip
    assert baseline is not None and baseline.source == "bench"
    assert baseline.decode_tok_s == pytest.approx(result.decode_tok_s)
    assert window.start_button.isEnabled() and not window.cancel_button.isEnabled()


def test_cancel_stops_before_the_next_run_and_stores_nothing(qtbot: QtBot, llama_server: LlamaServer) -> None:
    stored: list[BenchResult] = []
    window = _window(qtbot, llama_server, None, stored)
    window.tokens.setValue(16)
    window.runs.setValue(5)
    window.warmup.setValue(1)
    window.depths.setText("0")
    with qtbot.waitSignal(
        window.job_progress, timeout=BENCH_LIMIT_MS, check_params_cb=lambda done, *_: done >= 1
    ):
        window.start_button.click()
    with qtbot.waitSignal(window.finished_bench, timeout=BENCH_LIMIT_MS) as done:
        window.cancel_button.click()
    outcome = done.args[0]
    assert outcome is not None and outcome.result.interrupted
    assert len(outcome.result.runs) < window.progress.maximum()  # it did stop early
    assert stored == []
    assert window.status.text().startswith("cancelled"), window.status.text()


def test_a_bad_depth_list_is_named_and_nothing_runs(qtbot: QtBot, llama_server: LlamaServer) -> None:
    window = _window(qtbot, llama_server, None, [])
    window.depths.setText("0,-5")
    window.start_button.click()
    assert window.job is None and "Depths" in window.status.text()
