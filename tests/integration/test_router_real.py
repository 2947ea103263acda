"""A real llama-server in router mode (issue #11): two models, loaded on demand, one at a time.

The router serves the test GGUF under two names (`alpha`, `beta`: two symlinks in a models
dir) with `--models-max 1 -t 1 -np 1 -c 2048 --metrics`; each test starts its own router
(about 1 s: the router loads nothing by itself). The states the tests expect are checked on the
router's own `GET /models`, never only on what llm-tray says.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.llama import (
    alerts_of,
    generate_in_background,
    monitor_for,
    server_rate_of_window,
    tick_until,
)
from tests.support.llama_router import Router
from trayapp.config.settings import Settings
from trayapp.core.model import ModelStatus, Snapshot
from trayapp.core.rates import RATE_WINDOW_S
from trayapp.core.thresholds import Thresholds
from trayapp.sources.discovery import identify, make_probe
from trayapp.sources.http import make_client
from trayapp.sources.servers.llamacpp_router import ROUTER_KIND, LlamaRouterProbe

pytestmark = pytest.mark.llamacpp

POLL_S = 0.25  # the monitor's tick interval in these tests: a load time is measured ± this


@pytest.fixture
def router(llama_binary: Path, model_path: Path, tmp_path: Path) -> Iterator[Router]:
    server = Router(llama_binary, model_path, tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


def models_of(snapshot: Snapshot) -> dict[str, ModelStatus]:
    (server,) = snapshot.servers
    return {m.name: m for m in server.models}


def loading_span_s(snapshots: list[Snapshot], name: str) -> float:
    """From the first tick that showed `name` loading to the first one after that did not (s)."""
    phases = [(s.t_mono_s, models_of(s)[name].phase) for s in snapshots]
    start = next(t for t, phase in phases if phase == "loading")
    return next(t for t, phase in phases if t > start and phase != "loading") - start


def ask(url: str, model: str, n_predict: int) -> Any:
    """A request naming `model` (the router loads it when needed), from a separate client."""
    return generate_in_background(
        url,
        "Tell me about the sea.",
        n_predict,
        model=model,
        ignore_eos=True,
        stream=True,
        timings_per_token=True,
    )


# --------------------------------------------------------------------------- listing, never loading


def test_both_models_listed_unloaded_and_watching_never_loads_them(router: Router) -> None:
    """The real Monitor watches a fresh router for 10 s (40 ticks): both models are listed as not
    loaded, the server is up, and the router's own /models still says `unloaded` for both
    (a GET naming a model would load it). About 12 s."""
    monitor = monitor_for(router.url)
    try:
        snapshots = tick_until(monitor, lambda _: False, limit_s=10.0, interval_s=POLL_S)
    finally:
        monitor.close()
    assert router.states() == {"alpha": "unloaded", "beta": "unloaded"}
    assert len(snapshots) >= 10
    for snapshot in snapshots:
        (server,) = snapshot.servers
        assert server.kind == "llamacpp" and server.status == "ok", server.reason
        models = models_of(snapshot)
        assert set(models) == {"alpha", "beta"}
        for model in models.values():
            assert model.phase == "unloaded" and model.decode_tok_s is None
            assert model.live_rate_reason and model.live_rate_reason.startswith("not loaded")
    assert not alerts_of(snapshots, "server_down")
    assert "spawning server instance" not in router.log_path.read_text()


def test_status_json_lists_the_routers_models(router: Router) -> None:
    """`llm-tray status --json` with the endpoint configured as a llama-server: discovery still sees
    it is a router, and lists both models, not loaded. About 5 s."""
    result = run_cli("status", "--json", "--endpoint", f"llamacpp={router.url}", "--no-discover")
    assert result.returncode == 0, result.stderr
    (server,) = json.loads(result.stdout)["servers"]
    assert server["kind"] == "llamacpp" and server["status"] == "ok", server["reason"]
    models = {m["name"]: m for m in server["models"]}
    assert set(models) == {"alpha", "beta"}
    assert all(m["live_rate_reason"].startswith("not loaded") for m in models.values())
    assert router.states() == {"alpha": "unloaded", "beta": "unloaded"}


def test_discovery_tells_a_router_from_a_single_model_server(router: Router) -> None:
    """`identify` on the real router: its own kind and probe (readings say llamacpp). About 2 s."""
    with make_client(router.url) as client:
        kind, why = identify(router.url, client)
    assert kind == ROUTER_KIND, why
    probe = make_probe(kind, router.url)
    try:
        assert isinstance(probe, LlamaRouterProbe) and probe.kind == "llamacpp"
    finally:
        probe.close()
    assert router.states() == {"alpha": "unloaded", "beta": "unloaded"}


# --------------------------------------------------------------------------- load on demand, evict


def test_request_loads_a_model_with_a_measured_load_time_live_rate_and_eviction(router: Router) -> None:
    """A request to `beta`: loading → loaded with a measured load time and a live decode rate
    close to the server's own timings; then a request to `alpha` evicts `beta` (`--models-max 1`),
    shown as not loaded, never as down. The default cold_load threshold (2 s) applies when the
    load takes that long here (it took ~5 s on a busy 2-core box); on a machine that loads the tiny
    model faster the test says so and checks that no alert came. About 30–60 s."""
    default_min_s = Thresholds().cold_load_min_s
    monitor = monitor_for(router.url, settings=Settings())
    try:
        monitor.tick()
        future = ask(router.url, "beta", 200)
        snapshots = tick_until(monitor, lambda _: future.done(), limit_s=180, interval_s=POLL_S)
        snapshots += tick_until(monitor, lambda _: False, limit_s=2 * POLL_S, interval_s=POLL_S)
        timings = future.result()["timings"]
        beta_phases = [models_of(s)["beta"].phase for s in snapshots]
        assert "loading" in beta_phases, beta_phases
        assert beta_phases.index("loading") < beta_phases.index("decoding")

        decoding = [(s.t_wall_s, m) for s in snapshots if (m := models_of(s)["beta"]).phase == "decoding"]
        ticks = [(t_s, m.context_tokens or 0) for t_s, m in decoding]
        prompt_tokens = timings["prompt_n"] + timings.get("cache_n", 0)
        decode_ms = future.result()["decode_ms_by_token"]
        # each live rate against the server's own over the same tokens (its per-token timings): beside
        # a busy neighbour the speed comes in bursts, and no average of the request is an oracle for a
        # window of it (a median of windows read 3.35 against the request's 4.80 tok/s)
        ratios = [
            m.decode_tok_s / own
            for i, (_, m) in enumerate(decoding)
            if m.decode_tok_s
            and (own := server_rate_of_window(ticks, i, prompt_tokens, decode_ms, RATE_WINDOW_S))
        ]
        assert len(ratios) >= 3, beta_phases
        assert statistics.median(ratios) == pytest.approx(1.0, rel=0.10), ratios
        beta = models_of(snapshots[-1])["beta"]
        assert beta.weights_bytes == 246_587_904 and beta.context_length == 2048  # router's meta, -c
        assert beta.bytes_per_token_exact and beta.ceiling_tok_s  # the file's own facts

        colds = alerts_of(snapshots, "cold_load")
        measured = [a.evidence["load_s"] for a in colds.values() if "load_s" in a.evidence]
        span_s = loading_span_s(snapshots, "beta")
        # The load is measured between polls (the ticks that saw it loading, ± one tick): the alert
        # comes exactly when that measurement reaches the default threshold. A load near 2 s can fall
        # either side on a given run; both sides are checked against the same measurement.
        if colds:
            assert len(colds) == 1 and measured, beta_phases
            assert float(measured[0]) >= default_min_s
            assert measured[0] == pytest.approx(span_s, abs=POLL_S + 0.2)
        else:
            assert span_s < default_min_s + POLL_S, f"a ~{span_s:.1f} s load raised no cold_load"
        assert router.states() == {"alpha": "unloaded", "beta": "loaded"}

        future = ask(router.url, "alpha", 8)
        after = tick_until(monitor, lambda _: future.done(), limit_s=180, interval_s=POLL_S)
        after += tick_until(monitor, lambda _: False, limit_s=2 * POLL_S, interval_s=POLL_S)
        future.result()
    finally:
        monitor.close()
    assert router.states() == {"alpha": "loaded", "beta": "unloaded"}
    last = models_of(after[-1])
    assert last["beta"].live_rate_reason and last["beta"].live_rate_reason.startswith("not loaded")
    assert last["beta"].phase == "unloaded"  # evicted: shown as not loaded, the server stays up
    assert last["alpha"].live_rate_reason is None
    assert all(s.servers[0].status == "ok" for s in snapshots + after)
    assert not alerts_of(snapshots + after, "server_down")


def test_cold_load_alert_with_a_low_threshold(router: Router) -> None:
    """The same load with `cold_load_min_s` set to 0.2 s, so the alert is raised on any machine (the
    tiny model may load faster than the 2 s default): one cold_load alert naming the model and its
    measured load time. About 10–20 s."""
    settings = Settings(thresholds=Thresholds(cold_load_min_s=0.2))
    monitor = monitor_for(router.url, settings=settings)
    try:
        monitor.tick()
        future = ask(router.url, "alpha", 4)
        snapshots = tick_until(monitor, lambda _: future.done(), limit_s=180, interval_s=POLL_S)
        snapshots += tick_until(monitor, lambda _: False, limit_s=2 * POLL_S, interval_s=POLL_S)
        future.result()
    finally:
        monitor.close()
    (alert,) = alerts_of(snapshots, "cold_load").values()
    assert alert.model == "alpha" and alert.severity == "info"
    load_s = alert.evidence["load_s"]
    assert isinstance(load_s, float) and load_s >= 0.2
    assert load_s == pytest.approx(loading_span_s(snapshots, "alpha"), abs=POLL_S + 0.2)


def test_a_watched_routers_child_goes_to_sleep_and_wakes(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """A router started with `--sleep-idle-seconds 4`: after a request to `alpha`, the real
    Monitor watches it every second; the router itself must report `alpha` sleeping within 30 s
    (watching resets no child's idle timer), llm-tray shows it sleeping (never down), and a new
    request wakes it: loaded again, and llm-tray follows. About 15-25 s."""
    router = Router(llama_binary, model_path, tmp_path)
    router.command += ["--sleep-idle-seconds", "4"]
    router.start()
    monitor = monitor_for(router.url)
    try:
        ask(router.url, "alpha", 4).result(timeout=120)
        assert router.states()["alpha"] == "loaded"
        seen: list[str] = []

        def router_says_sleeping(snapshot: Snapshot) -> bool:
            seen.append(models_of(snapshot)["alpha"].phase)
            return router.states()["alpha"] == "sleeping"

        asleep = tick_until(monitor, router_says_sleeping, limit_s=30.0, interval_s=1.0)
        assert router.states()["alpha"] == "sleeping", seen
        asleep += tick_until(monitor, lambda s: models_of(s)["alpha"].phase == "sleeping", limit_s=5.0)
        assert models_of(asleep[-1])["alpha"].phase == "sleeping", seen
        assert router.states()["alpha"] == "sleeping"  # still: those polls did not wake it

        ask(router.url, "alpha", 4).result(timeout=120)
        awake = tick_until(monitor, lambda s: models_of(s)["alpha"].phase != "sleeping", limit_s=10.0)
    finally:
        monitor.close()
        router.stop()
    assert models_of(awake[-1])["alpha"].phase in ("idle", "decoding"), [models_of(s)["alpha"] for s in awake]
    assert all(s.servers[0].status == "ok" for s in asleep + awake)
    assert not alerts_of(asleep + awake, "server_down")
