"""Discovery without a network: the default ports, the probe each kind gets, a missing probe module.

The tests that identify servers over HTTP live in tests/integration/test_discovery_http.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from trayapp.core.server_kinds import SERVER_KINDS, default_ports
from trayapp.sources.discovery import Discovery, Endpoint, make_probe
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.servers.llamacpp import LlamaCppProbe
from trayapp.sources.servers.lmstudio import LmStudioProbe
from trayapp.sources.servers.ollama import OllamaProbe
from trayapp.sources.servers.openai_compat import MlxProbe, OpenAiProbe, SglangProbe, VllmProbe


def test_default_ports() -> None:
    """Each server's out-of-the-box port, from its documentation (reference/backends.md)."""
    ports = {kind: row.default_port for kind, row in SERVER_KINDS.items() if row.default_port is not None}
    assert ports == {
        "ollama": 11434,
        "llamacpp": 8080,
        "lmstudio": 1234,
        "vllm": 8000,
        "sglang": 30000,
        "mlx": 8080,
    }
    assert SERVER_KINDS["llamacpp"].other_ports == (9931,)  # upstream's new default (llama.cpp #26508)
    assert default_ports() == [1234, 8000, 8080, 9931, 11434, 30000]  # scanned once each: 8080 is two kinds'


def test_missing_probe_module_shows_as_error() -> None:
    def broken_factory(kind: str, url: str, api_key: str | None = None, facts_loader: Any = None) -> Any:
        raise ImportError("No module named 'trayapp.sources.servers.lmstudio'")

    url = "http://127.0.0.1:1234"
    discovery = Discovery([Endpoint(url, kind="lmstudio")], scan_defaults=False, probe_factory=broken_factory)
    try:
        (probe,) = discovery.refresh(0.0)
        reading = probe.poll(0.0)
    finally:
        discovery.close()
    assert (
        reading.status == "error" and reading.reason is not None and "no probe for lmstudio" in reading.reason
    )


@pytest.mark.parametrize(
    ("kind", "probe_class"),
    [
        ("llamacpp", LlamaCppProbe),
        ("ollama", OllamaProbe),
        ("lmstudio", LmStudioProbe),
        ("vllm", VllmProbe),
        ("sglang", SglangProbe),
        ("mlx", MlxProbe),
        ("openai", OpenAiProbe),
    ],
)
def test_each_server_kind_gets_its_probe_with_the_url_as_given(kind: str, probe_class: type) -> None:
    probe = make_probe(kind, "http://127.0.0.1:8080/", api_key="k", facts_loader=ModelFactsLoader())
    try:
        assert type(probe) is probe_class and probe.kind == kind and probe.url == "http://127.0.0.1:8080/"
    finally:
        probe.close()


def test_an_unknown_server_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown server kind"):
        make_probe("koboldcpp", "http://127.0.0.1:5001")
