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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from trayapp.core import physics
from trayapp.core.fixes import CONTEXT_STEP_TOKENS, context_size_commands, round_up_context
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.machine import Machine
from trayapp.core.model import (
    Finding,
    ModelFacts,
    ModelKey,
    ModelStatus,
    RequestRecord,
    ServerStatus,
    Severity,
    StopReason,
)
from trayapp.core.placement import ceiling_for
from trayapp.core.server_kinds import context_flag, server_label
from trayapp.core.units import format_bytes, format_rate, format_tokens

OverflowCause = Literal["rejected", "truncated", "cut_short"]

OVERFLOW_HOLD_S = 600.0  # an overflow not seen again for this long is no longer news
ANSWER_ROOM_TOKENS = 1024  # room for an answer when the client set no max_tokens
FULL_CONTEXT_SHARE = 0.98  # an estimated prompt counts as truncated when the kept tokens fill this much
LLAMA_DEFAULT_SLOTS = 4  # llama-server without -np: 4 slots sharing one cache of -c tokens (kv_unified)
OLLAMA_NUM_KEEP = 4  # Ollama's default num_keep (api/types.go): the head of a prompt it always keeps


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

    def prompt_and_answer(self) -> tuple[int, int]:
        """What this request needed room for: its prompt, and its answer (the client's max_tokens;
        else twice what came before a cut, at least `ANSWER_ROOM_TOKENS`)."""
        prompt = self.tokens_sent or self.tokens_kept or self.context_tokens
        if self.max_tokens is not None:
            room = self.max_tokens
        elif self.cause == "cut_short" and self.answer_tokens:
            room = max(2 * self.answer_tokens, ANSWER_ROOM_TOKENS)
        else:
            room = ANSWER_ROOM_TOKENS
        return prompt, room


# --------------------------------------------------------------------------- why an answer ended

# Each server's words for why an answer ended, in the one vocabulary (`StopReason`): OpenAI
# `finish_reason`, Ollama `done_reason`, llama-server `stop_type`, LM Studio `stop_reason`/`stopReason`.
_STOP_WORDS: dict[str, StopReason] = {
    "length": "length",
    "limit": "length",
    "maxPredictedTokensReached": "length",
    "contextLengthReached": "context",
    **{word: "stop" for word in ("stop", "eos", "word", "tool_calls", "function_call", "end_turn")},
    **{word: "stop" for word in ("eosFound", "stopStringFound", "toolCalls")},
}


def stop_reason_from(word: object) -> StopReason | None:
    """A server's word for why an answer ended → `StopReason` ("other" for a word not listed);
    None for no word (or llama-server's "none": still going)."""
    if not isinstance(word, str) or not word or word == "none":
        return None
    return _STOP_WORDS.get(word, "other")


# --------------------------------------------------------------------------- Ollama's cut, by version


def _version(version: str | None) -> tuple[int, int, int] | None:
    """'0.30.9-rc2' → (0, 30, 9); None for an unknown or development version."""
    parts = (version or "").lstrip("v").split("-")[0].split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        return None
    numbers = (int(parts[0]), int(parts[1]), int(parts[2]))
    return None if numbers == (0, 0, 0) else numbers


