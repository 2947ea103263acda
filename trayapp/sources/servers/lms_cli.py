"""LM Studio's `lms` CLI: what it prints, and background readers of it.

`lms log stream --source model --filter output --json` (LM Studio ≥ 0.3.26) prints
each prediction's stats once it ends, for *every* client; `lms ps --json` (≥ 0.3.27)
says whether a model is generating. `LmStudioProbe` (`lmstudio.py`) runs both through
`LmsCli` when the CLI is on this machine.

Privacy: `lms log stream` lines carry the prompt and the completion. They are
parsed and dropped at once; only numbers are kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from trayapp.config.bugs import BugLog
from trayapp.core.model import FinishedRequest, ModelReading
from trayapp.core.overflow import stop_reason_from
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers.jsonvals import as_dict, as_float, as_int, as_str
from trayapp.sources.servers.lms_runtime import parse_runtime_ls
from trayapp.sources.servers.ollama import parse_parameter_size

BUSY_STATUSES = ("generating", "processingPrompt")
EMBEDDING_TYPES = ("embedding", "embeddings")  # model types LM Studio lists that are no LLMs
MAX_QUEUED = 1000  # finished requests kept between two polls
RUNTIME_INTERVAL_S = 300.0  # `lms runtime ls` this often: the runtime changes on an update only

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- pure parsing


def parse_params_string(text: object) -> tuple[int | None, int | None]:
    """LM Studio `params_string` -> (total, active): '30B-A3B' -> (30e9, 3e9), '8B' -> (8e9, None)."""
    if not isinstance(text, str):
        return None, None
    total_text, _, active_text = text.partition("-")
    total = parse_parameter_size(total_text)
    active = None
    if active_text[:1].upper() == "A":
        active = parse_parameter_size(active_text[1:])
    return total, active


def parse_lms_ps(data: Any) -> list[ModelReading]:
    """`lms ps --json` -> loaded LLMs with `busy` from `status` (generating / processingPrompt).

    `status` is absent before lms 0.3.27; then `busy` is None.
    """
    if not isinstance(data, list):
        raise UnexpectedAnswer("unexpected `lms ps --json` shape (not a list)")
    readings: list[ModelReading] = []
    for item in data:
        if not isinstance(item, dict) or item.get("type") in EMBEDDING_TYPES:
            continue
        name = as_str(item.get("identifier")) or as_str(item.get("modelKey"))
        if name is None:
            continue
        status = as_str(item.get("status"))
        total, _active = parse_params_string(item.get("paramsString"))
        readings.append(
            ModelReading(
                name=name,
                loaded=True,
                size_bytes=as_int(item.get("sizeBytes")),
                weights_bytes=as_int(item.get("sizeBytes")),
                context_length=as_int(item.get("contextLength")),
                quantization=as_str(as_dict(item.get("quantization")).get("name")),
                parameter_count=total,
                architecture=as_str(item.get("architecture")),
                model_path=as_str(item.get("path")),
                busy=None if status is None else status in BUSY_STATUSES,
                queued_requests=_waiting(item, status),
            )
        )
    return readings


def _waiting(item: dict[str, Any], status: str | None) -> int | None:
    """Requests waiting for a slot: `queued` counts the ones being served too (up to `parallel`, 1
    when not given) while the model is busy; absent before lms 0.3.27."""
    queued = as_int(item.get("queued"))
    if queued is None or status is None:
        return None
    serving = (as_int(item.get("parallel")) or 1) if status in BUSY_STATUSES else 0
    return max(0, queued - serving)


def parse_lms_log_line(line: str | bytes) -> FinishedRequest | None:
    """One `lms log stream --json` line -> a FinishedRequest for `llm.prediction.output` events with stats.

    Everything else (input events, server/runtime logs, garbage) gives None. The
    `input`/`output` text is never copied out of the parsed event.
    """
    try:
        event = json.loads(line)
    except ValueError:
        return None
    data = as_dict(event.get("data")) if isinstance(event, dict) else {}
    if data.get("type") != "llm.prediction.output" or not isinstance(data.get("stats"), dict):
        return None
    stats = data["stats"]
    timestamp_ms = as_float(event.get("timestamp"))
    prompt = as_int(stats.get("promptTokensCount"))
    decoded = as_int(stats.get("predictedTokensCount"))
    total = as_int(stats.get("totalTokensCount"))
    if total is None and prompt is not None and decoded is not None:
        total = prompt + decoded
    return FinishedRequest(
        model=as_str(data.get("modelIdentifier")) or "",
        finished_wall_s=timestamp_ms / 1000.0 if timestamp_ms is not None else time.time(),
        prompt_tokens=prompt,
        decode_tokens=decoded,
        decode_tok_s=as_float(stats.get("tokensPerSecond")),
        ttft_s=as_float(stats.get("timeToFirstTokenSec")),
        draft_tokens=as_int(stats.get("totalDraftTokensCount")),
        draft_accepted=as_int(stats.get("acceptedDraftTokensCount")),
        context_tokens=total,
        source="lms-log",
        stop_reason=stop_reason_from(stats.get("stopReason")),  # contextLengthReached: cut by the context
    )


# --------------------------------------------------------------------------- the lms CLI


def find_lms() -> str | None:
    """The `lms` CLI: on PATH, or where LM Studio installs it (~/.lmstudio/bin)."""
    found = shutil.which("lms")
    if found:
        return found
    candidate = Path.home() / ".lmstudio" / "bin" / ("lms.exe" if os.name == "nt" else "lms")
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


class LmsCli:
    """Background readers of `lms log stream` (restarted with backoff) and `lms ps --json`."""

    STREAM_ARGS = ("log", "stream", "--source", "model", "--filter", "output", "--json")

    def __init__(
        self,
        lms_path: str,
        *,
        ps_interval_s: float = 3.0,
        ps_timeout_s: float = 5.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
    ) -> None:
        self.lms_path = lms_path
        self.ps_interval_s = ps_interval_s
        self.ps_timeout_s = ps_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.finished: queue.Queue[FinishedRequest] = queue.Queue(maxsize=MAX_QUEUED)
        self.stream_starts = 0
        self._stop = threading.Event()
        self._enabled = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ps: list[ModelReading] | None = None
        self._ps_at: float | None = None
        self._runtime: str | None = None  # `lms runtime ls`: the selected engines (lms_runtime.py)
        self._runtime_at: float | None = None
        self._threads: list[threading.Thread] = []
        self._bugs = BugLog(log)  # both reader threads' boundary: each bug's traceback logged once

    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._stream_loop, "lms-log"), (self._ps_loop, "lms-ps")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def set_enabled(self, enabled: bool) -> None:
        """Run `lms` only while LM Studio answers: `lms` may launch LM Studio when it is not running."""
        if enabled:
            self._enabled.set()
        else:
            self._enabled.clear()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._enabled.set()  # wake the loops so they see the stop
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the reader thread sees EOF, reaps it and closes the pipe
        for thread in self._threads:
            thread.join(timeout_s)
        if proc is not None and proc.poll() is None:  # it ignored SIGTERM
            proc.kill()
            for thread in self._threads:
                thread.join(timeout_s)

    @property
    def stream_pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def latest_ps(self) -> list[ModelReading] | None:
        """The last `lms ps` result, unless it is older than a few intervals (lms hung or gone)."""
        with self._lock:
            age_s = time.monotonic() - self._ps_at if self._ps_at is not None else None
            if age_s is None or age_s > 3 * self.ps_interval_s + self.ps_timeout_s:
                return None
            return self._ps

    def latest_runtime(self) -> str | None:
        """The selected inference runtimes ("llama.cpp-linux-x86_64-avx2@1.52.0"), when `lms` said."""
        with self._lock:
            return self._runtime

    def drain(self) -> tuple[FinishedRequest, ...]:
        records: list[FinishedRequest] = []
        while True:
            try:
                records.append(self.finished.get_nowait())
            except queue.Empty:
                return tuple(records)

    def _stream_loop(self) -> None:
        backoff = self.backoff_s
        while not self._stop.is_set():
            self._enabled.wait()
            if self._stop.is_set():
                return
            started = time.monotonic()
            self._read_stream()
            if time.monotonic() - started > 10 * backoff:
                backoff = self.backoff_s  # it ran a good while: restart promptly
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _read_stream(self) -> None:
        try:
            proc = subprocess.Popen(
                [self.lms_path, *self.STREAM_ARGS],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return
        with self._lock:
            self._proc = proc
            self.stream_starts += 1
        try:
            if not self._stop.is_set():
                assert proc.stdout is not None
                for line in proc.stdout:
                    record = self._parse_line(line)
                    del line  # the prompt / completion text is in here, and nowhere else
                    if record is not None:
                        self._put(record)
        except (OSError, UnicodeDecodeError):
            pass  # the pipe broke (or was not text): restart
        finally:
            _end_process(proc)
            with self._lock:
                self._proc = None

    def _parse_line(self, line: bytes) -> FinishedRequest | None:
        """One line's record; a bug in the parser is logged once and the line skipped, so the
        reader goes on. The bug's message is withheld: it may quote the line, which holds the
        prompt and the completion (its traceback names only code)."""
        try:
            return parse_lms_log_line(line)
        except Exception as exc:
            withheld = LmsParseBug(f"{type(exc).__name__} (message withheld: the line holds prompt text)")
            self._bugs.report(withheld.with_traceback(exc.__traceback__), "lms log stream")
            return None

    def _put(self, record: FinishedRequest) -> None:
        while True:
            try:
                self.finished.put_nowait(record)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.finished.get_nowait()  # drop the oldest

    def _ps_loop(self) -> None:
        while not self._stop.is_set():
            self._enabled.wait()
            if self._stop.is_set():
                return
            readings: list[ModelReading] | None
            try:
                done = subprocess.run(
                    [self.lms_path, "ps", "--json"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=self.ps_timeout_s,
                    check=False,
                )
                readings = parse_lms_ps(json.loads(done.stdout)) if done.returncode == 0 else None
            except (OSError, subprocess.SubprocessError, json.JSONDecodeError, UnexpectedAnswer):
                readings = None
            except Exception as exc:  # a bug in a parser: logged once, the loop goes on
                self._bugs.report(exc, "lms ps")
                readings = None
            if readings is not None:
                with self._lock:
                    self._ps = readings
                    self._ps_at = time.monotonic()
            try:
                self._read_runtime()
            except Exception as exc:  # a bug in its parser: logged once, `lms ps` goes on
                self._bugs.report(exc, "lms runtime ls")
            self._stop.wait(self.ps_interval_s)

    def _read_runtime(self) -> None:
        """`lms runtime ls`, at most every RUNTIME_INTERVAL_S (a runtime changes on an update only)."""
        now = time.monotonic()
        if self._runtime_at is not None and now - self._runtime_at < RUNTIME_INTERVAL_S:
            return
        self._runtime_at = now
        try:
            done = subprocess.run(
                [self.lms_path, "runtime", "ls"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.ps_timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return
        if done.returncode == 0:
            runtime = parse_runtime_ls(done.stdout.decode("utf-8", errors="replace"))
            with self._lock:
                self._runtime = runtime


class LmsParseBug(Exception):
    """A bug met while parsing an `lms log stream` line, its message stripped of the line's text."""


def _end_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)
    if proc.stdout is not None:
        proc.stdout.close()
