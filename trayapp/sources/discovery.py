"""Find local LLM servers and keep one probe per server.

Configured endpoints are always listed (a dead one shows as unreachable);
the default loopback ports are scanned as well. Ports alone do not identify a
server (llama-server and MLX-LM both default to 8080), so each answering port
is identified by what its endpoints say (reference/backends.md §1–§5). Scans
run concurrently with short timeouts and are repeated every
`reprobe_interval_s`, so a server started later is found without a restart.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import httpx

from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.loopback import server_key
from trayapp.core.model import ServerReading, ServerState
from trayapp.core.probe import ServerProbe
from trayapp.core.redact import redact_url
from trayapp.core.server_kinds import default_ports, server_kind_row
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.http import FetchError, LoopbackGetter, auth_headers, fetch, make_client
from trayapp.sources.servers.llamacpp import LlamaCppProbe
from trayapp.sources.servers.llamacpp_router import ROUTER_KIND, LlamaRouterProbe, is_router_props
from trayapp.sources.servers.lmstudio import LmStudioProbe
from trayapp.sources.servers.ollama import OllamaProbe
from trayapp.sources.servers.openai_compat import MlxProbe, OpenAiProbe, SglangProbe, VllmProbe

log = logging.getLogger(__name__)

SCAN_HOST = "127.0.0.1"
IDENTIFY_TIMEOUT = httpx.Timeout(connect=0.5, read=1.5, write=1.0, pool=1.0)
IDENTIFY_MAX_BYTES = 2 * 1024 * 1024
_ANY_STATUS = tuple(range(100, 600))

ProbeFactory = Callable[..., ServerProbe]


@dataclass(frozen=True)
class Endpoint:
    """A server the user configured (or one a scan found). `url` is kept exactly as given."""

    url: str
    kind: str | None = None  # None: identify it
    api_key_env: str | None = None  # environment variable holding the API key
    name: str | None = None
    hardware: HardwareProfile | None = None  # the machine it runs on, when not this one


# --------------------------------------------------------------------------- identification


@dataclass(frozen=True)
class _Answer:
    status: int
    text: str

    def json(self) -> Any:
        try:
            return json.loads(self.text)
        except ValueError:
            return None


class _NoAnswer(Exception):
    """The server did not answer at HTTP level (refused, hung, broke the connection)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def identify(
    url: str, client: httpx.Client | LoopbackGetter, api_key: str | None = None
) -> tuple[str | None, str]:
    """Identify the server at `url`: `(kind, why)`; kind is None when nothing recognisable answers.

    `client` is an httpx client, or a `LoopbackGetter` of `url` used by nothing else.
    `why` starts with "unreachable:" when nothing answered at HTTP level.
    """
    base = url.rstrip("/")
    headers = auth_headers(api_key)

    def get(path: str) -> _Answer:
        limits: dict[str, Any] = dict(headers=headers, max_bytes=IDENTIFY_MAX_BYTES, ok_statuses=_ANY_STATUS)
        try:
            if isinstance(client, LoopbackGetter):
                answer = client.get(path, **limits)
                if answer is None:  # only while another request runs on it: this getter is ours alone
                    raise FetchError("error", f"{path}: the connection is busy")
                response = answer
            else:
                response = fetch(client, base + path, **limits)
        except FetchError as exc:
            raise _NoAnswer(exc.status, exc.reason) from exc
        return _Answer(response.status_code, response.text)

    try:
        return _identify(get)
    except _NoAnswer as exc:
        prefix = "unreachable" if exc.status == "unreachable" else "no answer"
        return None, f"{prefix}: {exc.reason}"


def _identify(get: Callable[[str], _Answer]) -> tuple[str | None, str]:
    root = get("/")
    if root.status == 200 and "Ollama is running" in root.text:
        version = get("/api/version").json()
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            return "ollama", "GET / says 'Ollama is running' and /api/version answers"

    props = get("/props")
    props_json = props.json()
    if props.status == 200 and is_router_props(props_json):
        return ROUTER_KIND, "/props says role=router (llama-server serving several models)"
    llama_props = isinstance(props_json, dict) and ("model_path" in props_json or "build_info" in props_json)
    if props.status == 200 and llama_props:
        return "llamacpp", "/props has model_path/build_info"
    health = get("/health")
    if health.status == 200:
        slots = get("/slots")
        if slots.status == 200 and isinstance(slots.json(), list):
            return "llamacpp", "/health and /slots answer"
        if slots.status == 401 and props.status == 401:
            return "llamacpp", "/health answers; /props and /slots need an API key"

    for path in ("/api/v1/models", "/api/v0/models"):
        answer = get(path)
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict) and ("models" in data or "data" in data):
            return "lmstudio", f"{path} answers"

    metrics = get("/metrics")
    if metrics.status == 200:
        if "vllm:" in metrics.text:
            return "vllm", "/metrics has vllm: series"
        if "sglang:" in metrics.text:
            return "sglang", "/metrics has sglang: series"
    info = get("/get_model_info")
    if info.status == 200 and isinstance(info.json(), dict):
        return "sglang", "/get_model_info answers"

    models = get("/v1/models")
    models_ok = models.status == 200 and isinstance(models.json(), dict)
    health_ok = health.status == 200 and health.json() == {"status": "ok"}
    if health_ok and props.status == 404 and models.status == 200 and (models_ok or not models.text.strip()):
        # mlx_lm.server: its /v1/models dies after the headers (an empty body) where the machine has no
        # Hugging Face cache folder; no other server answers that, nor /health with exactly this
        return "mlx", "/health and /v1/models answer, /props does not"
    if models_ok:
        return "openai", "/v1/models answers"
    if models.status in (401, 403):
        return "openai", "/v1/models needs an API key"
    return None, "answers HTTP but is not a recognised LLM server"


