"""The real MLX-LM `mlx_lm.server` on a tiny model built here (issue #22; tests/support/mlx_model.py).

What must hold against the real server: discovery tells it apart from every other kind; its model is
listed on a machine with no Hugging Face cache folder (where `/v1/models` answers an empty body) and
on one with; a streamed request's record through the recording proxy is the server's own `usage`
(MLX-LM gives no timings: the decode rate is the proxy's measure, marked estimated); the monitor
shows the model decoding with a live rate while the answer streams, as the client saw it arrive;
and llm-tray polling at its normal rate never disturbs a long request. Every expected number comes
from the server's own answer of the same request, and every request is sized from the speed the
server showed on this host, so a host ten times slower only takes longer.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest

from tests.support.llama import monitor_for
from tests.support.mlx_model import MlxServer, StreamedChat, build_model, chat, mlx_available, raw_get
from tests.support.proxy import running_proxy
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import ModelStatus, Snapshot
from trayapp.core.rates import RATE_WINDOW_S
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.discovery import Discovery, Endpoint, identify
from trayapp.sources.http import make_client
from trayapp.sources.servers.openai_compat import MLX_REASON, MlxProbe

pytestmark = pytest.mark.mlx

PROFILE = HardwareProfile(ram_bandwidth_gbps=54.0)  # given: no RAM benchmark competes for the cores
LONG_REQUEST_S = 3.0  # the long requests are sized to take about this long at the measured speed
LIVE_REQUEST_S = 4.0
TICK_S = 0.25  # the live-rate test's tick cadence (the rate window is 4 s)


@pytest.fixture(scope="module")
def mlx_model_dir() -> Path:
    if not mlx_available():
        pytest.skip(
            "mlx / mlx-lm not installed (`pip install 'mlx[cpu]' mlx-lm tokenizers`: Linux x86_64/aarch64 "
            "or macOS on Apple silicon; tests/provision.sh installs them there)"
        )
    return build_model()


@pytest.fixture(scope="module")
def mlx_server(mlx_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlxServer]:
    """One real `mlx_lm.server` for the module, on a "fresh machine": no Hugging Face cache folder."""
    with MlxServer(mlx_model_dir, tmp_path_factory.mktemp("mlx")) as server:
        yield server


@pytest.fixture(scope="module")
def speed_tok_s(mlx_server: MlxServer) -> float:
    """The server's decode speed on this host, as a client sees it (a warm-up, then 200 tokens)."""
    chat(mlx_server.url, 16)
    seen = chat(mlx_server.url, 200)
    n, first, last = seen.received()
    assert n == 200 and first is not None and last is not None and last > first, mlx_server.log_tail()
    return (n - 1) / (last - first)


def _client_rate(seen: StreamedChat) -> float:
    n, first, last = seen.received()
    assert first is not None and last is not None and last > first
    return (n - 1) / (last - first)


def _client_rate_between(seen: StreamedChat, start_mono_s: float, end_mono_s: float) -> float | None:
    """Chunks the client received in [start, end] over the time between the first and the last."""
    with seen.lock:
        times = [t for t in seen.chunk_times_mono_s if start_mono_s <= t <= end_mono_s]
    if len(times) < 10 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def _in_background(url: str, max_tokens: int) -> tuple[StreamedChat, Future[StreamedChat]]:
    seen = StreamedChat()
    future: Future[StreamedChat] = Future()

    def run() -> None:
        try:
            future.set_result(chat(url, max_tokens, into=seen))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="mlx-chat", daemon=True).start()
    return seen, future


def _mlx_model(snapshot: Snapshot) -> ModelStatus | None:
    models = [m for s, m in snapshot.models() if s.kind == "mlx"]
    return models[0] if models else None


def test_discovered_and_its_model_listed_without_a_hugging_face_cache(
    mlx_server: MlxServer, mlx_model_dir: Path
) -> None:
    # The real answer that broke the listing: 200, then nothing (tests/fixtures/mlx/).
    head, _, body = raw_get(mlx_server.url, "/v1/models").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ") and body == b""
    with make_client() as client:
        kind, why = identify(mlx_server.url, client)
    assert kind == "mlx", why
    discovery = Discovery([Endpoint(mlx_server.url)], scan_defaults=False)
    try:
        (probe,) = discovery.refresh(0.0)
        reading = probe.poll(0.0)
    finally:
        discovery.close()
    assert isinstance(probe, MlxProbe) and reading.status == "ok", reading.reason
    (model,) = reading.models
    # Named as the server names it once it can list (its resolved --model folder), from its process.
    assert model.name == str(mlx_model_dir.resolve()) and model.loaded
    assert model.live_rate_reason == MLX_REASON
    assert reading.pid == mlx_server.pid


