"""One record per request when a recording proxy is in front of a server (#12): the merge of the
server's own end-of-request records with the proxy's, and the rates stage on a proxied server."""

from __future__ import annotations

import pytest

from trayapp.core.loopback import same_server
from trayapp.core.model import FinishedRequest, ModelReading, ServerReading, SlotReading
from trayapp.core.rate_helpers import merge_proxy_records
from trayapp.core.rates import RateTracker
from trayapp.services.proxy.inbox import LEASE_END_GRACE_S, RecordInbox

URL = "http://127.0.0.1:8080"
MODEL = "qwen3-30b-a3b"
WALL0 = 1_750_000_000.0


def fin(
    source: str, decode_tokens: int | None, finished_wall_s: float, model: str = MODEL
) -> FinishedRequest:
    return FinishedRequest(
        model=model, finished_wall_s=finished_wall_s, decode_tokens=decode_tokens, source=source
    )


def test_the_proxys_record_replaces_the_servers_own_record_of_the_same_request() -> None:
    server = (
        fin("lms-log", 120, WALL0 + 0.4),
        fin("lms-log", 64, WALL0 - 300),
        fin("router-load", None, WALL0),
    )
    proxy = [fin("proxy", 120, WALL0)]
    merged = merge_proxy_records(server, proxy)
    # the same request (same model, 120 tokens, 0.4 s apart) once, as the proxy saw it; the request
    # that bypassed the proxy five minutes earlier and the router's measured load stay.
    assert sorted((r.source, r.decode_tokens) for r in merged) == sorted(
        [("lms-log", 64), ("router-load", None), ("proxy", 120)]
    )


def test_a_proxy_record_naming_the_model_file_is_the_servers_only_model() -> None:
    path_named = fin("proxy", 40, WALL0, model="/models/gemma-3-270m-q4_k_m.gguf")
    (merged,) = merge_proxy_records((), [path_named], ["gemma-3-270m"])
    assert merged.model == "gemma-3-270m"
    (kept,) = merge_proxy_records((), [path_named], ["a", "b"])  # a router: the name is not guessed
    assert kept.model == "/models/gemma-3-270m-q4_k_m.gguf"


def test_localhost_and_127_0_0_1_are_one_server() -> None:
    assert same_server("http://localhost:11434", "http://127.0.0.1:11434/")
    assert not same_server("http://127.0.0.1:11434", "http://127.0.0.1:11435")
    inbox = RecordInbox(["http://localhost:8080"])
    assert inbox.proxied(URL) and not inbox.proxied("http://127.0.0.1:1234")


def _poll(tracker: RateTracker, t_s: float, slot: SlotReading, proxied: bool) -> int:
    reading = ServerReading(
        kind="llamacpp",
        url=URL,
        status="ok",
        models=(ModelReading(name=MODEL, slots=(slot,)),),
        proxied=proxied,
    )
    return len(tracker.update(reading, t_s, WALL0 + t_s).requests)


def _busy(decoded: int) -> SlotReading:
    return SlotReading(
        slot_id=0, is_processing=True, task_id=7, n_decoded=decoded, context_tokens=20 + decoded
    )


IDLE = SlotReading(slot_id=0, is_processing=False, task_id=7, n_decoded=60, context_tokens=80)


def test_a_proxied_server_gives_no_polled_request_record() -> None:
    for proxied, expected in ((False, 1), (True, 0)):
        tracker = RateTracker()
        polls = [_busy(0), _busy(20), _busy(40), _busy(60)]
        records = sum(_poll(tracker, float(t), slot, proxied) for t, slot in enumerate(polls))
        records += _poll(tracker, 4.0, IDLE, proxied)
        assert records == expected, f"proxied={proxied}"  # the proxy reports that request exactly


def test_the_inbox_hands_records_over_once() -> None:
    inbox = RecordInbox([URL])
    inbox.put(URL, fin("proxy", 10, WALL0))
    assert [r.decode_tokens for _url, r in inbox.take()] == [10]
    assert inbox.take() == []


def test_a_stopped_proxys_servers_stay_proxied_past_the_next_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    # `llm-tray proxy` stopped just after recording a request; the slots show it finished only at the
    # sampler's next poll, which must still count the server as proxied (else a second, polled row)
    now = [1000.0]
    monkeypatch.setattr("trayapp.services.proxy.inbox.time.monotonic", lambda: now[0])
    inbox = RecordInbox()
    inbox.lend([URL], 30.0)
    inbox.lend([URL], 0.0)  # its last post: the lease ends
    now[0] += LEASE_END_GRACE_S - 0.1
    assert inbox.proxied(URL)
    now[0] += 0.2
    assert not inbox.proxied(URL)
