"""oMLX's `GET /admin/api/activity`: what each loaded model is doing, parsed from its documented shape.

oMLX (`jundot/omlx`, 0.7.0) answers it to an admin session (the cookie `omlx_admin_session` from
`POST /admin/api/login` with the main API key); no server of it runs here, so the shape is the one
documented in Codenotch's oMLX plan (`vinzdg/codenotch` docs/plans/2026-10-08-omlx-provider-plan.md):
an idle answer recorded from oMLX 0.7.0, and the busy items as `omlx/admin/routes.py`
`_build_active_models_data` writes them — `waiting` (`request_id`, `queue_position`,
`elapsed_seconds`, `prompt_tokens`), `prefilling` (`processed`, `total`, `speed`, `eta`, `elapsed`,
`detail`), `generating` (`elapsed_seconds`, `generated_tokens`, `tokens_per_second`,
`last_activity_age_seconds`, `prompt_tokens`, `max_tokens`); only loaded or loading models appear.
Fixtures: tests/fixtures/omlx/. Pure parsing: the probe that logs in and polls it is not built (the
login's body is not documented).

Each prefilling or generating request becomes a slot of its model (a generating one with the tokens
generated so far, so the rates stage measures its rate between polls like any slot), the queue the
model's waiting count; oMLX's own per-request rates, queue positions and ETAs are kept beside them
as `OmlxRequest`s, and the memory pressure as `OmlxMemory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trayapp.core.model import CounterReading, ModelReading, SlotReading
from trayapp.sources.http import UnexpectedAnswer
from trayapp.sources.servers.jsonvals import as_bool, as_dict, as_float, as_int, as_str

OmlxPhase = Literal["waiting", "prefilling", "generating"]


@dataclass(frozen=True)
class OmlxRequest:
    """One request oMLX is queueing, reading or answering, with oMLX's own figures."""

    model: str
    request_id: str | None
    phase: OmlxPhase
    queue_position: int | None = None  # waiting: 1 = next
    waited_s: float | None = None  # waiting: how long so far
    prompt_tokens: int | None = None
    prompt_tokens_done: int | None = None  # prefilling: read so far
    prompt_tok_s: float | None = None  # prefilling: oMLX's reading speed
    prompt_eta_s: float | None = None  # prefilling: oMLX's estimate of the time left
    generated_tokens: int | None = None  # generating: so far
    decode_tok_s: float | None = None  # generating: oMLX's own rate
    max_tokens: int | None = None


@dataclass(frozen=True)
class OmlxMemory:
    """oMLX's memory pressure: its level (`ok` in the recorded answer) and the byte marks behind it."""

    level: str | None
    current_bytes: int | None
    soft_bytes: int | None  # past it oMLX starts to evict
    hard_bytes: int | None


@dataclass(frozen=True)
class OmlxActivity:
    models: tuple[ModelReading, ...]
    requests: tuple[OmlxRequest, ...]
    memory: OmlxMemory | None
    waiting_total: int | None  # requests queued over all models


def _list(value: object) -> list[dict[str, Any]]:
    return [as_dict(item) for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _model(name: str, item: dict[str, Any], requests: list[OmlxRequest]) -> ModelReading:
    slots: list[SlotReading] = []
    for number, prefill in enumerate(_list(item.get("prefilling"))):
        done, total = as_int(prefill.get("processed")), as_int(prefill.get("total"))
        slots.append(
            SlotReading(number, True, n_decoded=0, prompt_tokens_processed=done, prompt_tokens_total=total)
        )
        requests.append(
            OmlxRequest(
                name, as_str(prefill.get("request_id")), "prefilling", prompt_tokens=total,
                prompt_tokens_done=done, prompt_tok_s=as_float(prefill.get("speed")),
                prompt_eta_s=as_float(prefill.get("eta")),
            )
        )  # fmt: skip
    for number, gen in enumerate(_list(item.get("generating")), start=len(slots)):
        generated, prompt = as_int(gen.get("generated_tokens")), as_int(gen.get("prompt_tokens"))
        context = prompt + generated if prompt is not None and generated is not None else None
        slots.append(SlotReading(number, True, n_decoded=generated, context_tokens=context))
        requests.append(
            OmlxRequest(
                name, as_str(gen.get("request_id")), "generating", prompt_tokens=prompt,
                generated_tokens=generated, decode_tok_s=as_float(gen.get("tokens_per_second")),
                max_tokens=as_int(gen.get("max_tokens")),
            )
        )  # fmt: skip
    for wait in _list(item.get("waiting")):
        requests.append(
            OmlxRequest(
                name, as_str(wait.get("request_id")), "waiting",
                queue_position=as_int(wait.get("queue_position")),
                waited_s=as_float(wait.get("elapsed_seconds")),
                prompt_tokens=as_int(wait.get("prompt_tokens")),
            )
        )  # fmt: skip
    actual = as_int(item.get("actual_size"))
    loading = as_bool(item.get("is_loading"))
    counters = CounterReading(
        requests_running=as_float(item.get("active_requests")),
        requests_waiting=as_float(item.get("waiting_requests")),
    )
    busy = bool(slots) or bool(_list(item.get("activities")))
    return ModelReading(
        name=name,
        loaded=not loading,
        loading=loading,
        size_bytes=actual if actual else as_int(item.get("estimated_size")),
        slots=tuple(slots),
        counters=counters,
        busy=busy,
    )


def parse_omlx_activity(data: Any) -> OmlxActivity:
    """`GET /admin/api/activity` → each model with its requests as slots, oMLX's own figures, memory."""
    active = as_dict(as_dict(data).get("active_models"))
    if not isinstance(active.get("models"), list):
        raise UnexpectedAnswer("unexpected /admin/api/activity shape (no active_models.models list)")
    requests: list[OmlxRequest] = []
    named = [(as_str(item.get("id")), item) for item in _list(active["models"])]
    models = tuple(_model(name, item, requests) for name, item in named if name is not None)
    pressure = active.get("memory_pressure")
    memory = None
    if isinstance(pressure, dict):
        memory = OmlxMemory(
            level=as_str(pressure.get("pressure_level")),
            current_bytes=as_int(pressure.get("current_bytes")),
            soft_bytes=as_int(pressure.get("soft_bytes")),
            hard_bytes=as_int(pressure.get("hard_bytes")),
        )
    return OmlxActivity(models, tuple(requests), memory, as_int(active.get("total_waiting_requests")))


__all__ = ["OmlxActivity", "OmlxMemory", "OmlxRequest", "parse_omlx_activity"]