def ollama_whole_prompt_tokens(num_ctx: int, version: str | None, keep: int = OLLAMA_NUM_KEEP) -> int:
    """The longest prompt an Ollama of `version` keeps whole in a context of `num_ctx` (what it cuts a
    longer one to). v0.30.11+ leaves about half the context to the answer
    (llm/llama_server.go `contextShiftPromptLimit`: num_ctx − max((num_ctx − keep) // 2, 1));
    v0.30.0–v0.30.10 keep num_ctx − 1; the older Go runners num_ctx. Unknown: the newest rule (the
    smallest room, so a fix computed with it holds on every version)."""
    v = _version(version)
    if v is not None and v < (0, 30, 0):
        return num_ctx
    if v is not None and v < (0, 30, 11):
        return num_ctx - 1
    keep = max(0, min(keep, num_ctx - 1))
    return num_ctx - max((num_ctx - keep) // 2, 1) if num_ctx > 1 else 0


def _cut_sizes(kind: str, num_ctx: int, version: str | None) -> frozenset[int]:
    """What a server keeps of a prompt it cuts: the sizes a truncated prompt is left with."""
    if kind != "ollama":
        return frozenset({num_ctx, num_ctx - 1})
    if _version(version) is not None:
        keeps = (OLLAMA_NUM_KEEP, OLLAMA_NUM_KEEP + 1)  # +1: a BOS token the tokenizer adds
        return frozenset(ollama_whole_prompt_tokens(num_ctx, version, k) for k in keeps)
    return frozenset({num_ctx, num_ctx - 1, *(ollama_whole_prompt_tokens(num_ctx, None, k) for k in (4, 5))})


def context_needed(kind: str, version: str | None, prompt_tokens: int, answer_tokens: int) -> int:
    """The context size (a whole 1,024) that holds this prompt and answer on this server: Ollama
    v0.30.11+ must be given about twice the prompt, as it keeps half the context for the answer."""
    target = round_up_context(prompt_tokens + answer_tokens)
    if kind == "ollama":
        while ollama_whole_prompt_tokens(target, version) < prompt_tokens:
            target += CONTEXT_STEP_TOKENS
    return target


def overflow_of(
    record: RequestRecord, context_length: int | None, version: str | None = None
) -> Overflow | None:
    """The overflow this finished request shows, or None when it fit (or nothing says). `version`:
    the server's, for what an Ollama keeps of a prompt it cuts."""
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
        exact = record.prompt_sent_exact
        if exact or _estimate_shows_a_cut(record.server_kind, sent, kept, limit, version):
            return _overflow(record, "truncated", limit, kept=kept)
    below_max_tokens = record.max_tokens_requested is None or (
        (record.decode_tokens or 0) < record.max_tokens_requested
    )
    if record.stop_reason == "context" and below_max_tokens:  # with --context-shift it may reach n_predict
        return _overflow(record, "cut_short", limit, kept=kept)
    context_full = record.context_tokens is not None and record.context_tokens >= limit - 1
    if record.stop_reason == "length" and context_full and below_max_tokens:
        return _overflow(record, "cut_short", limit, kept=kept)
    return None


def _estimate_shows_a_cut(kind: str, estimate: int, kept: int, limit: int, version: str | None) -> bool:
    """Whether a prompt whose size is only estimated (its characters ÷ 4) was cut. A server cuts only a
    prompt longer than its context, to a size of its own: the kept tokens must fill the context, or be
    that size — and then the estimate must be nearer a prompt over the context than the kept size
    itself (a prompt of exactly the cut size is kept whole). Nearer as a ratio, the estimate's error
    being one: at least the geometric mean of the kept size and the context."""
    if kept >= FULL_CONTEXT_SHARE * limit:
        return True
    return kept in _cut_sizes(kind, limit, version) and estimate >= math.sqrt(kept * limit)


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


def _same_request(a: Overflow, b: Overflow) -> bool:
    """Two accounts of one request (the proxy's and the server log's): same cause, same tokens kept,
    within the hold time of each other."""
    return (
        a.cause == b.cause
        and a.tokens_kept == b.tokens_kept
        and abs(a.finished_wall_s - b.finished_wall_s) <= OVERFLOW_HOLD_S
    )


def _fits(record: RequestRecord) -> bool:
    """A request that shows it fitted: answered, nothing cut, its counts known."""
    ok = record.http_status is None or 200 <= record.http_status < 300
    return ok and not record.aborted and record.prompt_tokens is not None and record.decode_tokens is not None


@dataclass
class _Remembered:
    overflow: Overflow  # the latest
    prompt_tokens: int  # the longest prompt of this episode
    answer_tokens: int  # the most answer room any request of it needed
    context_needed: int  # the context that holds both on this server
    context_length: int | None  # the model's context when it overflowed


class OverflowWatch:
    """The last overflow of each model, until it is over (see the module's docstring)."""

    def __init__(self) -> None:
        self._by_model: dict[ModelKey, _Remembered] = {}

    def update(
        self,
        server: ServerStatus,
        status: ModelStatus,
        requests: Sequence[RequestRecord],
        now_wall_s: float,
    ) -> tuple[Overflow, int] | None:
        """Fold in this tick's finished requests of one model; (latest overflow, context needed) while
        its episode lasts, None once it is over (or there was none)."""
        key = (server.url, status.name)
        remembered = self._by_model.get(key)
        for record in sorted(requests, key=lambda r: r.finished_wall_s):
            overflow = overflow_of(record, status.context_length, server.version)
            if (
                overflow is not None
                and remembered is not None
                and remembered.overflow.sent_exact
                and not overflow.sent_exact
                and _same_request(remembered.overflow, overflow)
            ):
                continue  # the proxy's estimate of a request the server's log counted exactly
            if overflow is not None:
                prompt, answer = overflow.prompt_and_answer()
                if remembered is not None:
                    # the log's exact count of a request the proxy estimated replaces the estimate
                    known = remembered.overflow
                    replaced = overflow.sent_exact and not known.sent_exact and _same_request(known, overflow)
                    prompt = max(prompt, 0 if replaced else remembered.prompt_tokens)
                    answer = max(answer, remembered.answer_tokens)
                needed = context_needed(server.kind, server.version, prompt, answer)
                remembered = _Remembered(overflow, prompt, answer, needed, status.context_length)
            elif remembered is not None and _fits(record):
                remembered = None  # a request of this model fitted: the cause is gone
        if remembered is not None:
            grown = status.context_length is not None and status.context_length != remembered.context_length
            if (
                grown
                and status.context_length is not None
                and status.context_length >= remembered.context_needed
            ):
                remembered = None  # reloaded with the context it needed
            elif now_wall_s - remembered.overflow.finished_wall_s > OVERFLOW_HOLD_S:
                remembered = None
        if remembered is None:
            self._by_model.pop(key, None)
            return None
        self._by_model[key] = remembered
        return remembered.overflow, remembered.context_needed

    def known(self, key: ModelKey) -> bool:
        return key in self._by_model


def overflow_finding(
    server: ServerStatus,
    model: ModelStatus,
    overflow: Overflow,
    context_needed_tokens: int,
    machine: Machine,
    hardware: HardwareSnapshot | None,
) -> Finding:
    """The `context_overflow` finding: what happened, in the server's numbers, and the fix.
    `hardware`: this machine's readings (None for a server on another machine: its free memory is
    not known here)."""
    label = server_label(server.kind)
    slots = model.parallel_slots or 1
    message = _message(label, server.kind, overflow, slots)
    target = context_needed_tokens
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
    commands = context_size_commands(
        server.kind, model.name, target, parallel_slots=slots, router=server.router
    )
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
        evidence,  # its "cause": rejected, truncated or cut_short (the message says it in words)
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
    text += _verdict(facts, model, now_ctx, target, kv_then, extra, free, where, machine, cost)
    if kind == "llamacpp" and slots == LLAMA_DEFAULT_SLOTS:
        # llama-server's default (no -np): 4 slots over one unified cache of -c tokens, which /slots
        # cannot tell from -np 4 (4 caches of -c / 4): the command given holds in either layout
        text += f" Without -np (4 slots sharing one cache), -c {target} alone is enough."
    return text, cost


def _verdict(
    facts: ModelFacts,
    model: ModelStatus,
    now_ctx: int,
    target: int,
    kv_then: int,
    extra: int,
    free: int | None,
    where: str,
    machine: Machine,
    cost: dict[str, object],
) -> str:
    """': it fits (…)', or what does not fit: the swap, or the share of the model that would spill to
    the CPU and the decode ceiling then (`cost` gets the numbers)."""
    if free is None:
        return f"; free {where} is not known here."
    cost["fits"] = extra <= free
    if extra <= free:
        return f": it fits ({format_bytes(free)} of {where} free)."
    if not machine.has_gpu or machine.unified_memory:
        return f": only {format_bytes(free)} of {where} is free — it would swap; send less instead."
    fraction = physics.auto_gpu_fraction(facts.weights_bytes, kv_then, (model.vram_bytes or 0) + free)
    ceiling_now = ceiling_for(facts, now_ctx, machine, model.gpu_fraction)
    ceiling_then = ceiling_for(facts, target, machine, fraction)
    cost.update(gpu_fraction_then=fraction, ceiling_tok_s_now=ceiling_now, ceiling_tok_s_then=ceiling_then)
    spill = "part of the model would move to the CPU"
    if fraction is not None:
        spill = f"about {(1 - fraction) * 100:.0f} % of the model would move to the CPU"
    speed = ""
    if ceiling_then is not None:
        speed = f", decode ≤ {format_rate(ceiling_then)} tok/s"
        if ceiling_now is not None:
            speed += f" (now ≤ {format_rate(ceiling_now)})"
    return f": only {format_bytes(free)} of VRAM is free, so {spill}{speed}."


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