def identify_kind(url: str, client: httpx.Client, api_key: str | None = None) -> str | None:
    """The server kind at `url` ("ollama", "llamacpp", "llamacpp-router", "lmstudio", "vllm",
    "sglang", "mlx", "openai"), or None when nothing recognisable answers."""
    return identify(url, client, api_key)[0]


# --------------------------------------------------------------------------- probes


class UnidentifiedProbe:
    """Stands in for a configured endpoint that could not be identified (yet)."""

    kind = "unknown"

    def __init__(self, url: str, status: ServerState, reason: str) -> None:
        self.url = redact_url(url)  # as every probe names its server (HttpProbe)
        self.status: ServerState = status
        self.reason = reason

    def poll(self, now_mono_s: float) -> ServerReading:
        return ServerReading(self.kind, self.url, self.status, self.reason)

    def close(self) -> None:
        pass


# Each kind's probe class, by the class's own `kind`; a router's readings say "llamacpp" too.
_PROBES: dict[str, ProbeFactory] = {
    probe.kind: probe
    for probe in (LlamaCppProbe, OllamaProbe, LmStudioProbe, VllmProbe, SglangProbe, MlxProbe, OpenAiProbe)
} | {ROUTER_KIND: LlamaRouterProbe}


def make_probe(
    kind: str,
    url: str,
    api_key: str | None = None,
    facts_loader: ModelFactsLoader | None = None,
    *,
    ollama_log: str = "auto",
) -> ServerProbe:
    """A probe for a server of `kind` at `url`. Raises ValueError for an unknown kind.

    `kind` is a server kind or "llamacpp-router" (a llama-server router: its probe's readings
    say "llamacpp"). Only the probes that can read a local model file get `facts_loader`: not
    those of the kinds that speak the OpenAI-compatible API alone (`core/server_kinds.py`).
    An Ollama probe gets `ollama_log` (the setting `monitor.ollama_log`).
    """
    probe = _PROBES.get(kind)
    if probe is None:
        raise ValueError(f"unknown server kind {kind!r}")
    if probe is OllamaProbe:
        return OllamaProbe(url, api_key=api_key, facts_loader=facts_loader, ollama_log=ollama_log)
    row = server_kind_row(kind)
    if row is not None and row.openai_compatible:
        return probe(url, api_key=api_key)
    return probe(url, api_key=api_key, facts_loader=facts_loader)


def env_api_key(endpoint: Endpoint) -> str | None:
    """The default key lookup: the endpoint's environment variable, if set."""
    if not endpoint.api_key_env:
        return None
    return os.environ.get(endpoint.api_key_env) or None


# --------------------------------------------------------------------------- discovery


def _probe_kind(probe: ServerProbe | None) -> str | None:
    """The kind `identify` gives the server behind `probe` (a router's readings say "llamacpp")."""
    if isinstance(probe, LlamaRouterProbe):
        return ROUTER_KIND
    return probe.kind if probe is not None else None


@dataclass
class _Target:
    endpoint: Endpoint
    configured: bool
    probe: ServerProbe | None = None
    checked_at_s: float | None = None
    pending: Future[tuple[str | None, str]] | None = None


