"""Settings: frozen dataclasses, loaded from and saved to a TOML file.

A syntax error names the line; a bad value names its key path. Either way the
app starts on defaults for what is broken, and the broken file is kept as a
backup beside the config so nothing the user wrote is lost. Saving is atomic
(write a temp file, then rename). API keys never live here: an endpoint names
the keyring entry or an environment variable instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trayapp import paths
from trayapp.core.model import SERVER_KINDS, HardwareProfile
from trayapp.core.thresholds import Thresholds

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
GB = 1_000_000_000


class ConfigError(ValueError):
    """A config file problem, with where it is (line or key path)."""


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


@dataclass(frozen=True)
class MonitorConfig:
    discover: bool = True
    poll_active_s: float = 1.0  # while something generates
    poll_idle_s: float = 5.0  # while everything is idle
    rediscover_s: float = 30.0
    session_idle_gap_s: float = 60.0
    metrics_interval_s: float = 10.0  # llama-server /metrics scrapes (they reset its gauges)


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
    muted_kinds: tuple[str, ...] = ()


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


_SECTIONS: dict[str, type] = {
    "monitor": MonitorConfig,
    "hardware": HardwareConfig,
    "thresholds": Thresholds,
    "notifications": NotificationConfig,
    "exporter": ExporterConfig,
    "store": StoreConfig,
    "ui": UiConfig,
}

# Range checks (inclusive) for numeric values, by key path.
RANGES: dict[str, tuple[float, float]] = {
    "monitor.poll_active_s": (0.2, 60),
    "monitor.poll_idle_s": (0.2, 600),
    "monitor.rediscover_s": (1, 3600),
    "monitor.session_idle_gap_s": (1, 86400),
    "monitor.metrics_interval_s": (1, 3600),
    "thresholds.confirm_s": (0, 3600),
    "thresholds.clear_s": (0, 3600),
    "thresholds.kv_slowdown_pct": (1, 95),
    "thresholds.context_full_pct": (1, 100),
    "thresholds.below_floor_tok_s": (0, 1000),
    "thresholds.low_efficiency_ratio": (0.01, 1),
    "thresholds.draft_acceptance_min": (0, 1),
    "thresholds.vram_free_min_pct": (0, 100),
    "thresholds.regression_pct": (1, 95),
    "thresholds.offload_min_cpu_pct": (0, 100),
    "thresholds.offload_gpu_fraction": (0.5, 1),
    "thresholds.cold_load_min_s": (0, 3600),
    "exporter.port": (1, 65535),
    "store.retention_days": (0.01, 36500),
    "store.max_size_mb": (1, 1_000_000),
    "store.sample_interval_s": (0.1, 3600),
}


def _check_value(path: str, value: Any, annotation: str) -> Any:
    """Coerce/validate one value against a field's annotation string."""
    optional = "None" in annotation
    if value is None and optional:
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if annotation.startswith(("float", "int")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if path in RANGES:
            low, high = RANGES[path]
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
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        if path.endswith("kv_type") and value not in KV_TYPES:
            raise ConfigError(f"{path}: unknown KV cache type {value!r} (one of {', '.join(KV_TYPES)})")
        return value
    if annotation.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings, got {value!r}")
        return tuple(value)
    raise ConfigError(f"{path}: unsupported value {value!r}")  # pragma: no cover


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table, got {data!r}")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}"
        if key not in known:
            raise ConfigError(f"{path}: unknown setting")
        kwargs[key] = _check_value(path, value, str(known[key].type))
    return cls(**kwargs)


def _build_endpoint(data: Any, index: int) -> EndpointConfig:
    prefix = f"endpoints[{index}]"
    endpoint = _build(EndpointConfig, data, prefix) if isinstance(data, dict) and "url" in data else None
    if endpoint is None:
        raise ConfigError(f"{prefix}.url: every endpoint needs a url")
    if not endpoint.url.startswith(("http://", "https://")):
        raise ConfigError(f"{prefix}.url: expected http:// or https://, got {endpoint.url!r}")
    if endpoint.kind is not None and endpoint.kind not in SERVER_KINDS:
        raise ConfigError(f"{prefix}.kind: unknown server kind {endpoint.kind!r}")
    return endpoint


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
        elif key == "endpoints":
            if not isinstance(value, list):
                errors.append("endpoints: expected a list of [[endpoints]] tables")
                continue
            endpoints = []
            for index, item in enumerate(value):
                try:
                    endpoints.append(_build_endpoint(item, index))
                except ConfigError as exc:
                    errors.append(str(exc))
            kwargs["endpoints"] = tuple(endpoints)
        else:
            errors.append(f"{key}: unknown section")
    return Settings(**kwargs), errors


@dataclass(frozen=True)
class LoadResult:
    settings: Settings
    errors: tuple[str, ...] = ()
    backup_path: Path | None = None


def load_settings(path: Path | None = None) -> LoadResult:
    """Read the config file. Never raises for a bad file: returns defaults plus the errors."""
    path = path or paths.config_file()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return LoadResult(Settings())
    except OSError as exc:
        return LoadResult(Settings(), (f"{path}: cannot read ({exc.strerror or exc})",))
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return LoadResult(Settings(), (f"{path}: not UTF-8 text ({exc.reason})",), _backup(path))
    except tomllib.TOMLDecodeError as exc:
        return LoadResult(Settings(), (f"{path}: syntax error: {exc}",), _backup(path))
    settings, errors = parse_settings(data)
    backup = _backup(path) if errors else None
    return LoadResult(settings, tuple(f"{path}: {e}" for e in errors), backup)


# A secret typed into the file by mistake (`api_key = "sk-..."`): its backup keeps the line, not the value.
_SECRET_LINE = re.compile(
    r"(?im)^(\s*[\"']?(?:api[_-]?key|apikey|key|token|access[_-]?token|secret|password|passwd|authorization)"
    r"[\"']?\s*=\s*)\S.*$"
)
SECRET_REMOVED = '"<removed: API keys belong in the OS keyring or api_key_env>"'


def _without_secrets(raw: bytes) -> bytes:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw  # not text: kept as it is, so nothing the user wrote is lost
    return _SECRET_LINE.sub(lambda m: m.group(1) + SECRET_REMOVED, text).encode("utf-8")


def _backup(path: Path) -> Path | None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.broken-{stamp}")
    try:
        backup.write_bytes(_without_secrets(path.read_bytes()))
    except OSError:
        return None
    return backup


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _to_plain(getattr(value, f.name))
            for f in fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value


def settings_to_toml(settings: Settings) -> str:
    plain = _to_plain(settings)
    if not plain.get("endpoints"):
        plain.pop("endpoints", None)
    header = "# llm-tray settings. API keys are kept in the OS keyring, never here.\n"
    return header + tomli_w.dumps(plain)


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write atomically: a temp file in the same folder, fsync, then rename over the old one."""
    path = path or paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = settings_to_toml(settings)
    fd, tmp_name = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
