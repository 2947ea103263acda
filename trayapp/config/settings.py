"""Settings: frozen dataclasses, loaded from and saved to a TOML file.

A syntax error names the line, a bad value its key path; the app then starts on defaults for what is
broken and keeps the file as a backup, so nothing is lost. Saving is atomic (temp file, rename). API
keys and proxy tokens never live here: an endpoint names a keyring entry or an environment variable."""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

from trayapp.config.agents import AgentConfig, build_agent
from trayapp.config.list_sections import ENV_NAME, ConfigError, EntryBuilder, parse_list
from trayapp.core.alert_kinds import DEFAULT_MUTED_KINDS
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.loopback import host_key, is_loopback, server_key
from trayapp.core.quants import KV_TYPES
from trayapp.core.server_kinds import USER_SERVER_KINDS
from trayapp.core.thresholds import THRESHOLD_INFO, Thresholds
from trayapp.core.units import GB

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # a settings dataclass built from its table
DEFAULT_TOKEN_ENV = "LLM_TRAY_TOKEN"  # the proxy clients' bearer token (as `llm-tray proxy`)


@dataclass(frozen=True)
class EndpointConfig:
    url: str
    kind: str | None = None  # None: identify by probing
    name: str | None = None
    api_key_env: str | None = None  # read the key from this environment variable
    use_keyring: bool = False  # the key is in the OS keyring (service "llm-tray", user = url)
    gpu: str | None = None  # hardware of the machine that runs this server (remote boxes)
    bandwidth_gbps: float | None = None
    vram_gb: float | None = None
    ram_bandwidth_gbps: float | None = None

    def hardware_profile(self, base: HardwareProfile) -> HardwareProfile:
        if (
            self.gpu is None
            and self.bandwidth_gbps is None
            and self.vram_gb is None
            and self.ram_bandwidth_gbps is None
        ):
            return base
        return replace(
            base,
            gpu_name=self.gpu or base.gpu_name,
            bandwidth_gbps=self.bandwidth_gbps if self.bandwidth_gbps is not None else base.bandwidth_gbps,
            vram_bytes=int(self.vram_gb * GB) if self.vram_gb is not None else base.vram_bytes,
            ram_bandwidth_gbps=(
                self.ram_bandwidth_gbps if self.ram_bandwidth_gbps is not None else base.ram_bandwidth_gbps
            ),
        )