class Discovery:
    """Configured endpoints plus a scan of the default loopback ports → probes.

    `refresh(now_mono_s)` (cheap between re-probes) returns the current probes:
    configured endpoints first, in the order given, then servers found by the scan.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint] = (),
        scan_defaults: bool = True,
        reprobe_interval_s: float = 30.0,
        probe_factory: ProbeFactory = make_probe,
        *,
        scan_ports: Iterable[int] | None = None,
        scan_host: str = SCAN_HOST,
        facts_loader: ModelFactsLoader | None = None,
        api_key_lookup: Callable[[Endpoint], str | None] = env_api_key,
        scan_wait_s: float = 5.0,
        max_workers: int = 4,
    ) -> None:
        self.reprobe_interval_s = reprobe_interval_s
        self.scan_wait_s = scan_wait_s
        self._probe_factory = probe_factory
        self._facts_loader = facts_loader
        self._api_key_lookup = api_key_lookup
        self._max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None
        self._targets: list[_Target] = [_Target(endpoint, configured=True) for endpoint in endpoints]
        if scan_defaults:
            taken = {server_key(endpoint.url) for endpoint in endpoints}
            ports = default_ports() if scan_ports is None else sorted(set(scan_ports))
            for port in ports:
                url = f"http://{scan_host}:{port}"
                if server_key(url) not in taken:
                    self._targets.append(_Target(Endpoint(url), configured=False))

    def endpoint_for(self, url: str) -> Endpoint | None:
        """The endpoint (configured, or found by the scan with its kind) behind a probe's url."""
        for target in self._targets:
            if url in (target.endpoint.url, redact_url(target.endpoint.url)) or (
                target.probe is not None and target.probe.url == url
            ):
                return target.endpoint
        return None

    def refresh(self, now_mono_s: float) -> list[ServerProbe]:
        for target in self._targets:
            if target.configured and target.endpoint.kind:
                if target.probe is None:
                    target.probe = self._make(target.endpoint.kind, target.endpoint)
                if target.endpoint.kind != "llamacpp":
                    continue  # a configured llama-server is still asked whether it is a router
            if target.pending is None and (
                target.checked_at_s is None or now_mono_s - target.checked_at_s >= self.reprobe_interval_s
            ):
                target.checked_at_s = now_mono_s
                target.pending = self._executor().submit(self._identify, target.endpoint)
        pending = [t.pending for t in self._targets if t.pending is not None]
        if pending:
            wait(pending, timeout=self.scan_wait_s)
        for target in self._targets:
            if target.pending is not None and target.pending.done():
                future, target.pending = target.pending, None
                try:
                    kind, why = future.result()
                except Exception as exc:  # a bug in identification must not stop discovery
                    log.error(
                        "discovery: identifying %s failed", redact_url(target.endpoint.url), exc_info=exc
                    )
                    kind, why = None, f"identification failed: {type(exc).__name__}: {exc}"
                self._apply(target, kind, why)
        return [target.probe for target in self._targets if target.probe is not None]

    def _identify(self, endpoint: Endpoint) -> tuple[str | None, str]:
        """What answers at the endpoint. A plain-http server on this machine (every default port) is
        asked through a `LoopbackGetter` (HTTP/1.1 on a plain socket): no httpx client, and no TLS
        set-up kept in a tray's memory."""
        getter = LoopbackGetter.for_url(endpoint.url, IDENTIFY_TIMEOUT)
        if getter is not None:
            try:
                return identify(endpoint.url, getter, self._api_key(endpoint))
            finally:
                getter.close()
        with make_client(endpoint.url, timeout=IDENTIFY_TIMEOUT) as client:
            return identify(endpoint.url, client, self._api_key(endpoint))

    def _apply(self, target: _Target, kind: str | None, why: str) -> None:
        current = target.probe
        if target.configured and target.endpoint.kind:
            # The user named the kind: only a llama-server's mode (router or not) is decided here.
            if kind in ("llamacpp", ROUTER_KIND) and _probe_kind(current) != kind:
                log.info("discovery: %s identified as %s (%s)", redact_url(target.endpoint.url), kind, why)
                self._close(current)
                target.probe = self._make(kind, target.endpoint)
            return
        if kind is not None:
            if current is None or _probe_kind(current) != kind:
                log.info("discovery: %s identified as %s (%s)", redact_url(target.endpoint.url), kind, why)
                self._close(current)
                target.probe = self._make(kind, target.endpoint)
                if not target.configured:
                    target.endpoint = Endpoint(target.endpoint.url, kind=kind)
            return
        if target.configured:
            if current is None or isinstance(current, UnidentifiedProbe):
                status: ServerState = "unreachable" if why.startswith("unreachable") else "error"
                target.probe = UnidentifiedProbe(target.endpoint.url, status, why)
        elif current is not None and why.startswith(("unreachable", "no answer")):
            log.info("discovery: %s is gone (%s)", redact_url(target.endpoint.url), why)
            self._close(current)
            target.probe = None
            target.endpoint = Endpoint(target.endpoint.url)

    def _make(self, kind: str, endpoint: Endpoint) -> ServerProbe:
        try:
            return self._probe_factory(
                kind, endpoint.url, api_key=self._api_key(endpoint), facts_loader=self._facts_loader
            )
        except Exception as exc:  # a bug in a probe's constructor: show it on that server, keep discovering
            log.exception("discovery: no probe for %s at %s", kind, redact_url(endpoint.url))
            return UnidentifiedProbe(
                endpoint.url, "error", f"no probe for {kind}: {type(exc).__name__}: {exc}"
            )

    def _api_key(self, endpoint: Endpoint) -> str | None:
        try:
            return self._api_key_lookup(endpoint)
        except Exception as exc:
            log.warning("discovery: API key lookup failed for %s: %s", redact_url(endpoint.url), exc)
            return None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="discovery")
        return self._pool

    @staticmethod
    def _close(probe: ServerProbe | None) -> None:
        if probe is None:
            return
        try:
            probe.close()
        except Exception as exc:
            log.warning("discovery: closing the probe for %s failed: %s", probe.url, exc)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for target in self._targets:
            self._close(target.probe)
            target.probe = None
