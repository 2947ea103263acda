"""A real llama-server whose context is too small (#20), watched WITHOUT the recording proxy: the real
Monitor ticking once a second reads the server's own log (its stderr, a file here, as `LlamaServer`
starts it; `trayapp/sources/llamacpp_log.py`).

- a prompt longer than the context, sent straight to the server, is refused (HTTP 400): the monitor's
  `context_overflow` alert shows the two numbers of the body the client got, within 2 s of the answer,
  and the refusal is stored as one request row;
- an answer that runs into the context's end (`truncated: true` in the server's own response) is
  `cut_short`, with the answer's length and the context it filled equal to the response's timings;
- a server whose stderr is a pipe gives no records, and the reason is logged once.

Every number is compared with what the server said for the same request. Every wait is bounded.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.llama import LlamaServer, monitor_for
from tests.support.overflow import (
    ALERT_WITHIN_S,
    FILLING_PROMPT,
    LONG_PROMPT,
    N_CTX,
    PROFILE,
    overflow_alerts,
    post_completion,
    tick_until_alert,
)
from trayapp.config import paths
from trayapp.sinks.store import Store
from trayapp.sources.llamacpp_log import LOG_SOURCE
from trayapp.sources.servers.llamacpp import LlamaCppProbe

pytestmark = pytest.mark.llamacpp


def _request_rows() -> list[dict[str, object]]:
    with Store(paths.store_file(), writer=False) as store:
        return list(store.iter_rows("requests"))


def test_a_refusal_sent_straight_to_the_server_alerts_from_its_log(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    server = LlamaServer(model_path, binary=llama_binary, ctx_size=N_CTX, log_dir=tmp_path)
    request = {"prompt": LONG_PROMPT, "n_predict": 8, "cache_prompt": False}
    with server:
        monitor = monitor_for(server.url, record=True, profile=PROFILE)
        try:
            assert monitor.tick().servers[0].status == "ok"  # the log is found, and read from its end on
            status, body = post_completion(server.url, request)
            answered = time.monotonic()
            snapshots = tick_until_alert(monitor, answered)
            seen_s = time.monotonic() - answered
            for _ in range(3):  # the episode goes on: one alert, not one per tick
                snapshots.append(monitor.tick())
        finally:
            monitor.close()
    error = body["error"]
    assert status == 400 and error["type"] == "exceed_context_size_error", body
    alerts = [a for s in snapshots for a in overflow_alerts(s)]
    assert alerts, server.log_tail()
    assert seen_s <= ALERT_WITHIN_S and len(snapshots) - 3 <= 2, seen_s
    assert len({a.id for a in alerts}) == 1
    alert = alerts[-1]
    assert alert.evidence["cause"] == "rejected"
    assert alert.evidence["source"] == LOG_SOURCE
    assert alert.evidence["tokens_sent"] == error["n_prompt_tokens"] > N_CTX
    assert alert.evidence["tokens_sent_exact"] is True
    assert alert.evidence["context_tokens"] == error["n_ctx"] == N_CTX
    assert f"refused a {error['n_prompt_tokens']}-token prompt" in alert.message
    print(f"alert {seen_s:.2f} s after the answer:", alert.message, alert.fix, sep="\n")
    # The refusal is one request row of its own (no proxy records it; its slot never decoded).
    rows = _request_rows()
    refused = [row for row in rows if row["http_status"] == 400]
    assert len(refused) == 1, rows
    (row,) = refused
    assert row["source"] == LOG_SOURCE
    assert row["prompt_tokens_sent"] == error["n_prompt_tokens"]
    assert row["context_limit_tokens"] == error["n_ctx"]
    assert len(rows) == 1, rows


def test_an_answer_cut_at_the_context_end_is_cut_short_from_the_log(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    server = LlamaServer(model_path, binary=llama_binary, ctx_size=N_CTX, log_dir=tmp_path)
    request = {"prompt": FILLING_PROMPT, "n_predict": 200, "cache_prompt": False}
    with server:
        probe = LlamaCppProbe(server.url)  # a second reader of the same log: the record's own numbers
        monitor = monitor_for(server.url, record=True, profile=PROFILE)
        try:
            assert probe.poll(0.0).status == "ok"
            assert monitor.tick().servers[0].status == "ok"
            status, body = post_completion(server.url, request)
            answered = time.monotonic()
            snapshots = tick_until_alert(monitor, answered)
            seen_s = time.monotonic() - answered
            reading = probe.poll(1.0)
        finally:
            monitor.close()
            probe.close()
    assert status == 200 and body["truncated"] is True and body["stop_type"] == "limit", body
    timings = body["timings"]
    filled = timings["prompt_n"] + timings.get("cache_n", 0) + timings["predicted_n"]
    (record,) = [f for f in reading.finished if f.source == LOG_SOURCE]
    assert record.stop_reason == "context"
    assert record.context_tokens == filled == N_CTX  # n_tokens + 1: the response's tokens_cached + 1
    assert record.context_tokens == body["tokens_cached"] + 1
    assert record.decode_tokens == timings["predicted_n"] < request["n_predict"]
    assert record.context_limit_tokens == N_CTX
    alerts = [a for s in snapshots for a in overflow_alerts(s)]
    assert alerts, server.log_tail()
    assert seen_s <= ALERT_WITHIN_S and len(snapshots) <= 2, seen_s
    alert = alerts[-1]
    assert alert.evidence["cause"] == "cut_short"
    assert alert.evidence["source"] == LOG_SOURCE
    assert f"stopped an answer after {timings['predicted_n']} tokens" in alert.message
    print(f"alert {seen_s:.2f} s after the answer:", alert.message, timings, sep="\n")
    assert alert.evidence["answer_tokens"] == timings["predicted_n"]
    assert alert.evidence["context_tokens"] == N_CTX
    # A request the server ran is recorded from its slots: the log's record only informs the alert.
    assert [row for row in _request_rows() if row["source"] == LOG_SOURCE] == []


class PipedLlamaServer(LlamaServer):
    """A llama-server whose stdout and stderr are a pipe (as under a supervisor that captures them),
    drained by a thread so it never blocks on a full pipe."""

    def _spawn(self) -> None:
        self._process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        stream = self._process.stdout
        assert stream is not None

        def drain() -> None:
            with stream:
                while stream.read(4096):
                    pass

        self._drain = threading.Thread(target=drain, name="llama-pipe-drain", daemon=True)
        self._drain.start()

    def stop(self) -> None:
        super().stop()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.join(timeout=10.0)  # the pipe ends with the process: the stream closes


def test_a_server_logging_to_a_pipe_gives_no_records_and_says_why_once(
    llama_binary: Path, model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trayapp.sources.servers.llamacpp")
    server = PipedLlamaServer(model_path, binary=llama_binary, ctx_size=N_CTX, log_dir=tmp_path)
    with server:
        pid = server.pid
        probe = LlamaCppProbe(server.url)
        try:
            readings = [probe.poll(0.0)]
            status, body = post_completion(
                server.url, {"prompt": LONG_PROMPT, "n_predict": 8, "cache_prompt": False}
            )
            readings += [probe.poll(float(i)) for i in range(1, 4)]
        finally:
            probe.close()
    assert status == 400 and body["error"]["n_prompt_tokens"] > N_CTX, body
    assert all(r.status == "ok" for r in readings), readings[-1].reason
    assert [f for r in readings for f in r.finished if f.source == LOG_SOURCE] == []
    assert probe.log_reason is not None and "which is a pipe" in probe.log_reason
    assert f"(pid {pid})" in probe.log_reason and "--log-file" in probe.log_reason
    said = [r.getMessage() for r in caplog.records if "context overflow from" in r.getMessage()]
    assert len(said) == 1 and "which is a pipe" in said[0], said
