"""llama-server as of build 11434 and after (issue #22): found on upstream's new default port 9931;
every current `--spec-type` named, per-position draft acceptance from `/metrics`."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.support.llama import LlamaServer, generate_in_background, monitor_for, tick_until_done
from trayapp.core.jsonview import model_json
from trayapp.core.spec_types import speculative_text
from trayapp.sources.discovery import Discovery
from trayapp.sources.servers.llamacpp import LlamaCppProbe
from trayapp.sources.servers.llamacpp_parse import parse_metrics

pytestmark = pytest.mark.llamacpp

NEW_DEFAULT_PORT = 9931


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_server_on_9931_found_by_plain_discovery(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """A real llama-server listening on 9931 (no endpoint configured) is found by the default scan
    and watched by the llama-server probe, which reads its model. About 3 s."""
    if _port_taken(NEW_DEFAULT_PORT):
        pytest.skip(f"port {NEW_DEFAULT_PORT} is taken on this host")
    with LlamaServer(model_path, binary=llama_binary, port=NEW_DEFAULT_PORT, log_dir=tmp_path) as server:
        discovery = Discovery()
        try:
            probes = {probe.url: probe for probe in discovery.refresh(0.0)}
            probe = probes.get(server.url)
            assert isinstance(probe, LlamaCppProbe), sorted(probes)
            reading = probe.poll(1.0)
            assert reading.status == "ok", reading.reason
            assert [m.model_path for m in reading.models] == [str(model_path)]
        finally:
            discovery.close()


SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def test_spec_types_and_per_position_acceptance_from_a_real_server(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """A real llama-server drafting for itself with six kinds at once (`-md MODEL --spec-type
    draft-simple,ngram-…`; the draft-eagle3/-mtp/-dflash/-dspark kinds need models made for them):
    the model's JSON and card name every kind, and the per-position acceptance equals the server's
    own `/metrics` (accepted at each position ÷ drafts) over the request. About 10-20 s."""
    args = ["-md", str(model_path), "--spec-type", ",".join(SPEC_TYPES)]
    with LlamaServer(model_path, binary=llama_binary, log_dir=tmp_path, extra_args=args) as server:
        monitor = monitor_for(server.url)
        try:
            monitor.tick()
            future = generate_in_background(server.url, "Count from one to thirty: one, two, three,", 48)
            snapshots = tick_until_done(monitor, future, interval_s=0.5)
        finally:
            monitor.close()
        counters = parse_metrics(httpx.get(server.url + "/metrics", timeout=10.0).text)
    timings = future.result()["timings"]
    assert timings["draft_n"] > 0, "the server drafted nothing"
    drafts = counters.spec_drafts_total
    assert drafts and counters.spec_accepted_tokens_total == timings["draft_n_accepted"]
    reached = max(i + 1 for i, accepted in enumerate(counters.spec_accepted_per_position) if accepted > 0)
    expected = [round(a / drafts, 4) for a in counters.spec_accepted_per_position[:reached]]

    model = snapshots[-1].servers[0].models[0]
    assert model.spec_type is not None and set(model.spec_type.split(",")) == set(SPEC_TYPES)
    data = model_json(model)
    assert data["draft_acceptance_by_position"] == expected
    assert data["draft_acceptance"] == pytest.approx(
        timings["draft_n_accepted"] / timings["draft_n"], abs=1e-3
    )
    line = speculative_text(model.spec_type, model.draft_acceptance, model.draft_acceptance_by_position)
    assert line is not None and all(f"{kind} (" in line for kind in SPEC_TYPES)
    assert "by position " + " · ".join(f"{share * 100:.0f}" for share in expected) + " %" in line
