"""Server identification and discovery against fake HTTP servers on 127.0.0.1 (fixture payloads)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_http import FakeServer, captured_reply, file_reply, hang, json_reply, text_reply
from tests.support.llama import free_port
from trayapp.core.model import ServerReading
from trayapp.core.server_kinds import SERVER_KINDS
from trayapp.sources.discovery import (
    Discovery,
    Endpoint,
    UnidentifiedProbe,
    identify,
    identify_kind,
)
from trayapp.sources.http import LoopbackGetter, make_client
from trayapp.sources.servers.llamacpp import LlamaCppProbe

UNAUTHORIZED = json_reply(
    {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}, 401
)
MLX_MODELS = {
    "object": "list",
    "data": [{"id": "mlx-community/Qwen3-4B-4bit", "object": "model", "created": 1}],
}


def routes_for(kind: str, fixtures: Path) -> dict[str, Any]:
    """What each kind of server answers, from the shared fixtures (reference/backends.md)."""
    llama = fixtures / "llama-server" / "captured"
    return {
        "ollama": {
            "/": text_reply("Ollama is running"),
            "/api/version": file_reply(fixtures / "ollama" / "api_version.json"),
            "/api/ps": file_reply(fixtures / "ollama" / "api_ps.json"),
        },
        "llamacpp": {
            "/": text_reply("<!doctype html><title>llama.cpp</title>", content_type="text/html"),
            "/health": file_reply(llama / "health.json"),
            "/props": file_reply(llama / "props.json"),
            "/slots": file_reply(llama / "slots_fresh.json"),
            "/v1/models": file_reply(llama / "v1_models.json"),
        },
        "llamacpp-key": {
            "/health": file_reply(llama / "health.json"),
            "/props": UNAUTHORIZED,
            "/slots": UNAUTHORIZED,
            "/v1/models": UNAUTHORIZED,
        },
        "lmstudio-v0": {
            "/api/v0/models": file_reply(fixtures / "lmstudio" / "api_v0_models.json"),
            "/v1/models": json_reply({"object": "list", "data": []}),
        },
        "lmstudio-v1": {"/api/v1/models": file_reply(fixtures / "lmstudio" / "api_v1_models.json")},
        "vllm": {
            "/health": text_reply(""),
            "/metrics": file_reply(fixtures / "vllm" / "metrics.txt"),
            "/v1/models": json_reply({"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}]}),
        },
        "sglang": {
            "/health": text_reply(""),
            "/metrics": file_reply(fixtures / "sglang" / "metrics.txt"),
            "/v1/models": json_reply({"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}]}),
        },
        "sglang-no-metrics": {
            "/get_model_info": json_reply({"model_path": "Qwen/Qwen3-8B", "is_generation": True}),
            "/v1/models": json_reply({"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}]}),
        },
        "mlx": {"/health": json_reply({"status": "ok"}), "/v1/models": json_reply(MLX_MODELS)},
        # Real mlx_lm.server answers (mlx-lm 0.32.2): with a Hugging Face cache folder, and without one
        # (200 and an empty body), its 404s a plain "Not Found"
        "mlx-captured": {
            "/health": captured_reply(fixtures / "mlx" / "health.http"),
            "/v1/models": captured_reply(fixtures / "mlx" / "v1_models_hf_cache.http"),
            "/props": captured_reply(fixtures / "mlx" / "props_404.http"),
        },
        "mlx-no-hf-cache": {
            "/health": captured_reply(fixtures / "mlx" / "health.http"),
            "/v1/models": captured_reply(fixtures / "mlx" / "v1_models_no_hf_cache.http"),
            "/props": captured_reply(fixtures / "mlx" / "props_404.http"),
        },
        "openai": {"/v1/models": json_reply({"object": "list", "data": [{"id": "some-model"}]})},
        "other": {"/": text_reply("<html>a web app</html>", content_type="text/html")},
    }[kind]


EXPECTED = {
    "ollama": "ollama",
    "llamacpp": "llamacpp",
    "llamacpp-key": "llamacpp",
    "lmstudio-v0": "lmstudio",
    "lmstudio-v1": "lmstudio",
    "vllm": "vllm",
    "sglang": "sglang",
    "sglang-no-metrics": "sglang",
    "mlx": "mlx",
    "mlx-captured": "mlx",
    "mlx-no-hf-cache": "mlx",
    "openai": "openai",
    "other": None,
}


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with make_client() as c:
        yield c


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_identify_kind(variant: str, fixtures_dir: Path, client: httpx.Client) -> None:
    with FakeServer(routes_for(variant, fixtures_dir)) as server:
        assert identify_kind(server.url, client) == EXPECTED[variant]


def test_llama_and_mlx_share_a_port_but_are_told_apart(fixtures_dir: Path, client: httpx.Client) -> None:
    assert SERVER_KINDS["llamacpp"].default_port == SERVER_KINDS["mlx"].default_port == 8080
    with FakeServer(routes_for("mlx", fixtures_dir)) as server:
        kind, why = identify(server.url, client)
        assert kind == "mlx" and "/props" in why
        server.routes.update(routes_for("llamacpp", fixtures_dir))
        assert identify_kind(server.url, client) == "llamacpp"


def test_identify_nothing_listening(client: httpx.Client) -> None:
    kind, why = identify(f"http://127.0.0.1:{free_port()}", client)
    assert kind is None and why.startswith("unreachable:")


# --------------------------------------------------------------------------- Discovery


class RecordingProbe:
    def __init__(self, kind: str, url: str, api_key: str | None, facts_loader: Any) -> None:
        self.kind = kind
        self.url = url
        self.api_key = api_key
        self.facts_loader = facts_loader
        self.closed = False

    def poll(self, now_mono_s: float) -> ServerReading:
        return ServerReading(self.kind, self.url, "ok")

    def close(self) -> None:
        self.closed = True


def recording_factory(
    kind: str, url: str, api_key: str | None = None, facts_loader: Any = None
) -> RecordingProbe:
    return RecordingProbe(kind, url, api_key, facts_loader)


def kinds(probes: list[Any]) -> dict[str, str]:
    return {probe.url: probe.kind for probe in probes}


def test_scan_finds_servers_on_loopback_ports(fixtures_dir: Path) -> None:
    dead = free_port()
    with (
        FakeServer(routes_for("llamacpp", fixtures_dir)) as llama,
        FakeServer(routes_for("ollama", fixtures_dir)) as ollama,
    ):
        discovery = Discovery(scan_ports=[llama.port, ollama.port, dead], probe_factory=recording_factory)
        try:
            probes = discovery.refresh(0.0)
            assert kinds(probes) == {llama.url: "llamacpp", ollama.url: "ollama"}
            again = discovery.refresh(1.0)
            assert [id(p) for p in again] == [id(p) for p in probes]  # the same probes, kept
            assert discovery.endpoint_for(llama.url) == Endpoint(llama.url, kind="llamacpp")
        finally:
            discovery.close()
    assert all(isinstance(probe, RecordingProbe) and probe.closed for probe in probes)


def test_server_started_later_is_found_at_the_next_reprobe(fixtures_dir: Path) -> None:
    port = free_port()
    discovery = Discovery(scan_ports=[port], reprobe_interval_s=30.0, probe_factory=recording_factory)
    try:
        assert discovery.refresh(0.0) == []
        with FakeServer(routes_for("llamacpp", fixtures_dir), port=port) as llama:
            assert discovery.refresh(10.0) == []  # not due yet
            assert kinds(discovery.refresh(30.0)) == {llama.url: "llamacpp"}
    finally:
        discovery.close()


def test_scanned_server_that_goes_away_is_dropped(fixtures_dir: Path) -> None:
    server = FakeServer(routes_for("ollama", fixtures_dir)).start()
    discovery = Discovery(scan_ports=[server.port], reprobe_interval_s=5.0, probe_factory=recording_factory)
    try:
        (probe,) = discovery.refresh(0.0)
        server.stop()
        assert discovery.refresh(5.0) == []
        assert isinstance(probe, RecordingProbe) and probe.closed
    finally:
        server.stop()
        discovery.close()


def test_configured_dead_endpoint_stays_listed_as_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    discovery = Discovery(
        [Endpoint(url, name="workstation")], scan_defaults=False, probe_factory=recording_factory
    )
    try:
        for now in (0.0, 30.0, 60.0):
            (probe,) = discovery.refresh(now)
            reading = probe.poll(now)
            assert isinstance(probe, UnidentifiedProbe)
            assert reading.url == url and reading.status == "unreachable"
            assert reading.reason is not None and "refused" in reading.reason
        assert discovery.endpoint_for(url) == Endpoint(url, name="workstation")
    finally:
        discovery.close()


def test_configured_dead_llama_endpoint_uses_the_real_probe() -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    discovery = Discovery([Endpoint(url, kind="llamacpp")], scan_defaults=False)
    try:
        (probe,) = discovery.refresh(0.0)
        assert isinstance(probe, LlamaCppProbe) and probe.url == url
        assert probe.poll(0.0).status == "unreachable"
        assert discovery.refresh(100.0) == [probe]  # never dropped
    finally:
        discovery.close()


def test_configured_endpoint_identified_with_its_api_key(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLAMA_KEY", "sekrit")
    with FakeServer(routes_for("llamacpp-key", fixtures_dir)) as server:
        endpoint = Endpoint(server.url, api_key_env="TEST_LLAMA_KEY")
        discovery = Discovery([endpoint], scan_defaults=False, probe_factory=recording_factory)
        try:
            (probe,) = discovery.refresh(0.0)
        finally:
            discovery.close()
        sent = [h for _, path, h in server.requests if path == "/props"]
    assert isinstance(probe, RecordingProbe)
    assert probe.kind == "llamacpp" and probe.api_key == "sekrit" and probe.url == server.url
    assert {k.lower(): v for k, v in sent[0].items()}["authorization"] == "Bearer sekrit"


def test_configured_endpoint_that_comes_up_later_is_identified(fixtures_dir: Path) -> None:
    port = free_port()
    url = f"http://localhost:{port}"
    discovery = Discovery(
        [Endpoint(url)], scan_ports=[port], reprobe_interval_s=30.0, probe_factory=recording_factory
    )
    try:
        (first,) = discovery.refresh(0.0)  # the scan of the same port is not listed twice
        assert first.kind == "unknown" and first.poll(0.0).status == "unreachable"
        with FakeServer(routes_for("mlx", fixtures_dir), port=port):
            (second,) = discovery.refresh(30.0)
        assert second.kind == "mlx" and second.url == url  # URL exactly as configured
    finally:
        discovery.close()


def test_configured_kind_is_not_probed(fixtures_dir: Path) -> None:
    with FakeServer(routes_for("ollama", fixtures_dir)) as server:
        discovery = Discovery(
            [Endpoint(server.url, kind="vllm")], scan_defaults=False, probe_factory=recording_factory
        )
        try:
            (probe,) = discovery.refresh(0.0)
        finally:
            discovery.close()
        assert probe.kind == "vllm" and server.requests == []


def test_hung_ports_do_not_delay_the_others(fixtures_dir: Path) -> None:
    hung = [FakeServer({"/": hang}).start() for _ in range(3)]
    try:
        with FakeServer(routes_for("llamacpp", fixtures_dir)) as llama:
            discovery = Discovery(
                scan_ports=[h.port for h in hung] + [llama.port], probe_factory=recording_factory
            )
            try:
                started = time.monotonic()
                probes = discovery.refresh(0.0)
                elapsed_s = time.monotonic() - started
            finally:
                discovery.close()
    finally:
        for server in hung:
            server.stop()
    assert kinds(probes) == {llama.url: "llamacpp"}
    assert elapsed_s < 3.5  # one read timeout (1.5 s), not three in a row


# --------------------------------------------------------------------------- without httpx


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_identify_kind_over_http_client(variant: str, fixtures_dir: Path) -> None:
    """Discovery asks a plain-http server on this machine through a LoopbackGetter: the same answers."""
    with FakeServer(routes_for(variant, fixtures_dir)) as server:
        getter = LoopbackGetter.for_url(server.url)
        assert getter is not None
        try:
            assert identify_kind(server.url, getter) == EXPECTED[variant]
        finally:
            getter.close()


def test_identify_nothing_listening_over_http_client() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    getter = LoopbackGetter.for_url(url)
    assert getter is not None
    kind, why = identify(url, getter)
    assert kind is None and why.startswith("unreachable:")


def test_a_loopback_server_is_found_and_polled_without_an_httpx_client(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An httpx client sets up TLS (~3 MiB a tray would keep for good): none is made for a plain-http
    server on this machine, whether discovery scans it or a probe polls it."""

    def no_client(*args: Any, **kwargs: Any) -> httpx.Client:
        raise AssertionError("an httpx client was made")

    monkeypatch.setattr("trayapp.sources.discovery.make_client", no_client)
    monkeypatch.setattr("trayapp.sources.servers.common.make_client", no_client)
    with FakeServer(routes_for("llamacpp", fixtures_dir)) as llama:
        discovery = Discovery(scan_ports=[llama.port])
        try:
            (probe,) = discovery.refresh(0.0)
            assert isinstance(probe, LlamaCppProbe)
            reading = probe.poll(time.monotonic())
            assert reading.status == "ok", reading.reason
            assert llama.count("GET", "/health") >= 1 and llama.count("GET", "/props") >= 1
        finally:
            discovery.close()
