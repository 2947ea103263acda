"""Prefill total and ETA through the recording proxy, on a real llama-server (issue #11).

llama-server's `/slots` never says how long a prompt is; the proxy counts a proxied prompt with the
server's own `/apply-template` + `/tokenize` and the monitor puts that total beside the polled
progress. Set up as the tray runs it — the real Monitor with a recording proxy in front of the
server and the sampler's snapshot endpoint — while a real `llm-tray watch --json` answers from
that sampler, as a user's would. A ~3,000-token chat prompt is read in 64-token batches: the
total must equal the server's own `prompt_n + cache_n` for that request (exact), the tokens read
must rise to it and the ETA fall, all before the first token. Every wait is bounded.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import WatchToFile
from tests.support.llama import LlamaServer, monitor_for
from tests.support.proxy import running_proxy
from trayapp.core.glance import prefill_line
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.jsonview import snapshot_json
from trayapp.core.model import Snapshot
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sinks.snapshot_server import SnapshotServer

pytestmark = pytest.mark.llamacpp

BATCH_TOKENS = 64
PROMPT_SENTENCES = 210  # ~14 tokens each: ~3,000 tokens, 20-60 s of prefill on 2 shared cores
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


def _model_doc(doc: dict[str, Any]) -> dict[str, Any] | None:
    servers = doc["servers"]
    if not servers or not servers[0]["models"]:
        return None
    model: dict[str, Any] = servers[0]["models"][0]
    return model


def _phase(snapshot: Snapshot) -> str | None:
    model = _model_doc(snapshot_json(snapshot))
    return model["phase"] if model else None


def _past_prefill(watch: WatchToFile) -> bool:
    """Whether watch printed a line after the prefill ones (it followed the sampler to the end)."""
    phases = [(_model_doc(line) or {}).get("phase") for line in watch.lines()]
    return "prefill" in phases and any(p != "prefill" for p in phases[phases.index("prefill") :])


def _sample(monitor: Any, sampler: SnapshotServer, until: Any, limit_s: float) -> list[Snapshot]:
    """The tray's sampler loop: tick once a second and publish, until `until(snapshot)` (bounded)."""
    snapshots: list[Snapshot] = []
    pace = threading.Event()
    deadline = time.monotonic() + limit_s
    while True:
        snapshots.append(monitor.tick())
        sampler.publish(snapshots[-1])
        if until(snapshots[-1]) or time.monotonic() >= deadline:
            return snapshots
        pace.wait(1.0)


def test_proxied_prompt_has_a_total_and_a_falling_eta(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """About 40-80 s on a 2-core host."""
    prompt = "The quick brown fox jumps over the lazy dog near the river bank. " * PROMPT_SENTENCES
    server = LlamaServer(
        model_path, binary=llama_binary, ctx_size=4096, threads=1, log_dir=tmp_path,
        extra_args=["-b", str(BATCH_TOKENS), "-ub", str(BATCH_TOKENS)],
    )  # fmt: skip
    with server:
        inbox = RecordInbox([server.url])
        monitor = monitor_for(server.url, profile=PROFILE, proxy_inbox=inbox)
        sampler = SnapshotServer().start(announce=True)  # the sampler file: watch answers from it
        watch: WatchToFile | None = None
        try:
            with running_proxy(server.url, "llamacpp", prompts=inbox) as proxy:
                _sample(monitor, sampler, lambda s: _phase(s) == "idle", limit_s=60.0)
                watch = WatchToFile(tmp_path, "--duration", "300")
                watch.wait_line(lambda line: _model_doc(line) is not None, 30.0, "watch's first line")
                request = _stream_chat(proxy.url, prompt)
                done = lambda s: _phase(s) == "decoding" or request.done()  # noqa: E731
                snapshots = _sample(monitor, sampler, done, limit_s=PREFILL_LIMIT_S)
                timings = request.result(timeout=PREFILL_LIMIT_S)
                proxy.records.wait_for(1)
                left_on_board = inbox.prompt_totals(server.url)
                _sample(monitor, sampler, lambda s: True, limit_s=1.0)  # one more line for watch
                watch.wait_line(lambda _: _past_prefill(watch), 30.0, "watch printing past the prefill")
        finally:
            code = watch.stop() if watch is not None else 0
            sampler.stop(2.0)
            monitor.close()
        log_tail = server.log_tail()
    assert code == 0, watch.err_path.read_text()[-2000:] if watch else ""
    assert "answering from the running sampler" in watch.err_path.read_text()

    assert timings, log_tail
    server_total = timings["prompt_n"] + timings.get("cache_n", 0)
    # What the user's `watch --json` printed (the sampler's documents, one per tick).
    prefill = [m for m in map(_model_doc, watch.lines()) if m is not None and m["phase"] == "prefill"]
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
