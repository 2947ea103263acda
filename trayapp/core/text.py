"""Human-readable text for the CLI (`status`, `watch`): units and sensible precision."""

from __future__ import annotations

from trayapp.core.bandwidth import ram_bandwidth_note
from trayapp.core.glance import DECODING_NO_RATE_YET, queued_note
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.machine import ram_bandwidth_change_line
from trayapp.core.model import ModelStatus, RemoteMachine, ServerStatus, Snapshot
from trayapp.core.overflow import ollama_whole_prompt_tokens
from trayapp.core.phases import is_active
from trayapp.core.units import (
    estimate_mark,
    format_gb,
    format_rate,
    format_rate_marked,
    format_tokens,
    format_ttft,
)
from trayapp.core.vram_holders import gpu_holders_lines


def model_line(model: ModelStatus) -> str:
    parts = [model.name]
    if model.quantization:
        parts.append(model.quantization)
    head = " ".join(parts)
    last = f"last {format_rate_marked(model.last_decode_tok_s, model.decode_exact)}"
    if model.decode_tok_s is not None:
        speed = format_rate_marked(model.decode_tok_s, model.decode_exact)
        if model.active_streams > 1 and model.decode_total_tok_s is not None:
            total = f"{estimate_mark(model.decode_exact)}{format_rate(model.decode_total_tok_s)}"
            speed += f" ×{model.active_streams} streams = {total} total"
        speed += queued_note(model)
    elif model.phase == "decoding":  # no rate (yet): two polls must both see it decoding
        speed = "no live rate" if model.live_rate_reason else DECODING_NO_RATE_YET
        if model.last_decode_tok_s is not None:
            speed += f" · {last}"
    elif model.last_decode_tok_s is not None:
        speed = last
    elif is_active(model.phase):  # reading a prompt, loading, or stalled before its first rate
        speed = "no decode rate yet"
    elif model.phase == "sleeping":
        speed = "asleep: the next request loads it again"
    elif model.phase == "unloaded":
        speed = "not loaded"
    else:
        speed = "no request seen yet"
    ceiling = ""
    if model.ceiling_tok_s:
        share = f"{model.efficiency * 100:.0f} % of " if model.efficiency is not None else ""
        ceiling = f" · {share}{format_rate(model.ceiling_tok_s)} tok/s ceiling"
    context = ""
    if model.context_length:
        context = f" · ctx {format_tokens(model.context_tokens or 0)}/{format_tokens(model.context_length)}"
    gpu = f" · {model.gpu_fraction * 100:.0f} % GPU" if model.gpu_fraction is not None else ""
    ttft = f" · {format_ttft(model.ttft_s, model.ttft_exact)}" if model.ttft_s is not None else ""
    line = f"{head} [{model.phase}] {speed}{ceiling}{context}{gpu}{ttft}"
    if model.live_rate_reason and model.decode_tok_s is None:
        line += f"\n      ({model.live_rate_reason})"
    return line


def unseen_cuts_note(server: ServerStatus, model: ModelStatus) -> str | None:
    """What can be said of silent prompt truncation where llm-tray cannot see it (#20): an Ollama with
    no recording proxy in front and no readable log cuts a prompt longer than it keeps whole and
    answers HTTP 200, and nothing here can tell. Information, not an alert: no cut was seen.
    'prompts over 2,050 tokens are cut silently (num_ctx 4096); llm-tray sees cuts through its proxy
    or Ollama's log (reading Ollama's log is off)'. None when cuts are seen (or not silent)."""
    reason = model.unseen_cuts_reason
    if reason is None or server.kind != "ollama":
        return None
    if model.context_length:
        whole = ollama_whole_prompt_tokens(model.context_length, server.version)
        cut = f"prompts over {whole:,} tokens are cut silently (num_ctx {model.context_length})"
    else:
        cut = "prompts longer than the context are cut silently"
    return f"{cut}; llm-tray sees cuts through its proxy or Ollama's log ({reason})"


def server_line(server: ServerStatus) -> str:
    status: str = server.status
    if server.reason and server.status != "ok":
        status += f": {server.reason}"
    version = f" {server.version}" if server.version else ""
    age = f" (numbers {server.age_s:.0f} s old)" if server.age_s else ""
    where = f"[{server.machine}] " if server.machine else ""
    return f"{where}{server.kind}{version} {server.url} — {status}{age}"