def check_server_kind(kind: str) -> str:
    """`kind` if a user may name it; else ValueError naming the valid kinds and a close match."""
    if kind in USER_SERVER_KINDS:
        return kind
    close = difflib.get_close_matches(kind.lower(), USER_SERVER_KINDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown server kind {kind!r}{hint}: use one of {', '.join(USER_SERVER_KINDS)}")


def endpoint_from_arg(value: str) -> EndpointConfig:
    """`[KIND=]URL` from the command line; ValueError for a bad URL or an unknown kind."""
    kind, sep, url = value.partition("=")
    if not sep or "://" in kind:
        kind, url = "", value
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint {value!r}: expected [KIND=]http://HOST:PORT")
    return EndpointConfig(url=url, kind=check_server_kind(kind) if kind else None)


def endpoint_arg(value: str) -> str:
    """An argparse `type` for `[KIND=]URL`: checked at parse time (a usage error, exit 2), kept as text."""
    try:
        endpoint_from_arg(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


@dataclass(frozen=True)
class ProxyConfig:
    """A recording proxy the tray app runs: clients use `listen`, requests go on to `upstream`."""

    listen: str  # HOST:PORT, e.g. 127.0.0.1:11435 ([::1]:PORT for IPv6)
    upstream: str  # the server's base URL, e.g. http://127.0.0.1:11434
    kind: str | None = None  # the upstream's server kind; None: OpenAI-compatible
    enabled: bool = True
    allow_remote: bool = False  # needed for a listen address beyond loopback (clients then need a token)
    token_env: str = DEFAULT_TOKEN_ENV  # the environment variable holding the clients' token

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def remote(self) -> bool:
        return not is_loopback(self.listen_host)

    @property
    def client_url(self) -> str:
        """The address clients should use, e.g. `http://127.0.0.1:11435`."""
        host = self.listen_host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.listen_port}"


# While everything idles, polls come every `poll_idle_s`; between them each server on this machine is
# looked at this often (its process's CPU time: nothing asked of the server, services/poll_thread.py),
# and work seen there starts the next poll at once: a request of a second or two is seen running.
ACTIVITY_CHECK_S = 1.0


@dataclass(frozen=True)
class MonitorConfig:
    discover: bool = True
    poll_active_s: float = 1.0  # while something generates
    poll_idle_s: float = 5.0  # while everything is idle
    rediscover_s: float = 30.0
    session_idle_gap_s: float = 60.0
    metrics_interval_s: float = 10.0  # llama-server /metrics scrapes (they reset its gauges)
    # Ollama's server log, read for its silent prompt truncations (#20): "auto" (this OS's place for
    # it, sources/ollama_log.py), "off", or a path; the environment variable LLM_TRAY_OLLAMA_LOG wins
    ollama_log: str = "auto"


@dataclass(frozen=True)
class HardwareConfig:
    gpu: str | None = None
    bandwidth_gbps: float | None = None
    vram_gb: float | None = None
    ram_bandwidth_gbps: float | None = None
    kv_type: str = "f16"

    def profile(self) -> HardwareProfile:
        return HardwareProfile(
            gpu_name=self.gpu,
            bandwidth_gbps=self.bandwidth_gbps,
            vram_bytes=int(self.vram_gb * GB) if self.vram_gb is not None else None,
            ram_bandwidth_gbps=self.ram_bandwidth_gbps,
            kv_type=self.kv_type,
        )


@dataclass(frozen=True)
class NotificationConfig:
    enabled: bool = True
    do_not_disturb: bool = False
    muted_kinds: tuple[str, ...] = DEFAULT_MUTED_KINDS  # the table's; a user's list, once saved, is kept


@dataclass(frozen=True)
class ExporterConfig:
    enabled: bool = False
    address: str = "127.0.0.1"
    port: int = 9464


@dataclass(frozen=True)
class StoreConfig:
    retention_days: float = 30.0
    max_size_mb: float = 512.0
    sample_interval_s: float = 1.0


@dataclass(frozen=True)
class UiConfig:
    start_at_login: bool = False
    paused: bool = False


@dataclass(frozen=True)
class Settings:
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    thresholds: Thresholds = field(default_factory=Thresholds)
    notifications: NotificationConfig = field(default_factory=NotificationConfig)
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    endpoints: tuple[EndpointConfig, ...] = ()
    proxies: tuple[ProxyConfig, ...] = ()
    agents: tuple[AgentConfig, ...] = ()  # remote machines' agents (config/agents.py)


_SECTIONS: dict[str, type] = {
    "monitor": MonitorConfig,
    "hardware": HardwareConfig,
    "thresholds": Thresholds,
    "notifications": NotificationConfig,
    "exporter": ExporterConfig,
    "store": StoreConfig,
    "ui": UiConfig,
}

# Range checks (inclusive) for numeric values, by key path (the thresholds' are core/thresholds.py's).
RANGES: dict[str, tuple[float, float]] = {
    "monitor.poll_active_s": (0.2, 60),
    "monitor.poll_idle_s": (0.2, 600),
    "monitor.rediscover_s": (1, 3600),
    "monitor.session_idle_gap_s": (1, 86400),
    "monitor.metrics_interval_s": (1, 3600),
    "exporter.port": (1, 65535),
    "store.retention_days": (0.01, 36500),
    "store.max_size_mb": (1, 1_000_000),
    "store.sample_interval_s": (0.1, 3600),
} | {f"thresholds.{name}": (info.low, info.high) for name, info in THRESHOLD_INFO.items()}
# Hardware figures no machine exceeds (a GB/s or GB beyond these is a typo, or `inf`): one bound each,
# for [hardware] and every [[endpoints]] entry alike.
HARDWARE_RANGES: dict[str, tuple[float, float]] = {
    "bandwidth_gbps": (0.001, 1_000_000),
    "ram_bandwidth_gbps": (0.001, 1_000_000),
    "vram_gb": (0.001, 1_000_000),
}
MAX_NESTING = 8  # no setting nests deeper (a list of tables of lists); deeper is a broken file
_SHOWN_CHARS = 80  # a bad value is quoted to this length in its message


def _shown(value: Any) -> str:
    """`repr(value)`, cut to a line: a message never quotes a megabyte of the file."""
    text = repr(value) if nesting_depth(value) <= MAX_NESTING else "a value nested too deep"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def nesting_depth(value: Any) -> int:
    """How deep lists and tables nest in `value` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in item)
    return deepest


def _range(path: str) -> tuple[float, float] | None:
    if path in RANGES:
        return RANGES[path]
    return (
        HARDWARE_RANGES.get(path.rpartition(".")[2]) if path.startswith(("hardware.", "endpoints")) else None
    )


def _check_value(path: str, value: Any, annotation: str) -> Any:
    """Coerce/validate one value against a field's annotation string."""
    optional = "None" in annotation
    if value is None and optional:
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_shown(value)}")
        return value
    if annotation.startswith(("float", "int")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {_shown(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: expected a finite number, got {value!r}")
        bounds = _range(path)
        if bounds is not None:
            low, high = bounds
            if not low <= value <= high:
                raise ConfigError(f"{path}: {value!r} is out of range ({low:g} to {high:g})")
        if annotation.startswith("int"):
            if isinstance(value, float) and not value.is_integer():
                raise ConfigError(f"{path}: expected a whole number, got {value!r}")
            return int(value)
        if value <= 0 and path.endswith(("_gbps", "_gb")):
            raise ConfigError(f"{path}: must be positive, got {value!r}")
        return float(value)
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_shown(value)}")
        if path.endswith("kv_type") and value not in KV_TYPES:
            raise ConfigError(f"{path}: unknown KV cache type {value!r} (one of {', '.join(KV_TYPES)})")
        if path == "monitor.ollama_log" and not value.strip():
            raise ConfigError(f'{path}: expected "auto", "off" or the path of Ollama\'s server log')
        return value
    if annotation.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings, got {_shown(value)}")
        return tuple(value)
    raise ConfigError(f"{path}: unsupported value {_shown(value)}")  # pragma: no cover


def _build(cls: type[T], data: Any, prefix: str) -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table, got {_shown(data)}")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}"
        if key not in known:
            raise ConfigError(f"{path}: unknown setting")
        kwargs[key] = _check_value(path, value, str(known[key].type))
    return cls(**kwargs)


def _build_endpoint(data: Any, prefix: str, _earlier: Sequence[EndpointConfig]) -> EndpointConfig:
    endpoint = _build(EndpointConfig, data, prefix) if isinstance(data, dict) and "url" in data else None
    if endpoint is None:
        raise ConfigError(f"{prefix}.url: every endpoint needs a url")
    if not endpoint.url.startswith(("http://", "https://")):
        raise ConfigError(f"{prefix}.url: expected http:// or https://, got {endpoint.url!r}")
    if endpoint.kind is not None:
        _check_kind(prefix, endpoint.kind)
    return endpoint


def _check_kind(prefix: str, kind: str) -> None:
    """A kind a user may name, as on the command line ("unknown" is no kind to name)."""
    try:
        check_server_kind(kind)
    except ValueError as exc:
        raise ConfigError(f"{prefix}.kind: {exc}") from None


def _check_listen(prefix: str, listen: str) -> None:
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{prefix}.listen: expected HOST:PORT, e.g. 127.0.0.1:11435, got {listen!r}")
    if not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{prefix}.listen: port {port_text} is out of range (1 to 65535)")
    if not is_loopback(host):  # localhost is the one name allowed
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(
                f"{prefix}.listen: {host!r} is not an IP address (use 127.0.0.1, ::1 or localhost)"
            ) from None


def _build_proxy(data: Any, prefix: str, earlier: Sequence[ProxyConfig]) -> ProxyConfig:
    if isinstance(data, dict) and "token" in data:
        raise ConfigError(
            f"{prefix}.token: tokens never go in the config file: put it in an environment variable "
            f"and name that variable with token_env (default {DEFAULT_TOKEN_ENV})"
        )
    if not isinstance(data, dict) or "listen" not in data or "upstream" not in data:
        raise ConfigError(f"{prefix}: every proxy needs listen and upstream")
    proxy: ProxyConfig = _build(ProxyConfig, data, prefix)
    _check_listen(prefix, proxy.listen)
    parts = urlsplit(proxy.upstream)
    try:
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        raise ConfigError(f"{prefix}.upstream: bad port in {proxy.upstream!r}") from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ConfigError(
            f"{prefix}.upstream: expected http://HOST:PORT (local servers speak plain HTTP), "
            f"got {proxy.upstream!r}"
        )
    if proxy.kind is not None:
        _check_kind(prefix, proxy.kind)
    if not ENV_NAME.match(proxy.token_env):
        raise ConfigError(f"{prefix}.token_env: {proxy.token_env!r} is not an environment variable name")
    if proxy.remote and not proxy.allow_remote:
        raise ConfigError(
            f"{prefix}.listen: {proxy.listen_host} is not a loopback address: add allow_remote = true "
            f"(clients then need the token from ${proxy.token_env})"
        )
    listen_key = host_key(proxy.listen_host), proxy.listen_port
    if listen_key == server_key(proxy.upstream):
        raise ConfigError(f"{prefix}.upstream: the proxy would forward to itself")
    if any((host_key(p.listen_host), p.listen_port) == listen_key for p in earlier):
        raise ConfigError(f"{prefix}.listen: {proxy.listen} is used by another proxy")
    return replace(proxy, upstream=proxy.upstream.rstrip("/"))


# The list sections (config/list_sections.py), each with the builder of one entry.
LIST_SECTIONS: dict[str, EntryBuilder[Any]] = {
    "endpoints": _build_endpoint,
    "proxies": _build_proxy,
    "agents": build_agent,
}


def proxy_token(proxy: ProxyConfig, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(the clients' token or None, why the proxy cannot start or None), as `llm-tray proxy` decides:
    a set token is always required from clients; off loopback one must be set."""
    token = environ.get(proxy.token_env) or None
    if proxy.remote and token is None:
        return None, (
            f"proxy {proxy.listen} is off: it listens beyond this machine and needs a token: "
            f"set the environment variable {proxy.token_env}"
        )
    return token, None


def watched_settings(settings: Settings) -> Settings:
    """The settings the monitor uses: each enabled proxy's upstream is watched (its records need it)."""
    taken = {server_key(e.url) for e in settings.endpoints}
    extra: list[EndpointConfig] = []
    for proxy in settings.proxies:
        if proxy.enabled and server_key(proxy.upstream) not in taken:
            taken.add(server_key(proxy.upstream))
            extra.append(EndpointConfig(url=proxy.upstream, kind=proxy.kind))
    return replace(settings, endpoints=settings.endpoints + tuple(extra)) if extra else settings


def parse_settings(data: dict[str, Any]) -> tuple[Settings, list[str]]:
    """Build Settings from parsed TOML. Bad sections fall back to defaults; errors are returned."""
    errors: list[str] = []
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            try:
                kwargs[key] = _build(_SECTIONS[key], value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        elif key in LIST_SECTIONS:
            kwargs[key] = parse_list(key, value, LIST_SECTIONS[key], errors)
        else:
            errors.append(f"{key}: unknown section")
    return Settings(**kwargs), errors
