"""llama-server as of build 11434 and after (issue #22): found on upstream's new default port 9931."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.llama import LlamaServer
from trayapp.sources.discovery import Discovery
from trayapp.sources.servers.llamacpp import LlamaCppProbe

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
