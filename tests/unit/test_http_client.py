"""Every HTTP client shares one TLS context (#24 item 9): httpx otherwise loads the CA bundle for each
new client, ~40–70 ms of CPU on this host's core, and discovery makes a client per probe of every
port every 30 s — the idle tray's largest cost. Sharing must keep certificate checks as they were."""

from __future__ import annotations

import ssl

import pytest

from trayapp.sources import http


def test_clients_share_one_tls_context_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    http.tls_context.cache_clear()
    try:
        for port in (8080, 11434, 1234, 9931, 8000):
            http.make_client(f"http://127.0.0.1:{port}").close()
        http.make_client("https://models.example.org").close()
        assert len(loads) == 1  # one CA bundle for all six clients
    finally:
        http.tls_context.cache_clear()


def test_the_shared_context_still_verifies_certificates_and_host_names() -> None:
    context = http.tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # a CA bundle is loaded
