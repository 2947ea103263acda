"""Did the prompt and the answer fit the context? The `context_overflow` alert (#20).

A request overflows its context in one of three ways, each read from the request's record:

* **rejected** — the server refused the prompt (llama-server's HTTP 400 `exceed_context_size_error`
  with `n_prompt_tokens` and `n_ctx`; vLLM's "maximum context length is N tokens");
* **truncated** — the server dropped the head of the prompt and answered anyway (Ollama keeps the
  last `num_ctx` tokens and says so only in its log; LM Studio's truncating overflow policies): the
  tokens it processed fall short of the tokens sent — exactly when a tokenizer or the server's log
  counted the prompt, or, from an estimate of the prompt's size, only when the tokens processed
  fill the context (the one sign an estimate cannot fake);
* **cut short** — the answer stopped because the context ran out (llama-server `truncated: true`;
  an OpenAI `finish_reason: "length"` with the context full and the client's `max_tokens` not reached).

`OverflowWatch` remembers the last overflow of each model so the alert is one episode: it lasts
until a request of that model fits, the model's context grows to what was needed, or
`OVERFLOW_HOLD_S` pass without another overflow. The fix is computed for that server and this
machine: the context needed (rounded up), its KV-cache cost from the model's own facts, whether
that fits in free memory or would spill layers (and the decode ceiling then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from trayapp.core import physics
from trayapp.core.fixes import context_size_commands, round_up_context
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Finding,
    HardwareSnapshot,
    ModelKey,
    ModelStatus,
    RequestRecord,
    ServerStatus,
    Severity,
)
from trayapp.core.placement import ceiling_for
from trayapp.core.server_kinds import context_flag, server_label
from trayapp.core.units import format_bytes, format_rate, format_tokens

OverflowCause = Literal["rejected", "truncated", "cut_short"]

OVERFLOW_HOLD_S = 600.0  # an overflow not seen again for this long is no longer news
ANSWER_ROOM_TOKENS = 1024  # room for an answer when the client set no max_tokens
FULL_CONTEXT_SHARE = 0.98  # an estimated prompt counts as truncated when the kept tokens fill this much


def context_setting(kind: str, per_request_tokens: int, parallel_slots: int = 1) -> str:
    """The server's own words for a context size: 'num_ctx 4096', '-c 8192' (llama-server's `-c` is
    shared by its slots), 'a context length of 4,096 tokens'."""
    flag = context_flag(kind)
    if flag is None:
        return f"a context length of {per_request_tokens:,} tokens"
    total = per_request_tokens * parallel_slots if kind == "llamacpp" else per_request_tokens
    return f"{flag} {total}"


@dataclass(frozen=True)
class Overflow:
    """One request that did not fit, with the numbers that show it (counts only)."""

    cause: OverflowCause
    context_tokens: int  # the context size per request the server worked with
    tokens_sent: int | None  # the prompt as sent (None: not known)
    sent_exact: bool  # counted by the server's tokenizer or its log; False: estimated from the text
    tokens_kept: int | None  # what the server processed of the prompt (truncated, cut short)
    answer_tokens: int | None  # generated before the stop (cut short)
    max_tokens: int | None  # the client's limit on the answer
    source: str  # where the record came from: "proxy", "ollama-log", "server", …
    finished_wall_s: float

    def tokens_needed(self) -> int:
        """The context this request needed: its prompt and room for its answer."""
        prompt = self.tokens_sent or self.tokens_kept or self.context_tokens
        if self.max_tokens is not None:
            room = self.max_tokens
        elif self.cause == "cut_short" and self.answer_tokens:
            room = max(2 * self.answer_tokens, ANSWER_ROOM_TOKENS)
        else:
            room = ANSWER_ROOM_TOKENS
        return prompt + room


def overflow_of(record: RequestRecord, context_length: int | None) -> Overflow | None:
    """The overflow this finished request shows, or None when it fit (or nothing says)."""
    limit = record.context_limit_tokens or context_length
    status = record.http_status
    if status is not None and 400 <= status < 500:
        if record.context_limit_tokens is None:
            return None  # another client error
        return _overflow(record, "rejected", record.context_limit_tokens, kept=None)
    if (status is not None and status >= 500) or limit is None:
        return None
    sent, kept = record.prompt_tokens_sent, record.prompt_tokens
    if sent is not None and kept is not None and kept < sent:
        fills_context = kept >= FULL_CONTEXT_SHARE * limit and sent > limit  # what an estimate needs
        if record.prompt_sent_exact or fills_context:
            return _overflow(record, "truncated", limit, kept=kept)
    if record.stop_reason == "context":
        return _overflow(record, "cut_short", limit, kept=kept)
    if (
        record.stop_reason == "length"
        and record.context_tokens is not None
        and record.context_tokens >= limit - 1
    ):
        wanted = record.max_tokens_requested
        if wanted is None or (record.decode_tokens or 0) < wanted:
            return _overflow(record, "cut_short", limit, kept=kept)
    return None


def _overflow(record: RequestRecord, cause: OverflowCause, limit: int, *, kept: int | None) -> Overflow:
    return Overflow(
        cause=cause,
        context_tokens=limit,
        tokens_sent=record.prompt_tokens_sent,
        sent_exact=record.prompt_sent_exact,
        tokens_kept=kept,
        answer_tokens=record.decode_tokens if cause == "cut_short" else None,
        max_tokens=record.max_tokens_requested,
        source=record.source,
        finished_wall_s=record.finished_wall_s,
    )


def _same_request_less_exact(remembered: _Remembered, overflow: Overflow) -> bool:
    known = remembered.overflow
    return (
        known.sent_exact
        and not overflow.sent_exact
        and known.cause == overflow.cause
        and known.tokens_kept == overflow.tokens_kept
        and 0 <= overflow.finished_wall_s - known.finished_wall_s <= OVERFLOW_HOLD_S
    )


def _fits(record: RequestRecord) -> bool:
    """A request that shows it fitted: answered, nothing cut, its counts known."""
    ok = record.http_status is None or 200 <= record.http_status < 300
    return ok and not record.aborted and record.prompt_tokens is not None and record.decode_tokens is not None


@dataclass
class _Remembered:
    overflow: Overflow  # the latest
    needed_tokens: int  # the most any overflow of this episode needed
    context_length: int | None  # the model's context when it overflowed


class OverflowWatch:
    """The last overflow of each model, until it is over (see the module's docstring)."""

    def __init__(self) -> None:
        self._by_model: dict[ModelKey, _Remembered] = {}

    def update(
        self,
        key: ModelKey,
        status: ModelStatus,
        requests: Sequence[RequestRecord],
        now_wall_s: float,
    ) -> tuple[Overflow, int] | None:
        """Fold in this tick's finished requests of one model; (latest overflow, context needed) while
        its episode lasts, None once it is over (or there was none)."""
        remembered = self._by_model.get(key)
        for record in sorted(requests, key=lambda r: r.finished_wall_s):
            overflow = overflow_of(record, status.context_length)
            if (
                overflow is not None
                and remembered is not None
                and _same_request_less_exact(remembered, overflow)
            ):
                continue  # the proxy's estimate of a request the server's log counted exactly
            if overflow is not None:
                needed = overflow.tokens_needed()
                if remembered is not None:
                    needed = max(needed, remembered.needed_tokens)
                remembered = _Remembered(overflow, needed, status.context_length)
            elif remembered is not None and _fits(record):
                remembered = None  # a request of this model fitted: the cause is gone
        if remembered is not None:
            grown = status.context_length is not None and status.context_length != remembered.context_length
            if (
                grown
                and status.context_length is not None
                and status.context_length >= remembered.needed_tokens
            ):
                remembered = None  # reloaded with the context it needed
            elif now_wall_s - remembered.overflow.finished_wall_s > OVERFLOW_HOLD_S:
                remembered = None
        if remembered is None:
            self._by_model.pop(key, None)
            return None
        self._by_model[key] = remembered
        return remembered.overflow, remembered.needed_tokens

    def known(self, key: ModelKey) -> bool:
        return key in self._by_model


def overflow_finding(
    server: ServerStatus,
    model: ModelStatus,
    overflow: Overflow,
    needed_tokens: int,
    machine: Machine,
    hardware: HardwareSnapshot | None,
) -> Finding:
    """The `context_overflow` finding: what happened, in the server's numbers, and the fix.
    `hardware`: this machine's readings (None for a server on another machine: its free memory is
    not known here)."""
    label = server_label(server.kind)
    slots = model.parallel_slots or 1
    message = _message(label, server.kind, overflow, slots)
    target = round_up_context(needed_tokens)
    train = model.facts.context_train if model.facts is not None else None
    beyond_training = train is not None and target > train
    if beyond_training and train is not None:
        target = train
    fix, cost = _fix_text(server.kind, model, overflow, target, machine, hardware)
    if beyond_training:
        fix += (
            f" The model was trained on {format_tokens(train)} tokens: a longer prompt does not fit it "
            "at all — send less (split the work, or trim files and history)."
        )
    commands = context_size_commands(server.kind, model.name, target, parallel_slots=slots)
    evidence: dict[str, object] = {
        "cause": overflow.cause,
        "tokens_sent": overflow.tokens_sent,
        "tokens_sent_exact": overflow.sent_exact,
        "tokens_kept": overflow.tokens_kept,
        "answer_tokens": overflow.answer_tokens,
        "max_tokens": overflow.max_tokens,
        "context_tokens": overflow.context_tokens,
        "context_needed_tokens": target,
        "source": overflow.source,
        **cost,
    }
    severity: Severity = "critical" if overflow.cause == "truncated" else "warning"
    score = (overflow.tokens_sent or overflow.context_tokens) / max(overflow.context_tokens, 1)
    return Finding(
        "context_overflow",
        severity,
        server.url,
        model.name,
        message,
        fix,
        evidence,
        cause=overflow.cause,
        score=score,
        fix_commands=commands,
    )


def _message(label: str, kind: str, overflow: Overflow, slots: int) -> str:
    ctx = f"{overflow.context_tokens:,}"
    named = f" ({context_setting(kind, overflow.context_tokens, slots)})" if context_flag(kind) else ""
    sent = (
        None
        if overflow.tokens_sent is None
        else f"{'' if overflow.sent_exact else '~'}{overflow.tokens_sent:,}"
    )
    if overflow.cause == "truncated":
        how = "" if overflow.sent_exact else " (the prompt's size is estimated from its text)"
        return (
            f"{label} kept {overflow.tokens_kept or 0:,} of your {sent} prompt tokens{named}: "
            f"the model never saw the rest, so its answer can be wrong{how}."
        )
    if overflow.cause == "rejected":
        prompt = f"a {sent}-token prompt" if sent else "a prompt longer than its context"
        return (
            f"{label} refused {prompt}: its context holds {ctx} tokens per request{named}. "
            "The client got an error (HTTP 400), which it may not show."
        )
    answer = f" after {overflow.answer_tokens:,} tokens" if overflow.answer_tokens else ""
    return (
        f"{label} stopped an answer{answer}: the prompt and the answer filled the {ctx}-token context"
        f"{named}, so the answer is cut short."
    )


def _fix_text(
    kind: str,
    model: ModelStatus,
    overflow: Overflow,
    target: int,
    machine: Machine,
    hardware: HardwareSnapshot | None,
) -> tuple[str, dict[str, object]]:
    """'num_ctx 24576 needs +2.1 GB of KV cache: it fits (6.3 GB free).' and its numbers."""
    slots = model.parallel_slots or 1
    head = context_setting(kind, target, slots)
    head = head[0].upper() + head[1:] if head.startswith("a ") else head
    facts = model.facts
    if facts is None or facts.kv is None:
        return f"{head} holds these requests (the KV-cache cost is unknown: no model facts).", {}
    now_ctx = model.context_length or overflow.context_tokens
    kv_now = slots * physics.kv_cache_bytes(facts.kv, now_ctx, machine.kv_type)
    kv_then = slots * physics.kv_cache_bytes(facts.kv, target, machine.kv_type)
    extra = max(kv_then - kv_now, 0)
    free, where = _free_memory(machine, hardware)
    cost: dict[str, object] = {
        "kv_type": machine.kv_type,
        "kv_bytes_now": kv_now,
        "kv_bytes_needed": kv_then,
        "kv_extra_bytes": extra,
        "free_bytes": free,
        "parallel_slots": slots,
    }
    text = f"{head} needs +{format_bytes(extra)} of KV cache ({machine.kv_type})"
    if slots > 1:
        text += f" for its {slots} slots"
    if free is None:
        return text + f"; free {where} is not known here.", cost
    if extra <= free:
        cost["fits"] = True
        return text + f": it fits ({format_bytes(free)} of {where} free).", cost
    cost["fits"] = False
    if not machine.has_gpu or machine.unified_memory:
        return (
            text + f": only {format_bytes(free)} of {where} is free — it would swap; send less instead.",
            cost,
        )
    capacity = (model.vram_bytes or 0) + free
    fraction = physics.auto_gpu_fraction(facts.weights_bytes, kv_then, capacity)
    ceiling_now = ceiling_for(facts, now_ctx, machine, model.gpu_fraction)
    ceiling_then = ceiling_for(facts, target, machine, fraction)
    cost.update(gpu_fraction_then=fraction, ceiling_tok_s_now=ceiling_now, ceiling_tok_s_then=ceiling_then)
    spill = (
        f"about {(1 - fraction) * 100:.0f} % of the model would move to the CPU"
        if fraction is not None
        else ("part of the model would move to the CPU")
    )
    speed = ""
    if ceiling_then is not None:
        speed = f", decode ≤ {format_rate(ceiling_then)} tok/s"
        if ceiling_now is not None:
            speed += f" (now ≤ {format_rate(ceiling_now)})"
    return text + f": only {format_bytes(free)} of VRAM is free, so {spill}{speed}.", cost


def _free_memory(machine: Machine, hardware: HardwareSnapshot | None) -> tuple[int | None, str]:
    """Memory free for a bigger KV cache: VRAM on a GPU machine, else the RAM available."""
    if hardware is None:
        return None, "memory"
    if machine.has_gpu and not machine.unified_memory:
        free = [
            g.vram_total_bytes - g.vram_used_bytes
            for g in hardware.gpus
            if g.vram_total_bytes is not None and g.vram_used_bytes is not None
        ]
        return (sum(free) if free else None), "VRAM"
    return hardware.host.ram_available_bytes, "memory" if machine.has_gpu else "RAM"
