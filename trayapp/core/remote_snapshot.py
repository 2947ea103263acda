"""A remote agent's snapshot document (core/jsonview.py `snapshot_json`) back into core types.

Pure: the tray's Monitor fetches `GET /v1/snapshot` from each `[[agents]]` entry
(sources/remote_agent.py) and hands the parsed JSON here. `snapshot_from_json` is the inverse of
`snapshot_json` for what the document carries (model facts, per-process GPU use and request records
are not in it); `tag_remote` marks servers and alerts with the machine's name so they never collide
with this machine's: a server on the agent's loopback (`http://127.0.0.1:8080` on the box) is shown
at the machine's name (`http://gpu-box:8080`), and alert ids are prefixed `gpu-box/`.
Remote alerts are taken as the agent computed them; nothing here re-runs a detector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from trayapp.core.alert_kinds import alert_kind_name
from trayapp.core.hardware_readings import (
    VALUE_SOURCES,
    GpuProcess,
    GpuReading,
    HardwareSnapshot,
    HostReading,
    RamBandwidthChange,
    ValueSource,
)
from trayapp.core.loopback import is_this_machine
from trayapp.core.model import (
    SERVER_STATES,
    SEVERITIES,
    Alert,
    ModelStatus,
    PrefillProgress,
    ServerState,
    ServerStatus,
    Severity,
)
from trayapp.core.peers import PEER_SCOPES, PeerBand, PeerScope
from trayapp.core.phases import PHASES, Phase


class RemoteDocError(ValueError):
    """The agent's answer is not a snapshot document of a schema this version reads."""


@dataclass(frozen=True)
class RemoteDoc:
    t_wall_s: float
    servers: tuple[ServerStatus, ...]
    hardware: HardwareSnapshot
    alerts: tuple[Alert, ...]


def parse_iso_s(text: str) -> float:
    """'2026-11-30T09:16:53.123Z' → Unix seconds."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.utcoffset() is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment.timestamp()


def _opt(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RemoteDocError(f"{key}: unexpected value {value!r}")
    return value


def _num(data: Mapping[str, Any], key: str) -> float | None:
    value = _opt(data, key, (int, float))
    return None if value is None else float(value)


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = _opt(data, key, (int, float))
    return None if value is None else int(value)


def _shares(value: Any) -> tuple[float, ...]:
    """A list of shares 0..1 (`draft_acceptance_by_position`); () when absent, anything else an error."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise RemoteDocError("draft_acceptance_by_position: not a list of numbers")
    return tuple(float(v) for v in value)


def _str(data: Mapping[str, Any], key: str) -> str | None:
    return cast("str | None", _opt(data, key, str))


def _bool(data: Mapping[str, Any], key: str) -> bool | None:
    return cast("bool | None", _opt(data, key, bool))


def _choice(data: Mapping[str, Any], key: str, allowed: Sequence[str], default: str | None = None) -> str:
    value = data.get(key, default)
    if value not in allowed:
        raise RemoteDocError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return cast(str, value)


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise RemoteDocError(f"{key}: expected a list")
    return value


