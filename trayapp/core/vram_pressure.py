"""The vram_pressure detector: a GPU with little memory left, its largest holders, and the idle
models its fix names (and unloads, where their server has a command for it)."""

from __future__ import annotations

from collections.abc import Sequence

from trayapp.core.fixes import unload_commands
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import Finding, ServerStatus
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_gb
from trayapp.core.vram_holders import holders_besides, holders_evidence, holders_text

IDLE_MODELS_NAMED = 3  # a vram_pressure fix names at most this many idle models, the largest first


def diagnose_hardware(
    hardware: HardwareSnapshot, t: Thresholds, servers: Sequence[ServerStatus] = ()
) -> list[Finding]:
    """GPU-wide findings. `servers`: this machine's servers, whose idle models a `vram_pressure` fix
    names (and unloads, where the server has a command for it)."""
    findings: list[Finding] = []
    idle = _idle_models(servers)
    for gpu in hardware.gpus:
        if not gpu.vram_total_bytes or gpu.vram_used_bytes is None or gpu.unified_memory:
            continue
        free = gpu.vram_total_bytes - gpu.vram_used_bytes
        free_pct = free / gpu.vram_total_bytes * 100
        if free_pct >= t.vram_free_min_pct:
            continue
        holders = holders_besides(HardwareSnapshot((gpu,), hardware.host), ())
        who = holders_text(holders)
        message = (
            f"{gpu.name} has only {format_gb(free)} free ({free_pct:.1f} %): the next context growth or "
            "model load will spill to the CPU."
        )
        if who:
            message += f" Largest users: {who}."
        fix = "Unload idle models (ollama stop, LM Studio eject) or close other GPU programs."
        commands: tuple[str, ...] = ()
        if idle:
            names = ", ".join(name for _, name in idle)
            fix = f"Unload idle models ({names}) or close other GPU programs."
            commands = tuple(c for kind, name in idle for c in unload_commands(kind, name))
        evidence = {
            "vram_free_bytes": free,
            "vram_total_bytes": gpu.vram_total_bytes,
            "free_pct": round(free_pct, 2),
            "vram_holders": holders_evidence(holders),
        }
        findings.append(
            Finding(
                "vram_pressure",
                "warning",
                f"gpu:{gpu.index}",
                None,
                message,
                fix,
                evidence,
                score=-free_pct,
                fix_commands=commands,
            )
        )
    return findings


def _idle_models(servers: Sequence[ServerStatus]) -> list[tuple[str, str]]:
    """(server kind, model name) of the idle models in GPU memory that their server can unload
    (Ollama, LM Studio: a llama-server's one model goes only with the server), largest first."""
    idle = [
        (model.vram_bytes or 0, server.kind, model.name)
        for server in servers
        if server.status == "ok"
        for model in server.models
        if model.phase == "idle"
        and (model.vram_bytes is None or model.vram_bytes > 0)
        and unload_commands(server.kind, model.name)  # a server that can unload one and keep running
    ]
    idle.sort(key=lambda entry: -entry[0])
    return [(kind, name) for _, kind, name in idle[:IDLE_MODELS_NAMED]]