def test_listed_by_the_server_where_a_cache_folder_exists(mlx_model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    with MlxServer(mlx_model_dir, tmp_path, hf_cache=cache) as server:
        listed = httpx.get(server.url + "/v1/models", timeout=30.0).json()
        probe = MlxProbe(server.url)
        try:
            reading = probe.poll(0.0)
        finally:
            probe.close()
    assert [m["id"] for m in listed["data"]] == [str(mlx_model_dir.resolve())]
    assert [(m.name, m.loaded) for m in reading.models] == [(str(mlx_model_dir.resolve()), True)]


def test_a_streamed_request_through_the_proxy_is_recorded_as_the_server_counted_it(
    mlx_server: MlxServer, speed_tok_s: float
) -> None:
    max_tokens = max(50, round(speed_tok_s * 1.0))  # about a second on this host
    with running_proxy(mlx_server.url, "mlx") as proxy:
        first = chat(proxy.url, max_tokens, content="proxy record one")
        again = chat(proxy.url, max_tokens, content="proxy record one")  # its prompt is cached now
        records = proxy.records.wait_for(2)
    for seen, record in zip((first, again), records, strict=True):
        assert seen.usage_chunk is not None and seen.done
        usage = seen.usage_chunk["usage"]
        assert record.prompt_tokens == usage["prompt_tokens"]
        assert record.decode_tokens == usage["completion_tokens"] == max_tokens
        assert record.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        assert record.model == seen.usage_chunk["model"] == "default_model"  # MLX-LM echoes the request
        assert record.stop_reason == "length" and record.http_status == 200 and not record.aborted
        # No timings from MLX-LM: the rate is the proxy's, over the pieces it forwarded, so estimated;
        # the client saw the same pieces arrive.
        assert record.decode_exact is False and record.decode_tok_s is not None
        assert record.decode_tok_s == pytest.approx(_client_rate(seen), rel=0.25)
    assert records[1].cached_tokens and records[1].cached_tokens > 0


def test_live_rate_while_it_streams_and_the_record_after(mlx_server: MlxServer, speed_tok_s: float) -> None:
    max_tokens = max(200, round(speed_tok_s * LIVE_REQUEST_S))
    inbox = RecordInbox([mlx_server.url])
    monitor = monitor_for(mlx_server.url, profile=PROFILE, proxy_inbox=inbox)
    live: list[tuple[float, float]] = []  # (tick time, decode tok/s shown)
    during: list[Snapshot] = []
    try:
        with running_proxy(mlx_server.url, "mlx", inbox=inbox) as proxy:
            idle = _mlx_model(monitor.tick())
            assert idle is not None and idle.phase == "idle", idle
            seen, request = _in_background(proxy.url, max_tokens)
            pace = threading.Event()
            deadline = time.monotonic() + 60.0 + 10 * LIVE_REQUEST_S
            while not request.done() and time.monotonic() < deadline:
                snapshot = monitor.tick()
                during.append(snapshot)
                model = _mlx_model(snapshot)
                if model is not None and model.phase == "decoding" and model.decode_tok_s is not None:
                    assert model.decode_exact is False and model.live_rate_reason is None
                    live.append((snapshot.t_mono_s, model.decode_tok_s))
                pace.wait(TICK_S)
            request.result(timeout=60.0)
            proxy.records.wait_for(1)
            after = [monitor.tick() for _ in range(2)]
    finally:
        monitor.close()
    # What the tray showed is what the client received over the time it received it: at each tick,
    # the chunks that reached the client in the rate window before it, over their time.
    pairs = [(rate, _client_rate_between(seen, t - RATE_WINDOW_S, t)) for t, rate in live]
    pairs = [(shown, client) for shown, client in pairs if client is not None]
    print(f"{max_tokens} tokens; shown live vs the client's: {[(round(a), round(b)) for a, b in pairs]}")
    assert len(pairs) >= 3, (live, mlx_server.log_tail())
    ratios = [shown / client for shown, client in pairs]
    assert 0.85 <= statistics.median(ratios) <= 1.15, pairs
    assert all(0.5 <= r <= 2.0 for r in ratios), pairs
    # The record reaches the monitor as the answer ends: a tick taken just before the client's thread
    # says it is done may already hold it (cc44: none of the two after did).
    (record,) = [r for s in [*during, *after] for r in s.requests]
    usage = seen.usage_chunk["usage"] if seen.usage_chunk else {}
    assert record.model == _mlx_model(after[-1]).name  # "default_model" named for the served model
    assert (record.prompt_tokens, record.decode_tokens, record.cached_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )
    assert record.source == "proxy" and record.exact is False
    final = _mlx_model(after[-1])
    assert final is not None and final.phase == "idle" and final.decode_tok_s is None


def test_polling_never_disturbs_a_long_request(mlx_server: MlxServer, speed_tok_s: float) -> None:
    """A ~1,000-token answer (a few seconds here) while the monitor polls at its normal rate."""
    max_tokens = max(200, min(3000, round(speed_tok_s * LONG_REQUEST_S)))
    monitor = monitor_for(mlx_server.url, profile=PROFILE)
    statuses: list[tuple[str, float | None]] = []  # (status, age_s: None when it answered this tick)
    try:
        monitor.tick()
        seen, request = _in_background(mlx_server.url, max_tokens)
        pace = threading.Event()
        deadline = time.monotonic() + 60.0 + 10 * LONG_REQUEST_S
        while not request.done() and time.monotonic() < deadline:
            snapshot = monitor.tick()
            statuses += [(s.status, s.age_s) for s in snapshot.servers if s.kind == "mlx"]
            pace.wait(monitor.settings.monitor.poll_active_s)  # its rate while anything generates
        result = request.result(timeout=60.0)
    finally:
        monitor.close()
    n, first, last = seen.received()
    print(f"{n} of {max_tokens} tokens in {(last or 0.0) - (first or 0.0):.1f} s; polls {statuses}")
    # Whole: every token, the finish chunk, usage and [DONE].
    assert result.status == 200 and result.done
    assert result.usage_chunk is not None and result.usage_chunk["usage"]["completion_tokens"] == max_tokens
    assert result.finish_chunk is not None and result.finish_chunk["choices"][0]["finish_reason"] == "length"
    assert seen.received()[0] == max_tokens
    # Polled while it generated, and every poll answered.
    assert len(statuses) >= 2 and all(st == ("ok", None) for st in statuses), statuses
