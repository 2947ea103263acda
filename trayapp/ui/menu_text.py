"""The tray menu's and the diagnostics' lines of text: a server, a model, a remote machine, a proxy, the
settings (never a secret)."""

from __future__ import annotations

from trayapp.config.settings import ProxyConfig, Settings
from trayapp.core.glance import host_port, server_phase
from trayapp.core.model import ModelStatus, RemoteMachine, ServerStatus
from trayapp.core.phases import is_active, is_ready
from trayapp.core.redact import redact_url
from trayapp.core.server_kinds import server_label
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_gb_of, format_pct, format_rate_marked, format_tokens


def server_line(server: ServerStatus) -> str:
    """'● llama-server 127.0.0.1:8080 — decoding ~42 tok/s' ('~': estimated from polling)."""
    name = f"{server_label(server.kind)} {host_port(server.url)}"
    if server.status == "unauthorized":
        return f"⚠ {name} — needs an API key (Settings…)"
    if server.status == "error":
        return f"⚠ {name} — error: {server.reason or 'unknown'}"
    if server.status == "unreachable":
        return f"○ {name} — not answering"
    phase = server_phase(server)  # the icon's order of phases
    if phase == "decoding":
        rated = [m for m in server.models if m.phase == "decoding" and m.decode_tok_s is not None]
        fastest = max(rated, key=lambda m: m.decode_tok_s or 0.0, default=None)
        state = (
            f"decoding {format_rate_marked(fastest.decode_tok_s, fastest.decode_exact)}"
            if fastest is not None
            else "decoding"
        )
    elif phase == "prefill":
        state = "reading a prompt"
    elif phase == "stalled":
        state = "stalled"
    elif phase == "loading":
        state = "loading a model"
    elif server.models and all(m.phase == "sleeping" for m in server.models):
        state = "sleeping"
    elif any(is_ready(m.phase) for m in server.models):
        state = "idle"
    else:
        state = "no model loaded"
    active = any(is_active(m.phase) for m in server.models)
    return f"{'●' if active else '○'} {name} — {state}"


def model_line(model: ModelStatus, offload_gpu_fraction: float = Thresholds.offload_gpu_fraction) -> str:
    """'   llama3.1:8b Q4_K_M  ·  6.1k/8k ctx  ·  52 % CPU ⚠' (the mark below `offload_gpu_fraction`)."""
    name = model.name
    if model.quantization and model.quantization.lower() not in name.lower():
        name = f"{name} {model.quantization}"
    parts = [name]
    if model.context_length:
        parts.append(f"{format_tokens(model.context_tokens)}/{format_tokens(model.context_length)} ctx")
    if model.gpu_fraction is not None and model.gpu_fraction < offload_gpu_fraction:
        parts.append(f"{format_pct(1 - model.gpu_fraction)} CPU ⚠")
    return "   " + "  ·  ".join(parts)


def machine_line(machine: RemoteMachine) -> str:
    """'gpu-box — NVIDIA RTX 4090 · 20.0/24 GB' (the dashboard's GPU line), or
    '⚠ gpu-box: unreachable — connection refused'."""
    if machine.status != "ok" or machine.hardware is None:
        return f"⚠ {machine.name}: {machine.status} — {machine.reason or 'no snapshot'}"
    gpus = machine.hardware.gpus
    if not gpus:
        return f"{machine.name} — no GPU"
    gpu = gpus[0]
    more = f" (+{len(gpus) - 1})" if len(gpus) > 1 else ""
    line = f"{machine.name} — {gpu.name}{more}"
    if gpu.vram_used_bytes is not None and gpu.vram_total_bytes:
        line += f" · {format_gb_of(gpu.vram_used_bytes, gpu.vram_total_bytes)}"
    return line


def proxy_line(proxy: ProxyConfig) -> str:
    """'Proxy 127.0.0.1:11435 → Ollama' (the upstream's address when its kind is not set)."""
    target = server_label(proxy.kind) if proxy.kind else host_port(proxy.upstream)
    return f"Proxy {host_port(proxy.client_url)} → {target}"


def settings_summary(settings: Settings) -> str:
    """Settings for the diagnostics text: no secrets (only whether a key is configured, and how)."""
    lines = []
    for endpoint in settings.endpoints:
        if endpoint.use_keyring:
            key = "api key from the keyring"
        elif endpoint.api_key_env:
            key = f"api key from env {endpoint.api_key_env}"
        else:
            key = "no api key"
        lines.append(f"endpoint {redact_url(endpoint.url)} kind={endpoint.kind or 'auto'}, {key}")
    monitor = settings.monitor
    lines.append(
        f"discover={monitor.discover} poll {monitor.poll_active_s:g}s active / {monitor.poll_idle_s:g}s idle"
    )
    hardware = settings.hardware
    if hardware.gpu or hardware.bandwidth_gbps:
        lines.append(f"hardware gpu={hardware.gpu} bandwidth={hardware.bandwidth_gbps} GB/s")
    lines.append(f"kv_type={hardware.kv_type}")
    notifications = settings.notifications
    lines.append(
        f"notifications enabled={notifications.enabled} dnd={notifications.do_not_disturb} "
        f"muted={','.join(notifications.muted_kinds) or 'none'}"
    )
    for proxy in settings.proxies:
        lines.append(
            f"proxy {proxy.listen} -> {redact_url(proxy.upstream)} kind={proxy.kind or 'openai'} "
            f"{'on' if proxy.enabled else 'off'}{' remote' if proxy.allow_remote else ''}"
        )
    for agent in settings.agents:  # the token never: only where it is read from
        token = f"token from env {agent.token_env}" if agent.token_env else "token from the keyring, if any"
        lines.append(f"agent {agent.name} {redact_url(agent.url)}, {token}")
    exporter = settings.exporter
    lines.append(f"exporter {'on' if exporter.enabled else 'off'} {exporter.address}:{exporter.port}")
    lines.append(f"retention {settings.store.retention_days:g} days")
    return "\n".join(lines)
