"""Queue wait and who asked (#22), against the real llama-server with one slot (`-np 1`): two client
processes send at once through the recording proxy. The second waits for the slot while the first
generates; its record's queue wait must equal, within one poll (1 s), the first request's remaining
time at the moment the second was sent, by the server's own timings (the first's first text plus its
`predicted_ms`); each record names its client's process (pid, and the name the kernel gives it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.llama import LlamaServer
from tests.support.proxy import running_proxy

pytestmark = pytest.mark.llamacpp

POLL_S = 1.0  # the monitor's poll while something generates: the tolerance the issue names
CLIENT = """
import json, sys, time
import httpx
url, n_predict = sys.argv[1], int(sys.argv[2])
body = {"prompt": "Once upon a time", "n_predict": n_predict, "ignore_eos": True, "stream": True,
        "cache_prompt": False, "temperature": 0}
timings = None
with httpx.Client(timeout=600, trust_env=False) as client:
    print(json.dumps({"sent_mono_s": time.monotonic()}), flush=True)
    with client.stream("POST", url + "/completion", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content") and "first_text_mono_s" not in locals():
                first_text_mono_s = time.monotonic()
                print(json.dumps({"first_text_mono_s": first_text_mono_s}), flush=True)
            timings = event.get("timings") or timings
print(json.dumps({"timings": timings}), flush=True)
"""


def _client(url: str, n_predict: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CLIENT, url, str(n_predict)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _next(child: subprocess.Popen[str], key: str) -> Any:
    assert child.stdout is not None
    line = child.stdout.readline()  # the child prints as it goes; a dead one ends the line
    assert line, child.stderr.read() if child.stderr else "no output"
    return json.loads(line)[key]


@pytest.mark.timeout(600)
def test_the_second_client_waits_for_the_first_and_both_are_named(llama_server: LlamaServer) -> None:
    with running_proxy(llama_server.url, "llamacpp") as proxy:
        with httpx.Client(trust_env=False, timeout=300) as client:  # this host's speed now
            body = {"prompt": "Once upon a time", "n_predict": 16, "ignore_eos": True, "cache_prompt": False}
            warm = client.post(proxy.url + "/completion", json=body)
        rate_tok_s = warm.json()["timings"]["predicted_per_second"]
        first_n = max(24, min(4000, int(rate_tok_s * 5)))  # about 5 s of decoding here, fast host or slow
        proxy.records.wait_for(1, timeout_s=30)
        first = _client(proxy.url, first_n)
        second = None
        try:
            _next(first, "sent_mono_s")
            first_text_mono_s = _next(first, "first_text_mono_s")  # it holds the one slot now
            second = _client(proxy.url, 8)
            second_sent_mono_s = _next(second, "sent_mono_s")
            first_timings = _next(first, "timings")
            _next(second, "first_text_mono_s")
            _next(second, "timings")
            pids = {"first": first.pid, "second": second.pid}
            comms = {who: Path(f"/proc/{pid}/comm").read_text().strip() for who, pid in pids.items()}
            assert first.wait(60) == 0 and second.wait(60) == 0
        finally:
            for child in (first, second):
                if child is not None:
                    if child.poll() is None:
                        child.kill()
                    child.communicate()  # reaps it and closes its pipes
        records = proxy.records.wait_for(3, timeout_s=30)[1:]
    by_pid = {record.client_pid: record for record in records}
    assert set(by_pid) == set(pids.values()), records
    for who, pid in pids.items():
        assert by_pid[pid].client_name == comms[who]  # the kernel's name of that process
    first_end_mono_s = first_text_mono_s + first_timings["predicted_ms"] / 1000  # by the server's own clock
    remaining_s = first_end_mono_s - second_sent_mono_s
    waited_s = by_pid[pids["second"]].queue_wait_s
    print(f"first: {first_n} tokens at {rate_tok_s:.1f} tok/s; second waited {waited_s} s, the first had "
          f"{remaining_s:.2f} s left")  # fmt: skip
    assert remaining_s > POLL_S  # the case is a real wait, not one lost in the tolerance
    assert waited_s is not None and abs(waited_s - remaining_s) <= POLL_S
    first_waited_s = by_pid[pids["first"]].queue_wait_s
    assert first_waited_s is not None and first_waited_s < POLL_S  # the slot was free for the first


@pytest.mark.timeout(600)
def test_the_live_queue_count_holds_between_scrapes_and_clears_when_the_slot_frees(
    llama_server: LlamaServer,
) -> None:
    """llama-server's `requests_deferred` is read once per /metrics scrape (every 10 s while busy): the
    count must show on every tick while the slot stays busy, not one tick in ten (seen as a user), and
    drop to 0 the tick the slot frees."""
    from tests.support.llama import monitor_for, tick_until

    with httpx.Client(trust_env=False, timeout=300) as client:  # this host's speed now
        body = {"prompt": "Once upon a time", "n_predict": 16, "ignore_eos": True, "cache_prompt": False}
        rate_tok_s = client.post(llama_server.url + "/completion", json=body).json()["timings"][
            "predicted_per_second"
        ]
    first_n = max(64, min(8000, int(rate_tok_s * 25)))  # ~25 s of decoding: two scrapes fall inside
    monitor = monitor_for(llama_server.url)
    first = _client(llama_server.url, first_n)
    second = None
    try:
        _next(first, "sent_mono_s")
        _next(first, "first_text_mono_s")
        second = _client(llama_server.url, 4)
        _next(second, "sent_mono_s")

        def queued(snapshot: Any) -> int | None:
            (model,) = [m for s in snapshot.servers for m in s.models]
            return model.queued_requests

        seen = tick_until(monitor, lambda snap: queued(snap) == 1, limit_s=60)
        assert queued(seen[-1]) == 1, [queued(s) for s in seen]
        counts: list[int | None] = []
        pace = threading.Event()
        while second.poll() is None and first.poll() is None and len(counts) < 8:  # the second waits
            counts.append(queued(monitor.tick()))
            pace.wait(1.0)  # the monitor's cadence while something generates
        assert len(counts) >= 3 and all(count == 1 for count in counts[:-1]), counts  # the last: the end
        assert first.wait(120) == 0 and second.wait(120) == 0
        after = tick_until(monitor, lambda snap: queued(snap) == 0, limit_s=30)
        assert queued(after[-1]) == 0
    finally:
        monitor.close()
        for child in (first, second):
            if child is not None:
                if child.poll() is None:
                    child.kill()
                child.communicate()
