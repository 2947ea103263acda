"""llama-server router mode: the `/models` parser on captured payloads, and what the probe asks.

The payloads are real captures (tests/fixtures/README.md, `router_*`). The probe runs against an
in-process `httpx.MockTransport` that answers with them (no socket), so the tests can see every
request it makes: per-model endpoints only for `loaded` models, always with `autoload=false`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from trayapp.sources.servers.llamacpp_parse import ModelMeta
from trayapp.sources.servers.llamacpp_router import (
    LOAD_SOURCE,
    LlamaRouterProbe,
    RouterModel,
    is_router_props,
    parse_router_models,
)

GEMMA_META = ModelMeta(
    id="beta",
    size_bytes=246_587_904,  # tensor bytes of the test GGUF (shared/TESTING.md §2)
    parameter_count=268_098_176,
    n_ctx_train=32_768,
    n_ctx=2048,
    n_vocab=262_144,
    n_embd=640,
    ftype="Q4_K - Medium",
)


@pytest.fixture
def captured(fixtures_dir: Path) -> Path:
    return fixtures_dir / "llama-server" / "captured"


def load(directory: Path, name: str) -> Any:
    return json.loads((directory / name).read_text())


# --------------------------------------------------------------------------- parsers


def test_router_props_say_router_and_a_single_server_does_not(captured: Path) -> None:
    assert is_router_props(load(captured, "router_props.json"))
    assert not is_router_props(load(captured, "props.json"))  # a single-model llama-server
    assert not is_router_props(load(captured, "router_props_model_loaded.json"))  # a child, via ?model=


def test_fresh_router_lists_both_models_unloaded_with_their_files(captured: Path) -> None:
    assert parse_router_models(load(captured, "router_models_unloaded.json")) == (
        RouterModel("alpha", "unloaded", None, "/models/alpha.gguf"),  # --port 0: no child yet
        RouterModel("beta", "unloaded", None, "/models/beta.gguf"),
    )


def test_loaded_model_has_its_child_port_and_meta(captured: Path) -> None:
    alpha, beta = parse_router_models(load(captured, "router_models_one_loaded.json"))
    assert alpha == RouterModel(
        "alpha",
        "loaded",
        60703,
        "/models/alpha.gguf",
        meta=ModelMeta(**{**GEMMA_META.__dict__, "id": "alpha"}),
    )
    assert beta.state == "unloaded" and beta.meta is None


def test_loading_evicted_sleeping_and_failed_states(captured: Path) -> None:
    loading = parse_router_models(load(captured, "router_models_loading.json"))
    assert [(m.name, m.state) for m in loading] == [("alpha", "unloaded"), ("beta", "loading")]
    evicted = parse_router_models(load(captured, "router_models_evicted.json"))
    assert [(m.name, m.state, m.port) for m in evicted] == [
        ("alpha", "unloaded", 60703),  # the evicted child's old port stays in its args
        ("beta", "loaded", 35533),
    ]
    assert evicted[1].meta == GEMMA_META
    sleeping = parse_router_models(load(captured, "router_models_sleeping.json"))
    assert [(m.name, m.state) for m in sleeping] == [("alpha", "sleeping"), ("beta", "unloaded")]
    (broken,) = parse_router_models(load(captured, "router_models_failed.json"))
    assert (broken.state, broken.exit_code) == ("failed", 1)  # value "unloaded" + failed: true


def test_odd_entries_are_skipped_or_unknown() -> None:
    data = {"data": [{"status": {"value": "loaded"}}, "x", {"id": "m", "status": {"value": "warming"}}]}
    assert parse_router_models(data) == (RouterModel("m", "unknown"),)
    assert parse_router_models({"error": "x"}) == ()
    assert parse_router_models([1, 2]) == ()


# --------------------------------------------------------------------------- the probe


class ScriptedRouter:
    """Answers like a router whose `/models` payload the test sets; records every request path."""

    def __init__(self, captured: Path, models_file: str) -> None:
        self.captured = captured
        self.models_file = models_file
        self.requests: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        query = request.url.query.decode()
        self.requests.append(f"{path}?{query}" if query else path)
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/models":
            return httpx.Response(200, json=load(self.captured, self.models_file))
        if path == "/props":
            return httpx.Response(200, json=load(self.captured, "router_props_model_loaded.json"))
        if path == "/slots":
            return httpx.Response(200, json=load(self.captured, "router_slots_model_loaded.json"))
        if path == "/metrics":
            return httpx.Response(200, text=(self.captured / "router_metrics_model_loaded.txt").read_text())
        return httpx.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})


def router_probe(router: ScriptedRouter) -> LlamaRouterProbe:
    """A probe on a remote-looking URL (no local process to read CPU time from)."""
    url = "http://router.test:8080"
    client = httpx.Client(base_url=url, transport=httpx.MockTransport(router.handler))
    return LlamaRouterProbe(url, client=client)


def per_model(router: ScriptedRouter) -> list[str]:
    return [r for r in router.requests if "model=" in r]


def polls(probe: LlamaRouterProbe, router: ScriptedRouter, steps: list[tuple[float, str]]) -> list[Any]:
    readings = []
    for now_s, models_file in steps:
        router.models_file = models_file
        readings.append(probe.poll(now_s))
    return readings


def test_unloaded_models_are_listed_and_never_asked(captured: Path) -> None:
    router = ScriptedRouter(captured, "router_models_unloaded.json")
    probe = router_probe(router)
    readings = polls(probe, router, [(float(t), "router_models_unloaded.json") for t in range(5)])
    assert per_model(router) == []  # a GET naming an unloaded model would load it
    last = readings[-1]
    assert last.status == "ok" and [(m.name, m.loaded, m.loading) for m in last.models] == [
        ("alpha", False, False),
        ("beta", False, False),
    ]
    assert all(m.live_rate_reason and m.live_rate_reason.startswith("not loaded") for m in last.models)


def test_loaded_model_is_asked_with_autoload_off_and_the_others_never(captured: Path) -> None:
    router = ScriptedRouter(captured, "router_models_one_loaded.json")
    probe = router_probe(router)
    (reading,) = polls(probe, router, [(0.0, "router_models_one_loaded.json")])
    asked = per_model(router)
    assert asked and all(r.endswith("model=alpha&autoload=false") for r in asked)
    assert {r.split("?")[0] for r in asked} == {"/props", "/metrics", "/slots"}
    alpha, beta = reading.models
    assert alpha.loaded and alpha.model_path == "/models/alpha.gguf" and alpha.context_length == 2048
    assert alpha.weights_bytes == 246_587_904 and alpha.quantization == "Q4_K_M"
    assert len(alpha.slots) == 4 and alpha.counters is not None
    assert not beta.loaded


def test_idle_child_is_not_asked_for_slots_while_metrics_shows_no_work(captured: Path) -> None:
    """/slots resets the child's idle timer: with nothing running (/metrics: 0 processing, 0 deferred)
    the probe stops asking it once it has seen every slot idle."""
    router = ScriptedRouter(captured, "router_models_one_loaded.json")
    probe = router_probe(router)
    polls(probe, router, [(float(t), "router_models_one_loaded.json") for t in range(6)])
    slots_asked = [r for r in router.requests if r.startswith("/slots")]
    assert len(slots_asked) == 1  # the first poll only (then every slot was idle)
    assert len([r for r in router.requests if r.startswith("/props")]) == 1  # cached (30 s)


def test_sleeping_model_is_shown_sleeping_and_not_asked(captured: Path) -> None:
    router = ScriptedRouter(captured, "router_models_sleeping.json")
    probe = router_probe(router)
    (reading,) = polls(probe, router, [(0.0, "router_models_sleeping.json")])
    assert per_model(router) == []
    alpha, beta = reading.models
    assert alpha.sleeping and not alpha.loaded and reading.status == "ok"
    assert not beta.sleeping and not beta.loaded


def test_load_measured_between_polls_is_reported_once(captured: Path) -> None:
    """First seen loading at t=10 s, seen loaded at t=14.5 s: 4.5 s (± one poll interval)."""
    router = ScriptedRouter(captured, "router_models_unloaded.json")
    probe = router_probe(router)
    steps = [
        (9.0, "router_models_unloaded.json"),
        (10.0, "router_models_loading.json"),
        (12.0, "router_models_loading.json"),
        (14.5, "router_models_evicted.json"),  # beta loaded, alpha evicted
        (15.5, "router_models_evicted.json"),
    ]
    readings = polls(probe, router, steps)
    assert [r.finished for r in readings[:3]] == [(), (), ()]
    assert readings[1].models[1].loading and not readings[1].models[1].loaded
    (load_done,) = readings[3].finished
    assert load_done.model == "beta" and load_done.load_s == pytest.approx(4.5)
    assert load_done.source == LOAD_SOURCE and load_done.decode_tokens is None
    assert readings[4].finished == ()
    assert [(m.name, m.loaded) for m in readings[4].models] == [("alpha", False), ("beta", True)]
    assert all(r.status == "ok" for r in readings)


def test_failed_model_says_so(captured: Path) -> None:
    router = ScriptedRouter(captured, "router_models_failed.json")
    (reading,) = polls(router_probe(router), router, [(0.0, "router_models_failed.json")])
    (broken,) = reading.models
    assert not broken.loaded and broken.live_rate_reason == "failed to load (exit code 1)"


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (401, {"error": {"code": 401, "message": "Invalid API Key"}}, "unauthorized"),
        (500, {"error": "boom"}, "error"),
    ],
)
def test_router_failures_map_to_status(captured: Path, status: int, body: Any, want: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(status, json=body)

    make: Callable[[], httpx.Client] = lambda: httpx.Client(  # noqa: E731
        base_url="http://router.test:8080", transport=httpx.MockTransport(handler)
    )
    reading = LlamaRouterProbe("http://router.test:8080", client=make()).poll(0.0)
    assert reading.status == want and reading.models == ()


class BusyRouter(ScriptedRouter):
    """The loaded child with every slot working and `deferred` requests waiting at each scrape;
    `free_slot` makes its first slot idle."""

    def __init__(self, captured: Path) -> None:
        super().__init__(captured, "router_models_one_loaded.json")
        self.deferred = 2
        self.free_slot = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        answer = super().handler(request)
        if request.url.path == "/slots":
            slots = load(self.captured, "router_slots_model_loaded.json")
            for i, slot in enumerate(slots):
                slot["is_processing"] = not (self.free_slot and i == 0)
            return httpx.Response(200, json=slots)
        if request.url.path == "/metrics":
            text = answer.text.replace("requests_deferred 0", f"requests_deferred {self.deferred}")
            return httpx.Response(200, text=text.replace("requests_processing 0", "requests_processing 4"))
        return answer


def test_a_childs_queue_count_holds_between_scrapes_and_clears_when_a_slot_frees(captured: Path) -> None:
    """As for a single server (#22): /metrics is scraped once per metrics_interval_s while busy, so the
    count it gave stays while every slot works, and is 0 once one is free (it flickered to None on
    the polls between scrapes, a router's 'queued 2' showing one tick in ten)."""
    router = BusyRouter(captured)
    probe = router_probe(router)
    readings = polls(probe, router, [(float(t), "router_models_one_loaded.json") for t in range(4)])
    scrapes = [r for r in router.requests if r.startswith("/metrics")]
    assert len(scrapes) == 1  # the first poll; the next three fall inside the 10 s interval
    assert [r.models[0].queued_requests for r in readings] == [2, 2, 2, 2]
    router.free_slot = True
    (freed,) = polls(probe, router, [(4.0, "router_models_one_loaded.json")])
    assert freed.models[0].queued_requests == 0
