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
import time
from pathlib import Path
from typing import Any

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
from tests.support.proxy import running_proxy
from trayapp.core.model import FinishedRequest, Snapshot
from trayapp.services.proxy.inbox import RecordInbox

pytestmark = pytest.mark.llamacpp


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
            status, body = post_completion(proxy.url, request)
            answered = time.monotonic()
            snapshots = tick_until_alert(monitor, answered)
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
    alerts = [a for s in snapshots for a in overflow_alerts(s)]
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
        status, body = post_completion(fixed.url, request)
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
    alerts = [a for s in snapshots for a in overflow_alerts(s)]
    assert alerts, server.log_tail()
    assert seen_s <= ALERT_WITHIN_S and len(snapshots) <= 2, seen_s
    alert = alerts[-1]
    assert alert.evidence["cause"] == "cut_short"
    assert f"stopped an answer after {timings['predicted_n']} tokens" in alert.message
    assert alert.evidence["answer_tokens"] == timings["predicted_n"]
    assert alert.evidence["context_tokens"] == N_CTX