def _hardware_lines(hw: HardwareSnapshot, now_wall_s: float, where: str = "") -> list[str]:
    lines = []
    if hw.gpus:
        for gpu in hw.gpus:
            used = f"{format_gb(gpu.vram_used_bytes)}/{format_gb(gpu.vram_total_bytes)}"
            bw = f" · {gpu.bandwidth_gbps:.0f} GB/s" if gpu.bandwidth_gbps else ""
            lines.append(f"{where}GPU {gpu.index}: {gpu.name} · {used}{bw}")
            single = HardwareSnapshot((gpu,), hw.host)
            lines.extend(f"{where}  {line}" for line in gpu_holders_lines(single))  # who holds its memory
    else:
        lines.append(f"{where}GPU: none ({hw.gpu_reason or 'not found'})")
    host = hw.host
    ram_bw = ""
    if host.ram_bandwidth_gbps:
        ram_bw = f" · {host.ram_bandwidth_gbps:.0f} GB/s ({ram_bandwidth_note(host)})"
    avail = format_gb(host.ram_available_bytes)
    lines.append(f"{where}RAM: {avail} free of {format_gb(host.ram_total_bytes)}{ram_bw}")
    changed = ram_bandwidth_change_line(host.ram_bandwidth_change, now_wall_s)
    if changed:
        lines.append(f"{where}{changed}")  # the ceiling moved with the RAM bandwidth: say so
    return lines


def machine_lines(machine: RemoteMachine, now_wall_s: float) -> list[str]:
    """A remote machine's hardware ('[gpu-box] GPU 0: …'), or why it cannot be shown."""
    if machine.status != "ok" or machine.hardware is None:
        return [f"[{machine.name}] {machine.status} — {machine.reason or 'no snapshot'} ({machine.url})"]
    return _hardware_lines(machine.hardware, now_wall_s, f"[{machine.name}] ")


def format_snapshot(snapshot: Snapshot, hardware_note: str | None = None) -> str:
    """The `status` text. `hardware_note` describes hardware given on the command line, if any."""
    lines: list[str] = []
    if not snapshot.servers:
        lines.append("No LLM server found (probed the default ports; add one with --endpoint URL).")
    for server in snapshot.servers:
        lines.append(server_line(server))
        for model in server.models:
            lines.append("  " + model_line(model))
            note = unseen_cuts_note(server, model)
            if note:
                lines.append(f"      note: {note}")
    if hardware_note:
        lines.append(f"Hardware (given): {hardware_note}")
    lines += _hardware_lines(snapshot.hardware, snapshot.t_wall_s)
    for machine in snapshot.machines:
        lines += machine_lines(machine, snapshot.t_wall_s)
    for alert in snapshot.alerts:
        where = f"[{alert.machine}] " if alert.machine else ""
        lines.append(f"⚠ {where}[{alert.severity}] {alert.message}")
        lines.append(f"    {alert.fix}")
        lines += [f"      {command}" for command in alert.fix_commands]  # to copy, one per line
    return "\n".join(lines)


def format_watch_line(snapshot: Snapshot) -> str:
    from datetime import datetime, timezone

    stamp = datetime.fromtimestamp(snapshot.t_wall_s, tz=timezone.utc).strftime("%H:%M:%S")
    parts: list[str] = []
    for server in snapshot.servers:
        where = f"{server.machine}: " if server.machine else ""
        if server.status != "ok":
            parts.append(f"{where}{server.kind} {server.status}")
            continue
        for model in server.models:
            rate = format_rate_marked(model.decode_tok_s, model.decode_exact)
            parts.append(
                f"{where}{model.name} {model.phase} {rate}"
                f" ctx {format_tokens(model.context_tokens)}"
                + (f" / {format_rate(model.ceiling_tok_s)} ceiling" if model.ceiling_tok_s else "")
                + (f" ({server.age_s:.0f}s old)" if server.age_s else "")
            )
    parts += [f"{m.name} {m.status}" for m in snapshot.machines if m.status != "ok"]
    if not parts:
        parts.append("no server")
    alerts = f"  ⚠ {', '.join(a.kind for a in snapshot.alerts)}" if snapshot.alerts else ""
    return f"{stamp}  " + " | ".join(parts) + alerts
