"""Live progress of the answers a recording proxy is streaming, for servers that report none.

MLX-LM and a generic OpenAI-compatible server expose no timings, slots or counters while they
generate: the only live sign is the answer itself. The proxy counts the pieces of text it has
forwarded for each streamed answer (one per token where the server streams a chunk per token, as
MLX-LM and llama-server do); here each such answer becomes a `SlotReading` of its model, so the
rates stage measures its decode rate between ticks like any polled slot: *estimated* (the proxy's
clock, to the tick), never exact. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from trayapp.core.model import ServerReading, SlotReading
from trayapp.core.server_kinds import server_kind_row

SLOT_ID_BASE = 1_000_000  # a stream's slot id: this plus its number, clear of any server's own ids


@dataclass(frozen=True)
class ProxiedStream:
    """One answer the proxy is streaming now: the tokens (text pieces) forwarded so far."""

    number: int  # distinct per stream for the proxy's lifetime (a new number: a new task)
    model: str | None  # the model the request named, if any
    tokens_streamed: int  # pieces of generated text forwarded to the client so far


def rate_from_proxy(kind: str) -> bool:
    """Whether a server of this kind has no live numbers of its own while it generates (only then
    are its streams counted: for the others the server's own numbers are better)."""
    row = server_kind_row(kind)
    return row is not None and row.rate_from_proxy


def with_proxied_streams(reading: ServerReading, streams: Sequence[ProxiedStream]) -> ServerReading:
    """`reading` with each stream a processing slot of its model, where the server's kind gives no
    live rate of its own and the reading is fresh. A stream goes to the model it names, or, with one
    loaded model, to that one (MLX-LM answers any name with the model it serves). The models that
    get streams lose their "no live rate" reason: the proxy measures one."""
    if not rate_from_proxy(reading.kind) or reading.age_s is not None or reading.status != "ok":
        return reading
    loaded = [m for m in reading.models if m.loaded]
    by_model: dict[str, list[SlotReading]] = {}
    for stream in streams:
        names = [m.name for m in loaded if m.name == stream.model]
        if not names and len(loaded) == 1:
            names = [loaded[0].name]
        if not names:
            continue
        slot_id = SLOT_ID_BASE + stream.number
        slot = SlotReading(slot_id, True, task_id=slot_id, n_decoded=stream.tokens_streamed)
        by_model.setdefault(names[0], []).append(slot)
    if not by_model:
        return reading
    models = tuple(
        replace(m, slots=(*m.slots, *by_model[m.name]), live_rate_reason=None) if m.name in by_model else m
        for m in reading.models
    )
    return replace(reading, models=models)
