"""The documented JSON shape of a snapshot (`status --json`, `watch --json`, schema 1).

See docs/json.md. Unknown values are null; numbers keep their units in the key.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trayapp.core.energy_summary import energy_json
from trayapp.core.hardware_readings import GpuProcess, HardwareSnapshot, RamBandwidthChange
from trayapp.core.model import Alert, ModelStatus, RemoteMachine, ServerStatus, Snapshot
from trayapp.core.peers import peer_band_json
from trayapp.core.text import unseen_cuts_note


def iso_utc(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _iso_or_none(wall_s: float | None) -> str | None:
    return None if wall_s is None else iso_utc(wall_s)


def _num(value: float | None, digits: int = 2) -> float | None:
    return round(value, digits) if value is not None else None


def model_json(model: ModelStatus, server: ServerStatus | None = None) -> dict[str, Any]:
    """One model's object; `server`, the one that runs it, for what depends on it (the note on cuts)."""
    return {
        "name": model.name,
        "size_bytes": model.size_bytes,
        "weights_bytes": model.weights_bytes,
        "vram_bytes": model.vram_bytes,
        "gpu_fraction": _num(model.gpu_fraction, 4),
        "gpu_fraction_source": model.gpu_fraction_source,
        "context_length": model.context_length,
        "context_tokens": model.context_tokens,
        "quantization": model.quantization,
        "parameter_count": model.parameter_count,
        "bytes_per_token": model.bytes_per_token,
        "bytes_per_token_exact": model.bytes_per_token_exact,
        "ceiling_tok_s": _num(model.ceiling_tok_s),
        "full_gpu_ceiling_tok_s": _num(model.full_gpu_ceiling_tok_s),
        "decode_tok_s": _num(model.decode_tok_s),
        "decode_total_tok_s": _num(model.decode_total_tok_s),
        "active_streams": model.active_streams,
        "queued_requests": model.queued_requests,
        "decode_exact": model.decode_exact,
        "last_decode_tok_s": _num(model.last_decode_tok_s),
        "prompt_tok_s": _num(model.prompt_tok_s),
        "prompt_exact": model.prompt_exact,
        "ttft_s": _num(model.ttft_s, 3),
        "ttft_exact": model.ttft_exact,
        "draft_acceptance": _num(model.draft_acceptance, 4),
        "draft_acceptance_by_position": [_num(share, 4) for share in model.draft_acceptance_by_position],
        "spec_type": model.spec_type,
        "spec_speedup": _num(model.spec_speedup, 3),
        "calibrated_efficiency": _num(model.calibrated_efficiency, 4),
        "bench_decode_tok_s": _num(model.bench_decode_tok_s),
        "peer_band": None if model.peer_band is None else peer_band_json(model.peer_band),
        "prefill_tokens_total": model.prefill.tokens_total if model.prefill else None,
        "prefill_tokens_done": model.prefill.tokens_done if model.prefill else None,
        "prefill_cached_tokens": model.prefill.cached_tokens if model.prefill else None,
        "prefill_tok_s": _num(model.prefill.tok_s) if model.prefill else None,
        "prefill_eta_s": _num(model.prefill.eta_s, 1) if model.prefill else None,
        "phase": model.phase,
        "session_id": model.session_id,
        "live_rate_reason": model.live_rate_reason,
        "unseen_cuts_reason": model.unseen_cuts_reason,
        "unseen_cuts_note": unseen_cuts_note(server, model) if server is not None else None,
    }


def server_json(server: ServerStatus) -> dict[str, Any]:
    return {
        "kind": server.kind,
        "url": server.url,
        "status": server.status,
        "reason": server.reason,
        "version": server.version,
        "age_s": _num(server.age_s, 1),
        "machine": server.machine,
        "models": [model_json(m, server) for m in server.models],
    }


def ram_bandwidth_change_json(change: RamBandwidthChange | None) -> dict[str, Any] | None:
    """The RAM bandwidth's last change (the ceiling moved with it); null when it never changed."""
    if change is None:
        return None
    return {
        "previous_gbps": _num(change.previous_gbps, 1),
        "gbps": _num(change.gbps, 1),
        "at": iso_utc(change.changed_at_wall_s),
        "reason": change.reason,
    }


