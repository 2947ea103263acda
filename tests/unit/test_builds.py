"""`sessions --by build`: sessions grouped by engine build, rates weighted by decoded tokens."""

from __future__ import annotations

from trayapp.core.builds import sessions_by_build
from trayapp.core.model import SessionRecord


def session(
    sid: str, build: str | None, start: float, rate: float | None, tokens: int, kind: str = "llamacpp"
) -> SessionRecord:
    return SessionRecord(
        sid, "http://127.0.0.1:8080", kind, "gemma", start, start + 60.0, server_version=build,
        hardware="CPU", requests=2, decode_tokens=tokens, mean_decode_tok_s=rate,
    )  # fmt: skip


def test_groups_by_engine_build_and_model() -> None:
    """By hand: b11434's two sessions, (41 × 300 + 38 × 100) / 400 = 40.25 tok/s; b11502's one, 28."""
    groups = sessions_by_build(
        [
            session("a", "b11434-1", 100.0, 41.0, 300),
            session("b", "b11434-1", 200.0, 38.0, 100),
            session("c", "b11502-2", 300.0, 28.0, 50),
            session("d", None, 50.0, None, 0, kind="ollama"),
        ]
    )
    assert [(g.engine, g.build, g.sessions, g.requests) for g in groups] == [
        ("Ollama", None, 1, 2),
        ("llama.cpp", "b11434-1", 2, 4),
        ("llama.cpp", "b11502-2", 1, 2),
    ]
    assert groups[0].mean_decode_tok_s is None
    assert groups[1].mean_decode_tok_s == 40.25
    assert (groups[1].first_wall_s, groups[1].last_wall_s) == (100.0, 260.0)
    assert groups[2].mean_decode_tok_s == 28.0
