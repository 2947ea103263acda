"""Sessions grouped by the engine build they ran on (`llm-tray sessions --by build`): after an update,
the same model's speed under each build side by side."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trayapp.core.model import SessionRecord
from trayapp.core.server_kinds import engine_label


@dataclass(frozen=True)
class BuildGroup:
    """The sessions of one model on one engine build. `mean_decode_tok_s`: the sessions' mean decode
    rates weighted by their decoded tokens (None when no session measured one)."""

    engine: str  # "llama.cpp", "Ollama", …
    build: str | None  # the server's own version or build ("b11434-3f2a9c1d8"); None: it did not say
    model: str
    hardware: str | None
    sessions: int
    requests: int
    decode_tokens: int
    mean_decode_tok_s: float | None
    first_wall_s: float
    last_wall_s: float


def sessions_by_build(sessions: Iterable[SessionRecord]) -> list[BuildGroup]:
    """One group per (engine, build, model, hardware), ordered by model, hardware, then first seen."""
    grouped: dict[tuple[str, str | None, str, str | None], list[SessionRecord]] = {}
    for s in sessions:
        grouped.setdefault((engine_label(s.server_kind), s.server_version, s.model, s.hardware), []).append(s)
    groups: list[BuildGroup] = []
    for (engine, build, model, hardware), members in grouped.items():
        rated = [(s.mean_decode_tok_s, max(s.decode_tokens, 1)) for s in members if s.mean_decode_tok_s]
        weight = sum(w for _, w in rated)
        groups.append(
            BuildGroup(
                engine=engine,
                build=build,
                model=model,
                hardware=hardware,
                sessions=len(members),
                requests=sum(s.requests for s in members),
                decode_tokens=sum(s.decode_tokens for s in members),
                mean_decode_tok_s=sum(r * w for r, w in rated) / weight if rated else None,
                first_wall_s=min(s.started_wall_s for s in members),
                last_wall_s=max(s.ended_wall_s or s.started_wall_s for s in members),
            )
        )
    return sorted(groups, key=lambda g: (g.model, g.hardware or "", g.first_wall_s))