def _table(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RemoteDocError(f"{what}: expected an object")
    return value


def _peer_band(value: Any) -> PeerBand | None:
    """A model's published peers' band (#23; `core/peers.peer_band_json`), or None."""
    if value is None:
        return None
    data = _table(value, "peer_band")
    shares = [_num(data, k) for k in ("median_share", "low_share", "high_share", "min_share", "max_share")]
    basis, n = _str(data, "basis"), _int(data, "n")
    if basis is None or n is None or any(v is None for v in shares):
        raise RemoteDocError("peer_band: basis, n and the shares are required")
    causes = _list(data, "causes")
    if not all(isinstance(c, str) for c in causes):
        raise RemoteDocError("peer_band: causes must be a list of strings")
    median, low, high, least, most = (float(v or 0.0) for v in shares)
    return PeerBand(
        basis=basis,
        scope=cast(PeerScope, _choice(data, "scope", PEER_SCOPES)),
        quant_group=_str(data, "quant_group"),
        n=n,
        median_share=median,
        low_share=low,
        high_share=high,
        min_share=least,
        max_share=most,
        causes=tuple(causes),
    )


def model_from_json(data: Mapping[str, Any]) -> ModelStatus:
    prefill = None
    done = _int(data, "prefill_tokens_done")
    if done is not None:
        prefill = PrefillProgress(
            tokens_done=done,
            cached_tokens=_int(data, "prefill_cached_tokens") or 0,
            tokens_total=_int(data, "prefill_tokens_total"),
            tok_s=_num(data, "prefill_tok_s"),
            eta_s=_num(data, "prefill_eta_s"),
        )
    name = _str(data, "name")
    if not name:
        raise RemoteDocError("model without a name")
    return ModelStatus(
        name=name,
        phase=cast(Phase, _choice(data, "phase", PHASES)),
        size_bytes=_int(data, "size_bytes"),
        weights_bytes=_int(data, "weights_bytes"),
        vram_bytes=_int(data, "vram_bytes"),
        gpu_fraction=_num(data, "gpu_fraction"),
        gpu_fraction_source=_str(data, "gpu_fraction_source"),
        context_length=_int(data, "context_length"),
        context_tokens=_int(data, "context_tokens"),
        quantization=_str(data, "quantization"),
        parameter_count=_int(data, "parameter_count"),
        bytes_per_token=_int(data, "bytes_per_token"),
        bytes_per_token_exact=bool(_bool(data, "bytes_per_token_exact")),
        ceiling_tok_s=_num(data, "ceiling_tok_s"),
        full_gpu_ceiling_tok_s=_num(data, "full_gpu_ceiling_tok_s"),
        decode_tok_s=_num(data, "decode_tok_s"),
        decode_total_tok_s=_num(data, "decode_total_tok_s"),
        active_streams=_int(data, "active_streams") or 0,
        queued_requests=_int(data, "queued_requests"),
        decode_exact=_bool(data, "decode_exact"),
        last_decode_tok_s=_num(data, "last_decode_tok_s"),
        prompt_tok_s=_num(data, "prompt_tok_s"),
        prompt_exact=_bool(data, "prompt_exact"),
        ttft_s=_num(data, "ttft_s"),
        ttft_exact=_bool(data, "ttft_exact"),
        draft_acceptance=_num(data, "draft_acceptance"),
        draft_acceptance_by_position=_shares(data.get("draft_acceptance_by_position")),
        spec_speedup=_num(data, "spec_speedup"),
        calibrated_efficiency=_num(data, "calibrated_efficiency"),
        bench_decode_tok_s=_num(data, "bench_decode_tok_s"),
        peer_band=_peer_band(data.get("peer_band")),
        spec_type=_str(data, "spec_type"),
        prefill=prefill,
        session_id=_str(data, "session_id"),
        live_rate_reason=_str(data, "live_rate_reason"),
        unseen_cuts_reason=_str(data, "unseen_cuts_reason"),
    )


def server_from_json(data: Mapping[str, Any]) -> ServerStatus:
    kind, url = _str(data, "kind"), _str(data, "url")
    if not kind or not url:
        raise RemoteDocError("server without kind or url")
    return ServerStatus(
        kind=kind,
        url=url,
        status=cast(ServerState, _choice(data, "status", SERVER_STATES)),
        reason=_str(data, "reason"),
        version=_str(data, "version"),
        models=tuple(model_from_json(_table(m, "model")) for m in _list(data, "models")),
        age_s=_num(data, "age_s"),
        machine=_str(data, "machine"),
    )


def _source(data: Mapping[str, Any], key: str) -> ValueSource:
    value = data.get(key) or "unknown"
    return cast(ValueSource, value if value in VALUE_SOURCES else "unknown")


def hardware_from_json(data: Mapping[str, Any]) -> HardwareSnapshot:
    gpus = []
    for index, item in enumerate(_list(data, "gpus")):
        gpu = _table(item, "gpu")
        throttle = _list(gpu, "throttle_reasons")
        gpus.append(
            GpuReading(
                index=index,
                name=_str(gpu, "name") or "GPU",
                vendor=_str(gpu, "vendor") or "other",
                vram_total_bytes=_int(gpu, "vram_total_bytes"),
                vram_used_bytes=_int(gpu, "vram_used_bytes"),
                bandwidth_gbps=_num(gpu, "bandwidth_gbps"),
                bandwidth_source=_source(gpu, "bandwidth_source"),
                unified_memory=bool(_bool(gpu, "unified_memory")),
                util_gpu_pct=_num(gpu, "util_gpu_pct"),
                temperature_c=_num(gpu, "temperature_c"),
                power_w=_num(gpu, "power_w"),
                throttle_reasons=tuple(str(r) for r in throttle),
                power_limit_w=_num(gpu, "power_limit_w"),
                sm_clock_mhz=_num(gpu, "sm_clock_mhz"),
                sm_clock_max_mhz=_num(gpu, "sm_clock_max_mhz"),
                processes=_gpu_processes(gpu),
                processes_rss=bool(_bool(gpu, "processes_rss")),
                memory_pressure=_str(gpu, "memory_pressure"),
            )
        )
    measured_at = _str(data, "ram_bandwidth_measured_at")
    change = data.get("ram_bandwidth_change")
    host = HostReading(
        ram_total_bytes=_int(data, "ram_total_bytes"),
        ram_available_bytes=_int(data, "ram_available_bytes"),
        ram_bandwidth_gbps=_num(data, "ram_bandwidth_gbps"),
        ram_bandwidth_source=_source(data, "ram_bandwidth_source"),
        cpu_percent=_num(data, "cpu_percent"),
        cpu_freq_mhz=_num(data, "cpu_freq_mhz"),
        cpu_freq_max_mhz=_num(data, "cpu_freq_max_mhz"),
        thermal_max_c=_num(data, "thermal_max_c"),
        ram_bandwidth_measured_wall_s=parse_iso_s(measured_at) if measured_at else None,
        ram_bandwidth_confidence=_str(data, "ram_bandwidth_confidence"),
        ram_bandwidth_change=_ram_bandwidth_change(change) if isinstance(change, Mapping) else None,
    )
    return HardwareSnapshot(gpus=tuple(gpus), host=host, gpu_reason=_str(data, "gpu_reason"))


def _gpu_processes(gpu: Mapping[str, Any]) -> tuple[GpuProcess, ...]:
    """A GPU's memory holders (an agent before #21 sends none); one without a pid is skipped."""
    out = []
    for item in _list(gpu, "processes"):
        entry = _table(item, "process")
        pid = _int(entry, "pid")
        if pid is not None:
            used = _int(entry, "used_bytes")
            out.append(GpuProcess(pid, _str(entry, "name"), used if used is None or used >= 0 else None))
    return tuple(out)


def _ram_bandwidth_change(data: Mapping[str, Any]) -> RamBandwidthChange | None:
    """The agent's `ram_bandwidth_change` (docs/json.md); None when a field is missing or malformed."""
    previous, now, at = _num(data, "previous_gbps"), _num(data, "gbps"), _str(data, "at")
    if previous is None or now is None or not at:
        return None
    try:
        changed_at_wall_s = parse_iso_s(at)
    except ValueError:
        return None
    return RamBandwidthChange(previous, now, changed_at_wall_s, _str(data, "reason") or "")


def fix_from_json(value: Any) -> tuple[str, tuple[str, ...]]:
    """An alert's `fix`: `{"text": ..., "commands": [...]}`, or the plain text an agent before #20
    sends (no commands)."""
    if value is None or isinstance(value, str):
        return value or "", ()
    fix = _table(value, "fix")
    commands = _list(fix, "commands")
    if not all(isinstance(command, str) for command in commands):
        raise RemoteDocError("fix.commands: expected a list of strings")
    return _str(fix, "text") or "", tuple(commands)


def alert_from_json(data: Mapping[str, Any]) -> Alert | None:
    """The alert; None for a kind this version does not know (a newer agent's): it has no label,
    headline or rules here."""
    alert_id, kind_text, since = _str(data, "id"), _str(data, "kind"), _str(data, "since")
    if not alert_id or not kind_text or not since:
        raise RemoteDocError("alert without id, kind or since")
    kind = alert_kind_name(kind_text)
    if kind is None:
        return None
    ended = _str(data, "ended")
    fix_text, fix_commands = fix_from_json(data.get("fix"))
    return Alert(
        id=alert_id,
        kind=kind,
        severity=cast(Severity, _choice(data, "severity", SEVERITIES)),
        server=_str(data, "server") or "",
        model=_str(data, "model"),
        message=_str(data, "message") or "",
        fix=fix_text,
        fix_commands=fix_commands,
        since_wall_s=parse_iso_s(since),
        evidence=dict(_table(data.get("evidence") or {}, "evidence")),
        cause=_str(data, "cause"),
        ended_wall_s=parse_iso_s(ended) if ended else None,
        machine=_str(data, "machine"),
    )


def snapshot_from_json(doc: Any) -> RemoteDoc:
    """The document's servers, hardware and alerts; raises RemoteDocError when it is not one."""
    data = _table(doc, "snapshot")
    if data.get("schema") != 1:
        raise RemoteDocError(f"schema {data.get('schema')!r}: this version reads schema 1")
    t_wall_s = _num(data, "t")
    if t_wall_s is None:
        raise RemoteDocError("t: missing")
    try:
        return RemoteDoc(
            t_wall_s=t_wall_s,
            servers=tuple(server_from_json(_table(s, "server")) for s in _list(data, "servers")),
            hardware=hardware_from_json(_table(data.get("hardware"), "hardware")),
            alerts=tuple(
                alert
                for alert in (alert_from_json(_table(a, "alert")) for a in _list(data, "alerts"))
                if alert is not None
            ),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RemoteDocError):
            raise
        raise RemoteDocError(str(exc)) from exc


def remote_url(url: str, machine: str) -> str:
    """A server URL as the agent on `machine` reports it, as seen from here: its loopback host becomes the
    machine's name ('http://127.0.0.1:8080' → 'http://gpu-box:8080'); any other host is kept."""
    parts = urlsplit(url)
    host = parts.hostname
    if host is None or not is_this_machine(host):
        return url
    try:
        port = parts.port
    except ValueError:
        return url
    netloc = f"{machine}:{port}" if port else machine
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def tag_remote(doc: RemoteDoc, machine: str) -> tuple[tuple[ServerStatus, ...], tuple[Alert, ...]]:
    """The document's servers and alerts marked as `machine`'s (see the module docstring)."""
    servers = tuple(replace(s, url=remote_url(s.url, machine), machine=machine) for s in doc.servers)
    alerts = tuple(
        replace(
            a,
            id=f"{machine}/{a.id}",
            server=remote_url(a.server, machine) if a.server else a.server,
            machine=machine,
        )
        for a in doc.alerts
    )
    return servers, alerts
