"""The monitor against a real llama-server serving a real GGUF model (issues 2, 3 and 4).

The server runs with `-t 1` so the code under test keeps a core; generation is
driven by a *separate* client, exactly as a user's editor would.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Watch, run_cli
from tests.support.llama import (
    LlamaServer,
    OpenEndedGeneration,
    decode_rate,
    generate,
    generate_in_background,
    monitor_for,
    server_rate_of_window,
    tick_until,
    tick_until_done,
    tokens_lasting,
)
from trayapp.config.settings import MonitorConfig, Settings
from trayapp.core.rates import RATE_WINDOW_S
from trayapp.core.thresholds import Thresholds
from trayapp.services.poll_thread import wait_for_next_tick

pytestmark = pytest.mark.llamacpp


def test_measured_decode_never_exceeds_the_ceiling(llama_server: LlamaServer, model_path: Path) -> None:
    result = run_cli("ceiling", "--model", str(model_path), "--context", "512", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ceiling = report["ceiling_tok_s"]
    assert report["exact"] is True
    assert report["bytes_per_token"] > 200_000_000  # the tied Q8_0 embedding is read every token

    generate(llama_server.url, "Count slowly:", 16)  # warm-up (the seeds' procedure: discard the first run)
    measured = generate(llama_server.url, "Tell me about the sea.", 128, ignore_eos=True)["timings"][
        "predicted_per_second"
    ]
    assert measured <= ceiling, f"decode {measured:.1f} tok/s above the {ceiling:.1f} tok/s ceiling"
    # Units, by hand from the report's own figures: bandwidth (GB/s) ÷ bytes read per token at this
    # context. The measured speed bounds the ceiling from below only: on a busy host the same model
    # decodes 10× slower than alone (9.8 of 82 tok/s seen), so a lower bound on it would test the host.
    assert ceiling == pytest.approx(
        report["bandwidth_gbps"] * 1e9 / report["bytes_per_token_at_context"], rel=5e-3
    )
    assert 2 <= report["ram_bandwidth_gbps"] <= 2000, report["ram_bandwidth_gbps"]  # GB/s, not bits or MB


def test_watch_reports_the_servers_own_decode_rate(llama_server: LlamaServer) -> None:
    """`watch --json` runs until the request has finished and the server is idle again (waited on,
    never a fixed duration: a slow host only makes it longer). The request decodes ~12 s at the server's
    own speed now (400 tokens lasted 4 s on a fast host: 7 lines). About 15–30 s.

    Each live rate is compared with the server's own rate over the same tokens (its per-token
    timings): a busy host swings the speed within a request, so the request's average is no oracle
    for a 4 s window (cc67, beside two busy processes: the ticks' mean 14 % under the average)."""
    tokens = tokens_lasting(decode_rate(llama_server.url), 12.0)
    watch = Watch("--interval", "1", "--duration", "300", "--endpoint", llama_server.url, "--no-discover")
    try:
        assert watch.next_line() is not None  # watching before the request starts
        future = generate_in_background(
            llama_server.url,
            "Write a long story about a lighthouse.",
            tokens,
            ignore_eos=True,
            stream=True,
            timings_per_token=True,
        )
        while not future.done():
            assert watch.next_line() is not None, "watch ended before the request did"
        result = future.result()
        timings = result["timings"]
        for _ in range(30):  # then until a tick shows the server idle (bounded)
            line = watch.next_line()
            assert line is not None, "watch ended before the server went idle"
            if line["servers"][0]["models"][0]["phase"] == "idle":
                break
        assert watch.ctrl_c() == 0, watch.stderr()  # Ctrl-C: watch exits 0
    finally:
        watch.stop()
    lines = watch.lines
    assert len(lines) >= 10
    models = [line["servers"][0]["models"][0] for line in lines]
    phases = [m["phase"] for m in models]
    assert "decoding" in phases and phases[-1] == "idle"
    rates = [m["decode_tok_s"] for m in models if m["phase"] == "decoding" and m["decode_tok_s"]]
    assert len(rates) >= 3
    assert all(m["decode_exact"] is False for m in models if m["decode_tok_s"])
    # each live rate against the server's own over the tokens of its window
    prompt_tokens = timings["prompt_n"] + timings.get("cache_n", 0)
    decoding = [(line["t"], m) for line, m in zip(lines, models, strict=True) if m["phase"] == "decoding"]
    ticks = [(t_s, m["context_tokens"]) for t_s, m in decoding]
    ratios = []
    for i, (_, m) in enumerate(decoding):
        own = server_rate_of_window(ticks, i, prompt_tokens, result["decode_ms_by_token"], RATE_WINDOW_S)
        if m["decode_tok_s"] and own is not None:
            ratios.append(m["decode_tok_s"] / own)
    assert len(ratios) >= 3, (ratios, decoding)
    assert statistics.median(ratios) == pytest.approx(1.0, rel=0.10), ratios
    contexts = [m["context_tokens"] for m in models if m["phase"] == "decoding" and m["context_tokens"]]
    assert contexts == sorted(contexts) and contexts[-1] > contexts[0]
    assert all(m["ceiling_tok_s"] and m["ceiling_tok_s"] > 0 for m in models)


@pytest.fixture
def own_server(llama_binary: Path, model_path: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(model_path, binary=llama_binary, log_dir=tmp_path) as server:
        yield server


def test_monitoring_recovers_after_a_server_restart(own_server: LlamaServer) -> None:
    tokens = tokens_lasting(decode_rate(own_server.url), 6.0)  # several 1 s polls on any host
    monitor = monitor_for(own_server.url)
    try:
        assert monitor.tick().servers[0].status == "ok"
        snapshots = tick_until_done(
            monitor, generate_in_background(own_server.url, "Hello", tokens, ignore_eos=True)
        )
        assert any(m.decode_tok_s for s in snapshots for _, m in s.models())

        own_server.kill()
        down = monitor.tick()
        assert down.servers[0].status == "unreachable"
        assert down.servers[0].reason

        own_server.restart()
        future = generate_in_background(own_server.url, "Hello again", tokens, ignore_eos=True)
        after = tick_until_done(monitor, future)
        assert after[-1].servers[0].status == "ok"
        rates = [m.decode_tok_s for s in after for _, m in s.models() if m.decode_tok_s is not None]
        assert rates, "no live rate after the restart"
        server_rate = future.result()["timings"]["predicted_per_second"]
        assert all(0 < r < 3 * server_rate for r in rates), f"bogus rate after restart: {rates}"
    finally:
        monitor.close()


@pytest.fixture
def full_kv_server(llama_binary: Path, model_path: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    """`--swa-full -fa off`: every layer keeps and reads its whole KV cache, without flash attention.

    With the defaults (sliding-window cache, flash attention on) only 3 of the 18 layers grow and the
    drop at ~7,000 tokens was 11 % on one host and nothing at all on another (CI). Without flash
    attention the attention reads scale with the context on any CPU: ~34 % slower at ~3,400 tokens
    on a loaded host, 23 % on a loaded CI host, but only 16 % at ~4,200 tokens on a quiet CI host —
    too near the default 15 % threshold to judge. The test goes to ~6,000 tokens with a 10 % threshold.
    """
    extra = ["--swa-full", "-fa", "off"]
    with LlamaServer(model_path, binary=llama_binary, log_dir=tmp_path, extra_args=extra) as server:
        yield server


KV_THRESHOLD_PCT = 10.0  # the user's setting here (default 15 %): the judged drop is clear of it
JUDGE_MARGIN_PCT = 6.0  # the polled drop follows the server's own to a few points


@pytest.mark.timeout(900)  # a ~6,000-token prefill on one thread: minutes beside a busy neighbour
def test_long_context_raises_kv_slowdown_matching_server_timings(full_kv_server: LlamaServer) -> None:
    """The alert follows the server's own timings of the same two requests (a 10 % threshold)."""
    llama_server = full_kv_server
    threshold_pct = KV_THRESHOLD_PCT
    settings = Settings(thresholds=Thresholds(kv_slowdown_pct=threshold_pct))
    monitor = monitor_for(llama_server.url, settings=settings)
    try:
        monitor.tick()
        short = generate_in_background(llama_server.url, "Say hello.", 256, ignore_eos=True)
        snapshots = tick_until_done(monitor, short)
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 600  # ~6,000 tokens
        deep = generate_in_background(llama_server.url, long_prompt, 256, ignore_eos=True, timeout_s=800)
        snapshots += tick_until_done(monitor, deep, limit_s=800)
        short_rate = short.result()["timings"]["predicted_per_second"]
        deep_timings = deep.result()["timings"]
        assert deep_timings["prompt_n"] + deep_timings.get("cache_n", 0) > 5500
    finally:
        monitor.close()

    kv_alerts = {a.id: a for s in snapshots for a in s.alerts if a.kind == "kv_slowdown"}
    trend = [
        (m.context_tokens, round(m.decode_tok_s, 1))
        for s in snapshots
        for _, m in s.models()
        if m.decode_tok_s
    ]
    server_drop = 100 * (1 - deep_timings["predicted_per_second"] / short_rate)
    session_ids = sorted({m.session_id for s in snapshots for _, m in s.models() if m.session_id})
    observed = (
        f"server: {short_rate:.1f} → {deep_timings['predicted_per_second']:.1f} tok/s "
        f"({server_drop:.0f} % drop); "
        f"polled (context, tok/s): {trend}; sessions: {session_ids}; "
        f"statuses: {sorted({s.servers[0].status for s in snapshots})}"
    )
    if server_drop < threshold_pct - JUDGE_MARGIN_PCT:
        assert not kv_alerts, f"kv_slowdown raised though the server itself did not slow down; {observed}"
        pytest.skip(f"server barely slowed; only 'no false alarm' checked: {observed}")
    if server_drop < threshold_pct + JUDGE_MARGIN_PCT:
        pytest.skip(f"the server's own drop is too near {threshold_pct:g} % to judge; {observed}")
    assert len(kv_alerts) == 1, f"expected one kv_slowdown episode, got {list(kv_alerts)}; {observed}"
    alert = next(iter(kv_alerts.values()))
    evidence: Mapping[str, Any] = alert.evidence
    assert evidence["short_decode_tok_s"] == pytest.approx(short_rate, rel=0.15)
    assert evidence["decode_tok_s"] == pytest.approx(deep_timings["predicted_per_second"], rel=0.15)
    assert evidence["drop_pct"] == pytest.approx(server_drop, abs=10)
    assert evidence["context_tokens"] > 5500
    assert not any(a.kind == "offload" for s in snapshots for a in s.alerts)


def test_a_finished_request_gets_the_servers_own_rate_at_once(llama_server: LlamaServer) -> None:
    """The probe scrapes /metrics in the poll that sees a request end (not only every 10 s): the
    model's last rate is then the server's own tokens ÷ seconds of that request, exact."""
    # Long enough that polls every 0.25 s see it running on the fastest host (32 tokens once
    # finished between two 1 s polls on a quick CPU), short enough for a slow one.
    tokens = tokens_lasting(decode_rate(llama_server.url), 3.0)
    monitor = monitor_for(llama_server.url)
    try:
        monitor.tick()  # the first scrape: counters before the request
        future = generate_in_background(llama_server.url, "Name a river.", tokens, ignore_eos=True)
        snapshots = tick_until_done(monitor, future, interval_s=0.25)
    finally:
        monitor.close()
    timings = future.result()["timings"]
    counted_tok_s = timings["predicted_n"] / (timings["predicted_ms"] / 1000)  # what the counters hold
    models = [s.servers[0].models[0] for s in snapshots]
    busy = [i for i, m in enumerate(models) if m.phase in ("prefill", "decoding")]
    assert busy, "no poll saw the request"
    after = [m for m in models[busy[-1] + 1 :] if m.phase == "idle"]
    assert after, "the model never showed idle after the request"
    first_idle = after[0]  # the poll that saw the request end
    assert first_idle.decode_exact is True
    assert first_idle.last_decode_tok_s == pytest.approx(counted_tok_s, rel=1e-3)


def test_a_server_silent_in_the_middle_of_a_request_keeps_its_session(llama_server: LlamaServer) -> None:
    """A long prompt batch on a busy CPU keeps llama-server from answering polls for minutes; here
    the server is stopped for real (SIGSTOP) for 15 s in the middle of a request, with a 6 s idle gap:
    the polls time out (read timeouts, then connect timeouts once its listen queue is full: `error`,
    then `unreachable`), yet the request's session goes on when it answers again (it used to end,
    and the rest of the request began a new session, losing the conversation's KV trend). ~30 s."""
    assert llama_server.pid is not None
    tokens = tokens_lasting(decode_rate(llama_server.url), 8.0)  # still decoding when it is stopped
    monitor = monitor_for(llama_server.url, settings=Settings(monitor=MonitorConfig(session_idle_gap_s=6.0)))
    try:
        monitor.tick()
        future = generate_in_background(llama_server.url, "Tell me a long story.", tokens, ignore_eos=True)
        before = tick_until(
            monitor, lambda s: any(m.phase == "decoding" for _, m in s.models()), limit_s=120, interval_s=0.25
        )
        if not any(m.phase == "decoding" for _, m in before[-1].models()):
            pytest.fail("no poll saw the request decode")
        os.kill(llama_server.pid, signal.SIGSTOP)
        try:
            silent = tick_until(monitor, lambda _: False, limit_s=15.0)
        finally:
            os.kill(llama_server.pid, signal.SIGCONT)
        after = tick_until_done(monitor, future)
    finally:
        monitor.close()
    assert {s.servers[0].status for s in silent} & {"error", "unreachable"}  # no answer in time
    assert future.result()["timings"]["predicted_n"] == tokens  # the request went on after the pause
    sessions = {m.session_id for s in before + silent + after for _, m in s.models() if m.session_id}
    seen = [
        (s.servers[0].status, s.servers[0].reason, [(m.name, m.phase, m.session_id) for _, m in s.models()])
        for s in before + silent + after
    ]
    assert len(sessions) == 1, (sessions, seen)


def test_a_real_requests_energy_is_measured_or_unavailable_with_the_reason(llama_server: LlamaServer) -> None:
    """#21: on this machine a real request's energy is either measured (RAPL readable, or an NVIDIA GPU)
    or marked unavailable with the reason: never 0, never invented. What the machine offers is looked
    up here on its own (sysfs, /dev/nvidia0), not through the product's probes. No timing thresholds."""
    monitor = monitor_for(llama_server.url)
    try:
        idle = tick_until(monitor, lambda _: False, limit_s=2.0, interval_s=0.5)  # a few idle ticks
        future = generate_in_background(llama_server.url, "Name a river.", 48, ignore_eos=True)
        snapshots = idle + tick_until_done(monitor, future, interval_s=0.5)
    finally:
        monitor.close()
    records = [r for s in snapshots for r in s.requests]
    assert records, "no request record"
    rapl_readable = False
    for counter in Path("/sys/class/powercap").glob("*rapl*:*/energy_uj"):
        try:
            counter.read_text()
            rapl_readable = True
        except OSError:
            pass
    can_measure = rapl_readable or Path("/dev/nvidia0").exists() or sys.platform == "darwin"
    for record in records:
        figures = (record.energy_prefill_j, record.energy_decode_j, record.energy_j_per_token)
        assert all(f is None or f > 0 for f in figures), record  # never 0 (or less)
        if all(f is None for f in figures):
            assert record.energy_reason, record  # unavailable: the reason is given
        else:
            assert record.energy_source and record.energy_idle_w is not None, record
        if not can_measure:
            assert all(f is None for f in figures), record  # nothing to read here: nothing invented
            assert "RAPL" in (record.energy_reason or ""), record
    energy = snapshots[-1].energy
    assert energy is not None
    if not can_measure:
        assert energy.power_w is None and energy.reason and "RAPL" in energy.reason


def test_an_idle_monitor_sees_a_request_start_within_a_look_not_a_poll(llama_server: LlamaServer) -> None:
    """Idle, the monitor polls every 5 s; between polls it looks at the server's CPU each second
    (`wait_for_next_tick`, the agent's wait; the tray's worker does the same), so a request sent
    straight to the server is seen at the first look, not up to 5 s later: a request of a few seconds
    is seen running, with its live rate. (Before, one that ended within the 5 s was never seen.)"""
    monitor = monitor_for(llama_server.url)
    stop = threading.Event()
    try:
        monitor.tick()
        monitor.tick()  # idle: the next poll is poll_idle_s away
        assert monitor.next_interval_s() == MonitorConfig().poll_idle_s == 5.0
        generation = OpenEndedGeneration(llama_server.url, "Tell a story.")  # until stopped: any host's pace
        started_s = time.monotonic()
        try:
            wait_for_next_tick(monitor, stop)
            waited_s = time.monotonic() - started_s
            first = monitor.tick().servers[0].models[0]
            later = tick_until(monitor, lambda s: s.servers[0].models[0].decode_tok_s is not None, limit_s=60)
        finally:
            tokens = generation.stop()
    finally:
        monitor.close()
    assert waited_s < MonitorConfig().poll_idle_s, f"the poll waited {waited_s:.1f} s: no look saw the work"
    assert first.phase in ("prefill", "decoding"), first.phase
    rate = later[-1].servers[0].models[0].decode_tok_s
    assert rate is not None and rate > 0 and tokens > 0