def gpu_process_json(process: GpuProcess) -> dict[str, Any]:
    """One GPU memory holder: `used_bytes` null where the driver does not say (never 0)."""
    return {"pid": process.pid, "name": process.name, "used_bytes": process.used_bytes}


def hardware_json(hardware: HardwareSnapshot) -> dict[str, Any]:
    host = hardware.host
    return {
        "gpus": [
            {
                "name": g.name,
                "vendor": g.vendor,
                "vram_total_bytes": g.vram_total_bytes,
                "vram_used_bytes": g.vram_used_bytes,
                "bandwidth_gbps": _num(g.bandwidth_gbps, 1),
                "bandwidth_source": g.bandwidth_source,
                "unified_memory": g.unified_memory,
                "util_gpu_pct": g.util_gpu_pct,
                "temperature_c": g.temperature_c,
                "power_w": g.power_w,
                "throttle_reasons": list(g.throttle_reasons),
                "power_limit_w": g.power_limit_w,
                "sm_clock_mhz": g.sm_clock_mhz,
                "sm_clock_max_mhz": g.sm_clock_max_mhz,
                "energy_j": _num(g.energy_j, 3),
                "processes": [gpu_process_json(p) for p in g.processes],
                "processes_rss": g.processes_rss,
                "memory_pressure": g.memory_pressure,
            }
            for g in hardware.gpus
        ],
        "gpu_reason": hardware.gpu_reason,
        "ram_total_bytes": host.ram_total_bytes,
        "ram_available_bytes": host.ram_available_bytes,
        "ram_bandwidth_gbps": _num(host.ram_bandwidth_gbps, 1),
        "ram_bandwidth_source": host.ram_bandwidth_source,
        "ram_bandwidth_measured_at": _iso_or_none(host.ram_bandwidth_measured_wall_s),
        "ram_bandwidth_confidence": host.ram_bandwidth_confidence,
        "ram_bandwidth_change": ram_bandwidth_change_json(host.ram_bandwidth_change),
        "cpu_percent": host.cpu_percent,
        "cpu_freq_mhz": host.cpu_freq_mhz,
        "cpu_freq_max_mhz": host.cpu_freq_max_mhz,
        "thermal_max_c": host.thermal_max_c,
    }


def fix_json(alert: Alert) -> dict[str, Any]:
    """The fix: `text` in words, `commands` the exact lines to copy for the server that runs the model
    (flags, a variable, a command; empty when the fix has none). llm-tray never runs them."""
    return {"text": alert.fix, "commands": list(alert.fix_commands)}


def alert_json(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.id,
        "kind": alert.kind,
        "severity": alert.severity,
        "server": alert.server,
        "model": alert.model,
        "message": alert.message,
        "fix": fix_json(alert),
        "cause": alert.cause,
        "since": iso_utc(alert.since_wall_s),
        "ended": iso_utc(alert.ended_wall_s) if alert.ended_wall_s is not None else None,
        "evidence": dict(alert.evidence),
        "machine": alert.machine,
    }


def machine_json(machine: RemoteMachine) -> dict[str, Any]:
    return {
        "name": machine.name,
        "url": machine.url,
        "status": machine.status,
        "reason": machine.reason,
        "t": round(machine.t_wall_s, 3) if machine.t_wall_s is not None else None,
        "hardware": hardware_json(machine.hardware) if machine.hardware is not None else None,
    }


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    """The document; `machines` (remote agents) only where some are watched."""
    doc = {
        "schema": snapshot.schema,
        "t": round(snapshot.t_wall_s, 3),
        "servers": [server_json(s) for s in snapshot.servers],
        "hardware": hardware_json(snapshot.hardware),
        "alerts": [alert_json(a) for a in snapshot.alerts],
        "energy": energy_json(snapshot.energy),
    }
    if snapshot.machines:
        doc["machines"] = [machine_json(m) for m in snapshot.machines]
    return doc
