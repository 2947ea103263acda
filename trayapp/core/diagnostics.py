"""A redacted plain-text summary of what llm-tray sees, for bug reports ("Copy diagnostics").

Pure: the caller passes the snapshot, a settings summary and the versions it
collected. Redaction: no API keys or bearer tokens, no prompt or completion
text (snapshots never carry any), URLs kept but without user:password@ and
without query strings or fragments (where tokens hide).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from trayapp import __version__
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot
from trayapp.core.machine import ram_bandwidth_change_line
from trayapp.core.model import Alert, ModelStatus, ServerStatus, Snapshot
from trayapp.core.redact import redact
from trayapp.core.server_kinds import server_label
from trayapp.core.units import estimate_mark, format_gb, format_pct, format_tokens, format_ttft


def _add(parts: list[str], value: float | None, template: str) -> None:
    """Append `template.format(value)`, unless the value is missing."""
    if value is not None:
        parts.append(template.format(value))


def _when(t_wall_s: float) -> str:
    return datetime.fromtimestamp(t_wall_s, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gpu_line(gpu: GpuReading) -> str:
    parts = [f"GPU {gpu.index}: {gpu.name} ({gpu.vendor})"]
    parts.append(f"VRAM {format_gb(gpu.vram_used_bytes)} used of {format_gb(gpu.vram_total_bytes)}")
    if gpu.unified_memory:
        parts.append("unified memory")
    if gpu.bandwidth_gbps is not None:
        parts.append(f"{gpu.bandwidth_gbps:.0f} GB/s ({gpu.bandwidth_source})")
    if gpu.pcie_max_gen is not None:
        parts.append(f"PCIe {gpu.pcie_max_gen}.0 x{gpu.pcie_max_width or '?'}")
    _add(parts, gpu.util_gpu_pct, "busy {:.0f} %")
    _add(parts, gpu.temperature_c, "{:.0f} °C")
    _add(parts, gpu.power_w, "{:.0f} W")
    if gpu.throttle_reasons:
        parts.append("throttle: " + ", ".join(gpu.throttle_reasons))
    return " · ".join(parts)


def _hardware_lines(hardware: HardwareSnapshot, now_wall_s: float) -> list[str]:
    lines = [f"  {_gpu_line(gpu)}" for gpu in hardware.gpus]
    if not hardware.gpus:
        lines.append(f"  GPU: none ({hardware.gpu_reason or 'no reason given'})")
    host = hardware.host
    ram = f"  RAM: {format_gb(host.ram_total_bytes)} total, {format_gb(host.ram_available_bytes)} available"
    if host.ram_bandwidth_gbps is not None:
        ram += f" · {host.ram_bandwidth_gbps:.0f} GB/s ({host.ram_bandwidth_source})"
    if host.cpu_percent is not None:
        ram += f" · CPU {host.cpu_percent:.0f} %"
    if host.cpu_count is not None:
        ram += f" of {host.cpu_count} cores"
    lines.append(ram)
    changed = ram_bandwidth_change_line(host.ram_bandwidth_change, now_wall_s)
    if changed:
        lines.append(f"  {changed}")  # the ceiling moved with the RAM bandwidth: a bug report needs it
    return lines


def _model_line(model: ModelStatus) -> str:
    parts = [model.name]
    if model.quantization:
        parts.append(model.quantization)
    parts.append(model.phase)
    if model.decode_tok_s is not None:
        exact = "exact" if model.decode_exact else "estimated"
        parts.append(f"decode {model.decode_tok_s:.1f} tok/s ({exact})")
        if model.active_streams > 1 and model.decode_total_tok_s is not None:
            parts.append(f"{model.active_streams} streams, {model.decode_total_tok_s:.1f} tok/s total")
    if model.last_decode_tok_s is not None:
        how = " (estimated)" if model.decode_tok_s is None and model.decode_exact is False else ""
        parts.append(f"last {model.last_decode_tok_s:.1f} tok/s{how}")
    if model.ceiling_tok_s is not None:
        ceiling = f"ceiling {model.ceiling_tok_s:.1f} tok/s"
        if model.efficiency is not None:
            ceiling += f" ({format_pct(model.efficiency)})"
        parts.append(ceiling)
    _add(parts, model.full_gpu_ceiling_tok_s, "full-GPU ceiling {:.1f} tok/s")
    if model.context_tokens is not None or model.context_length is not None:
        depth = format_tokens(model.context_tokens) if model.context_tokens is not None else "—"
        size = format_tokens(model.context_length) if model.context_length else "—"
        parts.append(f"context {depth}/{size}")
    if model.gpu_fraction is not None:
        parts.append(f"GPU {format_pct(model.gpu_fraction)}")
    if model.size_bytes is not None:
        parts.append(f"size {format_gb(model.size_bytes)}")
    if model.bytes_per_token is not None:
        exact = "exact" if model.bytes_per_token_exact else "estimated"
        parts.append(f"bytes/token {format_gb(model.bytes_per_token)} ({exact})")
    if model.ttft_s is not None:
        parts.append(format_ttft(model.ttft_s, model.ttft_exact))  # '~' marks an estimate
    if model.prompt_tok_s is not None:
        parts.append(f"prompt {estimate_mark(model.prompt_exact)}{model.prompt_tok_s:.0f} tok/s")
    if model.draft_acceptance is not None:
        parts.append(f"draft acceptance {format_pct(model.draft_acceptance)}")
    if model.live_rate_reason:
        parts.append(f"no live rate: {model.live_rate_reason}")
    return " · ".join(parts)


def _server_lines(server: ServerStatus) -> list[str]:
    head = f"  {server_label(server.kind)} {server.url} — {server.status}"
    if server.version:
        head += f" · version {server.version}"
    if server.reason:
        head += f" · {server.reason}"
    lines = [head]
    lines += [f"    {_model_line(model)}" for model in server.models]
    if not server.models and server.status == "ok":
        lines.append("    (no model loaded)")
    return lines


def _alert_lines(alert: Alert) -> list[str]:
    where = f"{alert.model} @ {alert.server}" if alert.model else alert.server
    state = "ended" if alert.ended_wall_s is not None else "active"
    lines = [f"  [{alert.severity}] {alert.kind} ({state}) {where} since {_when(alert.since_wall_s)}"]
    lines.append(f"    {alert.message}")
    if alert.cause:
        lines.append(f"    cause: {alert.cause}")
    lines.append(f"    fix: {alert.fix}")
    lines += [f"      {command}" for command in alert.fix_commands]
    if alert.evidence:
        evidence = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in alert.evidence.items()
        )
        lines.append(f"    evidence: {evidence}")
    return lines


def diagnostics_text(
    snapshot: Snapshot | None,
    settings_summary: str,
    versions: Mapping[str, str] | None = None,
) -> str:
    """Versions, hardware, servers, models, rates and alerts as redacted plain text."""
    found = {"llm-tray": __version__}
    found.update(versions or {})
    lines = ["llm-tray diagnostics (redacted: no API keys, no prompt text, URLs without credentials)"]
    lines.append("versions: " + " · ".join(f"{name} {version}" for name, version in found.items()))
    if snapshot is None:
        lines.append("no snapshot yet (monitoring has not produced a reading)")
    else:
        lines.append(f"snapshot: {_when(snapshot.t_wall_s)} (schema {snapshot.schema})")
        lines.append("hardware:")
        lines += _hardware_lines(snapshot.hardware, snapshot.t_wall_s)
        lines.append("servers:")
        for server in snapshot.servers:
            lines += _server_lines(server)
        if not snapshot.servers:
            lines.append("  none probed")
        alerts = snapshot.alerts + snapshot.ended_alerts
        lines.append("alerts:" if alerts else "alerts: none")
        for alert in alerts:
            lines += _alert_lines(alert)
    lines.append("settings:")
    lines += [f"  {line}" for line in settings_summary.strip().splitlines()]
    return redact("\n".join(lines)) + "\n"
