"""The tray's "Benchmark this model…" window (#13): the same bench as `llm-tray bench`, with progress,
Cancel, the result and a plot of the context sweep against the KV model's prediction.

The bench itself is the `run` callable app/tray_app.py passes (trayapp/app/bench_service.py): it runs on a
thread of its own, so neither the GUI nor the tray's sampler ever waits on it. Cancel stops before
the next run; what finished is shown, and not stored (an interrupted bench is no baseline).
Imported on first use (pyqtgraph).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from trayapp.core.bench import BenchOptions, BenchOutcome, BenchResult


class BenchProgress(Protocol):
    """How far a bench is (services/bench_job.py's ProgressSink, as the window gives it)."""

    def show(self, label: str) -> None: ...

    def step(self) -> None: ...

    def clear(self) -> None: ...


# (options, progress, cancel) → (the outcome or None, its text, a message)
BenchRun = Callable[[BenchOptions, BenchProgress, threading.Event], tuple[BenchOutcome | None, str, str]]


class _Job(QObject):
    """One bench on its own thread; its signals reach the window on the GUI thread (queued)."""

    progressed = Signal(int, int, str)  # runs done, runs in all, what runs now
    finished = Signal(object, str, str)  # BenchOutcome or None, its text, a message

    def __init__(self, run: BenchRun, options: BenchOptions) -> None:
        super().__init__()
        self.run, self.options = run, options
        self.cancel = threading.Event()
        self._done = 0
        self._total = options.total_runs()

    # the progress sink of services/bench_job.py
    def show(self, label: str) -> None:
        self.progressed.emit(self._done, self._total, label)

    def step(self) -> None:
        self._done += 1

    def clear(self) -> None:
        pass

    def start(self) -> None:
        threading.Thread(target=self._work, name="llm-tray-bench", daemon=True).start()

    def _work(self) -> None:
        try:
            outcome, text, message = self.run(self.options, self, self.cancel)
        except Exception as exc:  # the runner reports its own failures; this is a last resort
            outcome, text, message = None, "", f"{type(exc).__name__}: {exc}"
        self.finished.emit(outcome, text, message)


class BenchWindow(QDialog):
    """Settings, Start / Cancel, a progress bar, the result text and the sweep plot."""

    finished_bench = Signal(object)  # the BenchOutcome, or None (for tests and the app's events)
    job_progress = Signal(int, int, str)  # runs done, runs in all, what runs now

    def __init__(
        self,
        model: str,
        server_url: str,
        run: BenchRun,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.model, self.run = model, run
        self.job: _Job | None = None
        self.outcome: BenchOutcome | None = None
        self.setWindowTitle(f"Benchmark {model}")
        self.resize(640, 560)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"<b>{model}</b> on {server_url}, through its API, as your editor uses it"))

        form = QFormLayout()
        self.tokens = self._spin(2, 4096, 200, "tokens generated per decode run")
        self.runs = self._spin(1, 50, 5, "measured runs per step (the median is kept)")
        self.warmup = self._spin(0, 20, 2, "warm-up runs, discarded")
        self.depths = QLineEdit("0,2048,8192")
        self.depths.setToolTip(
            "context depths of the sweep, in tokens (beyond the server's context it stops)"
        )
        self.force = QCheckBox("Bench even while another client uses the server")
        form.addRow("Tokens", self.tokens)
        form.addRow("Runs", self.runs)
        form.addRow("Warm-up", self.warmup)
        form.addRow("Depths", self.depths)
        form.addRow("", self.force)
        layout.addLayout(form)

        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start")
        self.cancel_button = QPushButton("Cancel")
        self.close_button = QPushButton("Close")
        self.cancel_button.setEnabled(False)
        for button in (self.start_button, self.cancel_button, self.close_button):
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.close_button.clicked.connect(self.close)

        self.progress = QProgressBar()
        self.status = QLabel("Ready. The server should be otherwise idle while the bench runs.")
        self.status.setWordWrap(True)
        self.result_text = QPlainTextEdit()
        self.result_text.setReadOnly(True)
        self.result_text.setMaximumBlockCount(200)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("bottom", "context depth (tokens)")
        self.plot.setLabel("left", "decode tok/s")
        self.plot.addLegend(offset=(-10, 10))
        blue, grey = (40, 110, 200), (120, 120, 120)
        measured_pen = pg.mkPen(blue, width=2)
        predicted_pen = pg.mkPen(grey, width=2, style=Qt.PenStyle.DashLine)
        self.measured_curve = self.plot.plot(
            [], [], pen=measured_pen, symbol="o", symbolBrush=blue, name="measured"
        )
        self.predicted_curve = self.plot.plot([], [], pen=predicted_pen, name="predicted (KV model)")
        for widget in (self.progress, self.status, self.result_text, self.plot):
            layout.addWidget(widget)

    def _spin(self, low: int, high: int, value: int, tip: str) -> QSpinBox:
        spin = QSpinBox()
        spin.setRange(low, high)
        spin.setValue(value)
        spin.setToolTip(tip)
        return spin

    def options(self) -> BenchOptions:
        """What the form asks for; ValueError names a bad depth list."""
        depths = tuple(sorted({int(part) for part in self.depths.text().split(",") if part.strip()}))
        if not depths or any(d < 0 for d in depths):
            raise ValueError("depths must be token counts ≥ 0, e.g. 0,2048,8192")
        return BenchOptions(
            self.tokens.value(), self.runs.value(), self.warmup.value(), depths, self.force.isChecked()
        )

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        if self.job is not None:
            return
        try:
            options = self.options()
        except ValueError as exc:
            self.status.setText(f"Depths: {exc}")
            return
        self.outcome = None
        self.result_text.clear()
        self.measured_curve.setData([], [])
        self.predicted_curve.setData([], [])
        self.progress.setRange(0, options.total_runs())
        self.progress.setValue(0)
        self.status.setText("Finding the model…")
        self.job = _Job(self.run, options)
        self.job.progressed.connect(self._on_progress, Qt.ConnectionType.QueuedConnection)
        self.job.finished.connect(self._on_finished, Qt.ConnectionType.QueuedConnection)
        self.start_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.job.start()

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel.set()
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling after the run in progress…")

    def _on_progress(self, done: int, total: int, label: str) -> None:
        self.progress.setValue(done)
        self.status.setText(f"Run {min(done + 1, total)} of {total}: {label}")
        self.job_progress.emit(done, total, label)

    def _on_finished(self, outcome: object, text: str, message: str) -> None:
        self.job = None
        self.start_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.outcome = outcome if isinstance(outcome, BenchOutcome) else None
        if self.outcome is not None:
            result = self.outcome.result
            self.progress.setValue(sum(1 for _ in result.runs))
            self.result_text.setPlainText(text)
            self._plot(result)
        self.status.setText(message or "Done.")
        self.finished_bench.emit(self.outcome)

    def _plot(self, result: BenchResult) -> None:
        points = [p for p in result.sweep if p.decode_tok_s is not None]
        self.measured_curve.setData([p.depth_tokens for p in points], [p.decode_tok_s for p in points])
        predicted = [p for p in result.sweep if p.predicted_tok_s is not None]
        self.predicted_curve.setData(
            [p.depth_tokens for p in predicted], [p.predicted_tok_s for p in predicted]
        )

    def closeEvent(self, event: object) -> None:
        self.cancel()  # a running bench stops before its next run
        super().closeEvent(event)  # type: ignore[arg-type]
