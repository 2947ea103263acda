"""Who else holds GPU memory, and what closing them would give a model that spilled.

The GPU probes list per-process GPU memory (`GpuReading.processes`: NVML on NVIDIA, the kernel's
DRM client stats on AMD and Intel). When a model loads or spills, the diagnosis keeps a
`HolderSnapshot` of the holders other than the model's own server at that moment (`take_snapshot`,
`keep_snapshot`); the `offload` alert names them with their sizes (`holders_text`) and its fix says
what closing them gives back (`closing_gain`: the layers and the decode ceiling, from the placement's
own arithmetic: `physics.auto_gpu_fraction` and `placement.ceiling_for`).

A size the driver does not report (NVML under Windows WDDM) is None and shown "unavailable",
never 0. A process whose name cannot be read (another user's) is `OTHER_USER`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trayapp.core import physics
from trayapp.core.hardware_readings import GpuProcess, HardwareSnapshot
from trayapp.core.machine import Machine
from trayapp.core.model import ModelFacts
from trayapp.core.placement import ceiling_for
from trayapp.core.units import format_gb

OTHER_USER = "another user's process"  # the name of a process we may not read (sources set it)
HOLDERS_NAMED = 3  # an alert names at most this many holders, the largest first
SNAPSHOT_FRACTION_STEP = 0.005  # a GPU share that moved more than this is a new placement: a new snapshot
# Names that say little on their own (an interpreter, a runtime): the pid is added to tell them apart.
_GENERIC = re.compile(r"(python[\d.]*|node|java|ruby|perl|wine.*|dotnet|mono|bash|sh|electron)(\.exe)?", re.I)


@dataclass(frozen=True)
class VramHolder:
    """One process holding GPU memory on one GPU."""

    pid: int
    name: str | None  # None: gone, or unnamed; OTHER_USER: not ours to read
    used_bytes: int | None  # None: the driver does not say ("unavailable"), never 0
    gpu_index: int = 0


@dataclass(frozen=True)
class HolderSnapshot:
    """The holders besides a model's server at the moment it loaded or spilled."""

    t_wall_s: float
    holders: tuple[VramHolder, ...]  # largest first; sizes the driver does not report last
    gpu_fraction: float | None = None  # the model's GPU share when it was taken

    @property
    def held_bytes(self) -> int:
        """What the holders hold, of the sizes known."""
        return sum(h.used_bytes or 0 for h in self.holders)


def holders_besides(hardware: HardwareSnapshot, own_pids: Iterable[int | None]) -> tuple[VramHolder, ...]:
    """Every GPU memory holder on this machine except `own_pids` (the model's server processes),
    largest first; on Apple (processes by RSS, not GPU memory) none."""
    own = {pid for pid in own_pids if pid is not None}
    found = [
        VramHolder(p.pid, p.name, p.used_bytes, g.index)
        for g in hardware.gpus
        if not g.processes_rss
        for p in g.processes
        if p.pid not in own
    ]
    return sort_holders(found)


def sort_holders(holders: Iterable[VramHolder]) -> tuple[VramHolder, ...]:
    """Largest first; unknown sizes after every known one; ties by pid."""
    return tuple(sorted(holders, key=lambda h: (h.used_bytes is None, -(h.used_bytes or 0), h.pid)))


def take_snapshot(
    hardware: HardwareSnapshot, own_pids: Iterable[int | None], gpu_fraction: float | None, now_wall_s: float
) -> HolderSnapshot:
    return HolderSnapshot(now_wall_s, holders_besides(hardware, own_pids), gpu_fraction)


def keep_snapshot(
    kept: HolderSnapshot | None,
    loading: bool,
    gpu_fraction: float | None,
    hardware: HardwareSnapshot,
    own_pids: Iterable[int | None],
    now_wall_s: float,
) -> HolderSnapshot:
    """The snapshot to keep for a model at this tick: a new one while it loads, when it is first
    seen, or when its GPU share moved (it was placed again: a reload, a spill); else the kept one,
    so a holder that closed after the spill is still named by the alert it caused."""
    if kept is not None and not loading and not _moved(kept.gpu_fraction, gpu_fraction):
        return kept
    return take_snapshot(hardware, own_pids, gpu_fraction, now_wall_s)


