"""Prefill total and ETA through the recording proxy, on a real llama-server (issue #11).

llama-server's `/slots` never says how long a prompt is; the proxy counts a proxied prompt with the
server's own `/apply-template` + `/tokenize` and the monitor puts that total beside the polled
progress. The document checked is `status --json` / `watch --json`'s (core/jsonview.py), built
from the real Monitor's snapshots while a ~2,000-token chat prompt is read in 64-token batches.
The total must equal the server's own `prompt_n + cache_n` for that request (exact), the tokens
read must rise to it, and the ETA must fall, all before the first token. Every wait is bounded.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.llama import LlamaServer, monitor_for, tick_until
from tests.support.proxy import running_proxy
from trayapp.adapters.proxy.inbox import RecordInbox
from trayapp.core.glance import prefill_line
from trayapp.core.jsonview import snapshot_json
from trayapp.core.model import HardwareProfile, Snapshot

pytestmark = pytest.mark.llamacpp

BATCH_TOKENS = 64
PROMPT_SENTENCES = 140  # ~14 tokens each: ~2,000 tokens, 10-30 s of prefill on 2 shared cores
PREFILL_LIMIT_S = 150.0
N_PREDICT = 24
PROFILE = HardwareProfile(ram_bandwidth_gbps=54.0)  # given: no RAM benchmark competes for the cores


def _stream_chat(url: str, prompt: str) -> Future[dict[str, Any]]:
    """A streamed chat completion through `url` in a thread; the future holds the last `timings`."""
    future: Future[dict[str, Any]] = Future()
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": N_PREDICT,
        "stream": True,
        "cache_prompt": False,
    }

    def run() -> None:
        try:
            timings: dict[str, Any] = {}
            with (
                httpx.Client(trust_env=False, timeout=PREFILL_LIMIT_S + 60) as client,
                client.stream("POST", url + "/v1/chat/completions", json=body) as response,
            ):
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        timings = json.loads(line[6:]).get("timings") or timings
            future.set_result(timings)
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="chat-through-proxy", daemon=True).start()
    return future


def _model_doc(snapshot: Snapshot) -> dict[str, Any] | None:
    servers = snapshot_json(snapshot)["servers"]
    if not servers or not servers[0]["models"]:
        return None
    model: dict[str, Any] = servers[0]["models"][0]
    return model


def _phase(snapshot: Snapshot) -> str | None:
    model = _model_doc(snapshot)
    return model["phase"] if model else None


def test_proxied_prompt_has_a_total_and_a_falling_eta(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """About 30-45 s on a 2-core host."""
    prompt = "The quick brown fox jumps over the lazy dog near the river bank. " * PROMPT_SENTENCES
    server = LlamaServer(
        model_path, binary=llama_binary, ctx_size=4096, threads=1, log_dir=tmp_path,
        extra_args=["-b", str(BATCH_TOKENS), "-ub", str(BATCH_TOKENS)],
    )  # fmt: skip
    with server:
        inbox = RecordInbox([server.url])
        monitor = monitor_for(server.url, profile=PROFILE, proxy_inbox=inbox)
        try:
            with running_proxy(server.url, "llamacpp", prompts=inbox) as proxy:
                tick_until(monitor, lambda s: _phase(s) == "idle", limit_s=60.0)
                request = _stream_chat(proxy.url, prompt)
                snapshots = tick_until(
                    monitor, lambda s: _phase(s) == "decoding" or request.done(), limit_s=PREFILL_LIMIT_S
                )
                timings = request.result(timeout=PREFILL_LIMIT_S)
                proxy.records.wait_for(1)
                left_on_board = inbox.prompt_totals(server.url)
        finally:
            monitor.close()
        log_tail = server.log_tail()

    assert timings, log_tail
    server_total = timings["prompt_n"] + timings.get("cache_n", 0)
    prefill = [m for m in map(_model_doc, snapshots) if m is not None and m["phase"] == "prefill"]
    counted = [m for m in prefill if m["prefill_tokens_total"] is not None]
    print(
        f"server: {server_total} prompt tokens; seen (done, total, eta_s): "
        f"{[(m['prefill_tokens_done'], m['prefill_tokens_total'], m['prefill_eta_s']) for m in prefill]}"
    )
    assert len(counted) >= 3, prefill
    # The total is the server's own count of that request's prompt, exactly.
    assert {m["prefill_tokens_total"] for m in counted} == {server_total}
    done = [m["prefill_tokens_done"] for m in counted]
    assert done == sorted(done) and len(set(done)) >= 3, done
    assert all(0 <= n <= server_total for n in done), done
    # The ETA is there once a rate is, and falls as the prompt is read.
    etas = [m["prefill_eta_s"] for m in counted if m["prefill_eta_s"] is not None]
    assert len(etas) >= 2, counted
    assert etas[-1] < etas[0], etas
    # The tooltip's words carry the total and the share.
    last = next(s for s in reversed(snapshots) if _phase(s) == "prefill")
    (model,) = [m for _, m in last.models()]
    line = prefill_line(model)
    assert " / " in line and "%" in line and "~" in line, line
    # Once its first token came, the prompt is off the board.
    assert left_on_board == [], left_on_board
