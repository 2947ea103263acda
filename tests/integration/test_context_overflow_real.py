"""A real llama-server whose context is too small (#20): through the recording proxy, as the tray
runs it (the real Monitor ticking once a second with the proxy's records in its inbox).

- a prompt longer than the context is refused (HTTP 400): the record holds the server's own two
  numbers from the body the client got, and `context_overflow` fires within 2 s of that answer,
  once, with a fix; the server started again with the fix's own `-c` value answers the same request;
- a generation that runs into the context's end is recorded as cut short, with the server's own
  `truncated: true` as evidence.

Every number is compared with what the server said for the same request. Every wait is bounded.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.llama import LlamaServer, monitor_for
from tests.support.proxy import running_proxy
from trayapp.core.model import Alert, FinishedRequest, HardwareProfile, Snapshot
from trayapp.services.monitor import Monitor
from trayapp.services.proxy.inbox import RecordInbox

pytestmark = pytest.mark.llamacpp

N_CTX = 256
ALERT_WITHIN_S = 2.0
PROFILE = HardwareProfile(ram_bandwidth_gbps=30.0)  # given: no RAM benchmark competes for the cores
LONG_PROMPT = "word " * 400  # ~400 tokens: more than 256
FILLING_PROMPT = "word " * 200  # ~200 tokens: leaves ~55 for the answer


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with httpx.Client(trust_env=False, timeout=240) as client:
        response = client.post(url + "/completion", json=body)
    return response.status_code, response.json()


def _overflow_alerts(snapshot: Snapshot) -> list[Alert]:
    return [a for a in snapshot.alerts if a.kind == "context_overflow"]


def _tick_until_alert(monitor: Monitor, answered_mono_s: float, limit_s: float = 10.0) -> list[Snapshot]:
    """The sampler's loop (a tick a second) until the alert shows; each snapshot's tick time kept."""
    snapshots: list[Snapshot] = []
    pace = threading.Event()
    while time.monotonic() - answered_mono_s < limit_s:
        snapshots.append(monitor.tick())
        if _overflow_alerts(snapshots[-1]):
            break
        pace.wait(1.0)
    return snapshots


def _through_proxy(
    server: LlamaServer, request: dict[str, Any], ticks_after: int = 0
) -> tuple[int, dict[str, Any], FinishedRequest, list[Snapshot], float]:
    """One request through the recording proxy while the real Monitor ticks as the tray's sampler
    does: (HTTP status, body, the proxy's record, snapshots, seconds from the answer to the alert)."""
    inbox = RecordInbox([server.url])
    monitor = monitor_for(server.url, profile=PROFILE, proxy_inbox=inbox)
    try:
        with running_proxy(server.url, "llamacpp", inbox=inbox) as proxy:
            monitor.tick()
            status, body = _post(proxy.url, request)
            answered = time.monotonic()
            snapshots = _tick_until_alert(monitor, answered)
            seen_s = time.monotonic() - answered
            (record,) = proxy.records.wait_for(1)
            snapshots += [monitor.tick() for _ in range(ticks_after)]
    finally:
        monitor.close()
    return status, body, record, snapshots, seen_s


def test_a_refused_prompt_alerts_with_a_fix_that_works(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    server = LlamaServer(model_path, binary=llama_binary, ctx_size=N_CTX, log_dir=tmp_path)
    request = {"prompt": LONG_PROMPT, "n_predict": 8, "cache_prompt": False}
    with server:
        status, body, record, snapshots, seen_s = _through_proxy(server, request, ticks_after=3)
    error = body["error"]
    assert status == 400 and error["type"] == "exceed_context_size_error", body
    # The record holds the server's own two numbers.
    assert record.http_status == 400
    assert record.prompt_tokens_sent == error["n_prompt_tokens"] > N_CTX
    assert record.context_limit_tokens == error["n_ctx"] == N_CTX
    alerts = [a for s in snapshots for a in _overflow_alerts(s)]
    assert alerts, server.log_tail()
    # the first or second tick after the answer (the proxy files its record as the answer leaves it)
    assert seen_s <= ALERT_WITHIN_S and len(snapshots) - 3 <= 2, seen_s
    assert len({a.id for a in alerts}) == 1
    alert = alerts[-1]
    assert alert.evidence["cause"] == "rejected"
    assert f"refused a {error['n_prompt_tokens']}-token prompt" in alert.message
    assert alert.evidence["tokens_sent"] == error["n_prompt_tokens"]
    assert alert.evidence["context_tokens"] == error["n_ctx"]
    print(alert.message, alert.fix, alert.fix_commands, sep="\n")

    # Apply the printed flag: the same request now succeeds.
    (command,) = alert.fix_commands
    found = re.search(r"-c (\d+)", command)
    assert found is not None, command
    fixed_ctx = int(found.group(1))
    with LlamaServer(model_path, binary=llama_binary, ctx_size=fixed_ctx, log_dir=tmp_path) as fixed:
        status, body = _post(fixed.url, request)
    assert status == 200, body
    assert body["timings"]["prompt_n"] + body["timings"].get("cache_n", 0) == error["n_prompt_tokens"]
    assert body["truncated"] is False


def test_an_answer_that_runs_into_the_context_end_is_cut_short(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    server = LlamaServer(model_path, binary=llama_binary, ctx_size=N_CTX, log_dir=tmp_path)
    request = {"prompt": FILLING_PROMPT, "n_predict": 200, "cache_prompt": False}
    with server:
        status, body, record, snapshots, seen_s = _through_proxy(server, request)
    assert status == 200 and body["truncated"] is True and body["stop_type"] == "limit", body
    timings = body["timings"]
    assert record.stop_reason == "context"
    assert record.decode_tokens == timings["predicted_n"] < request["n_predict"]
    assert record.context_tokens == timings["prompt_n"] + timings.get("cache_n", 0) + timings["predicted_n"]
    alerts = [a for s in snapshots for a in _overflow_alerts(s)]
    assert alerts, server.log_tail()
    assert seen_s <= ALERT_WITHIN_S and len(snapshots) <= 2, seen_s
    alert = alerts[-1]
    assert alert.evidence["cause"] == "cut_short"
    assert f"stopped an answer after {timings['predicted_n']} tokens" in alert.message
    assert alert.evidence["answer_tokens"] == timings["predicted_n"]
    assert alert.evidence["context_tokens"] == N_CTX