def _moved(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return before is not now
    return abs(before - now) > SNAPSHOT_FRACTION_STEP


def holder_label(holder: VramHolder | GpuProcess, repeated: bool = False) -> str:
    """'firefox', 'python (pid 4121)' (a generic or repeated name), 'another user's process (pid 77)',
    'pid 77' (no name)."""
    name = holder.name
    if not name:
        return f"pid {holder.pid}"
    if name == OTHER_USER or repeated or _GENERIC.fullmatch(name):
        return f"{name} (pid {holder.pid})"
    return name


def holder_size(used_bytes: int | None) -> str:
    """'2.9 GB'; 'unavailable' where the driver does not say (never 0)."""
    return "unavailable" if used_bytes is None else format_gb(used_bytes)


def holders_text(holders: Sequence[VramHolder | GpuProcess], limit: int = HOLDERS_NAMED) -> str:
    """'firefox 2.9 GB, steam 1.6 GB, python (pid 4121) 1.3 GB' (+ 'and N more')."""
    names = [h.name for h in holders]
    shown = [
        f"{holder_label(h, repeated=bool(h.name) and names.count(h.name) > 1)} {holder_size(h.used_bytes)}"
        for h in holders[:limit]
    ]
    more = len(holders) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


# --------------------------------------------------------------------------- what closing them gives


def layers_on_gpu(gpu_fraction: float, n_layers: int) -> int:
    """Whole layers in GPU memory for a share of the model's need: the share × the layer count, to the
    nearest layer (a layer split puts whole layers, weights and their KV, on the GPU)."""
    return min(n_layers, max(0, round(gpu_fraction * n_layers)))


@dataclass(frozen=True)
class ClosingGain:
    """What closing the named holders (and reloading the model) would give it."""

    gpu_fraction: float  # its share in GPU memory then
    ceiling_tok_s: float | None  # its decode ceiling then, at the live context
    n_layers: int | None  # the model's layers, when known
    layers_on_gpu_now: int | None
    layers_on_gpu: int | None  # then


def closing_gain(
    facts: ModelFacts,
    context_length: int | None,
    context_tokens: int | None,
    machine: Machine,
    gpu_fraction_now: float,
    freed_bytes: int,
    held_by_others_bytes: int,
) -> ClosingGain | None:
    """The model's placement with `freed_bytes` of the `held_by_others_bytes` given back: the share of
    weights + KV (at its context size) that fits in the capacity less what others still hold
    (`physics.auto_gpu_fraction`, the placement's rule) and the ceiling at that share (`ceiling_for`).
    None when that is no better than now, or the capacity is unknown."""
    capacity = machine.fast_capacity_bytes
    if capacity is None or freed_bytes <= 0:
        return None
    kv = physics.kv_cache_bytes(facts.kv, context_length or 0, machine.kv_type)
    share = physics.auto_gpu_fraction(
        facts.weights_bytes, kv, capacity - (held_by_others_bytes - freed_bytes)
    )
    if share is None or share <= gpu_fraction_now + SNAPSHOT_FRACTION_STEP:
        return None
    n_layers = facts.kv.n_layers if facts.kv is not None else None
    return ClosingGain(
        gpu_fraction=share,
        ceiling_tok_s=ceiling_for(facts, context_tokens, machine, share),
        n_layers=n_layers,
        layers_on_gpu_now=layers_on_gpu(gpu_fraction_now, n_layers) if n_layers else None,
        layers_on_gpu=layers_on_gpu(share, n_layers) if n_layers else None,
    )


# --------------------------------------------------------------------------- evidence (JSON, store)


def holders_evidence(holders: Sequence[VramHolder]) -> list[dict[str, Any]]:
    """The holders as an alert's evidence (status --json, the store's evidence_json)."""
    return [
        {"pid": h.pid, "name": h.name, "used_bytes": h.used_bytes, "gpu_index": h.gpu_index} for h in holders
    ]


def holders_from_evidence(evidence: Mapping[str, object]) -> tuple[VramHolder, ...]:
    """The holders an alert's evidence names (read back from JSON or the store); malformed ones skipped."""
    items = evidence.get("vram_holders")
    if not isinstance(items, list):
        return ()
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        pid, name, used, gpu = (
            item.get("pid"),
            item.get("name"),
            item.get("used_bytes"),
            item.get("gpu_index", 0),
        )
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue
        out.append(
            VramHolder(
                pid,
                name if isinstance(name, str) else None,
                used if isinstance(used, int) and not isinstance(used, bool) and used >= 0 else None,
                gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else 0,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- the dashboard's GPU card


def gpu_holders_lines(hardware: HardwareSnapshot, limit: int = 5) -> list[str]:
    """One line per GPU that lists its memory holders, largest first: 'GPU memory held by:
    llama-server 6.6 GB, python (pid 4121) 5.8 GB, Xorg 0.2 GB'; on Apple's unified memory, the
    largest RAM users and the memory pressure: 'RAM used by: ollama 21.0 GB, Safari 3.1 GB · memory
    pressure: warning'."""
    lines = []
    several = len(hardware.gpus) > 1
    for gpu in hardware.gpus:
        holders = sort_holders(VramHolder(p.pid, p.name, p.used_bytes, gpu.index) for p in gpu.processes)
        what = "RAM used by" if gpu.processes_rss else "GPU memory held by"
        line = f"{what}: {holders_text(holders, limit)}" if holders else ""
        if gpu.memory_pressure:
            line += (" · " if line else "") + f"memory pressure: {gpu.memory_pressure}"
        if line:
            lines.append(f"GPU {gpu.index} {line}" if several else line)
    return lines
