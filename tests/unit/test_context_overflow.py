"""The context_overflow alert (#20): a prompt refused, a prompt truncated, an answer cut short.

The whole Pipeline is driven tick by tick with the records the proxy and Ollama's log make. Every
expected number is worked by hand below from the servers' own numbers and the models' GGUF facts
(KV bytes per token: layers × KV heads × (key_length + value_length) elements × 2 B for f16).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.diagnose_inputs import (
    KV_8B,
    LLAMA_8B,
    OLLAMA_URL,
    VRAM_TOTAL,
    WALL0,
    hardware,
)
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.machine import resolve_machine
from trayapp.core.model import (
    Alert,
    FinishedRequest,
    KvLayout,
    ModelFacts,
    ModelReading,
    RequestRecord,
    ServerReading,
    SlotReading,
    Snapshot,
)
from trayapp.core.overflow import overflow_of
from trayapp.core.pipeline import Pipeline

LLAMA_URL = "http://127.0.0.1:8080"
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
# gemma-3-270m Q4_K_M (the GGUF the real-server tests use; tests/integration/test_modelfile_gguf.py
# reads these from the file): 18 layers, 1 KV head × (256 + 256); every 6th layer is global (3 of 18),
# the other 15 slide over 512 tokens. Full: 3 × 512 = 1536 elements a token; sliding: 15 × 512 = 7680.
GEMMA_KV = KvLayout(full_elems_per_token=1536, swa_elems_per_token=7680, sliding_window=512, n_layers=18)
GEMMA = ModelFacts(
    weights_bytes=246_587_904,
    bytes_per_token=246_587_904,
    exact=True,
    source="gguf",
    architecture="gemma3",
    quantization="Q4_K_M",
    context_train=32_768,
    kv=GEMMA_KV,
)
# f16 KV of gemma at n tokens: (1536 × n + 7680 × min(n, 512)) × 2 B
GEMMA_KV_256 = (1536 * 256 + 7680 * 256) * 2  # 4_718_592
GEMMA_KV_1024 = (1536 * 1024 + 7680 * 512) * 2  # 11_010_048
GEMMA_KV_2048 = (1536 * 2048 + 7680 * 512) * 2  # 14_155_776

CPU_HOST = HardwareSnapshot(
    gpus=(),
    host=HostReading(
        ram_total_bytes=24 * 2**30, ram_available_bytes=20_000_000_000, ram_bandwidth_gbps=30.0, cpu_count=2
    ),
)


def llama_reading(*finished: FinishedRequest, slots: int = 1, n_ctx: int = 256) -> ServerReading:
    model = ModelReading(
        name=GEMMA_NAME,
        context_length=n_ctx,
        facts=GEMMA,
        slots=tuple(SlotReading(slot_id=i, is_processing=False, n_ctx=n_ctx) for i in range(slots)),
    )
    return ServerReading(
        kind="llamacpp", url=LLAMA_URL, status="ok", models=(model,), finished=finished, proxied=True
    )


OLD_OLLAMA = "0.12.3"  # its runner keeps num_ctx tokens of a longer prompt (limit = new = num_ctx)
NEW_OLLAMA = "0.31.0"  # v0.30.11+ keeps about half the context for the answer (limit = new ≈ num_ctx / 2)


def ollama_reading(*finished: FinishedRequest, n_ctx: int = 4096, version: str = OLD_OLLAMA) -> ServerReading:
    model = ModelReading(name="llama3.1:8b", context_length=n_ctx, facts=LLAMA_8B, vram_bytes=6_000_000_000)
    return ServerReading(
        kind="ollama", url=OLLAMA_URL, status="ok", version=version, models=(model,), finished=finished
    )


class Ticks:
    def __init__(self) -> None:
        self.pipeline = Pipeline()
        self.t = 0.0
        self.snapshots: list[Snapshot] = []

    def tick(self, reading: ServerReading, hw: HardwareSnapshot) -> Snapshot:
        self.t += 1.0
        out = self.pipeline.process([reading], hw, {}, resolve_machine(hw), self.t, WALL0 + self.t)
        self.snapshots.append(out.snapshot)
        return out.snapshot

    def overflow_alerts(self) -> list[Alert]:
        return [a for s in self.snapshots for a in s.alerts if a.kind == "context_overflow"]


def at(t: float, **fields: object) -> FinishedRequest:
    return FinishedRequest(finished_wall_s=WALL0 + t, **fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Ollama: truncated


def test_ollama_log_truncation_fires_once_with_the_sizes_and_a_fix_that_fits() -> None:
    # The log line `limit=4096 prompt=18200 keep=4 new=4096` as the Ollama probe turns it into a record.
    log_record = at(
        1,
        model="llama3.1:8b",
        source="ollama-log",
        prompt_tokens=4096,
        prompt_tokens_sent=18_200,
        prompt_sent_exact=True,
        context_limit_tokens=4096,
    )
    used = 10_000_000_000
    hw = hardware(used)
    ticks = Ticks()
    ticks.tick(ollama_reading(log_record), hw)
    for _ in range(5):
        ticks.tick(ollama_reading(), hw)
    alerts = ticks.overflow_alerts()
    assert len({a.id for a in alerts}) == 1 and len(alerts) == 6  # one episode, from the first tick
    alert = alerts[0]
    assert alert.severity == "critical"
    assert alert.message.startswith("Ollama kept 4,096 of your 18,200 prompt tokens (num_ctx 4096)")
    # Needed: 18,200 + 1,024 (room for an answer: no max_tokens) = 19,224 → 19 × 1024 = 19,456.
    # KV: (19,456 − 4,096) × 131,072 B (Llama-3.1-8B, f16) = 15,360 × 131,072 = 2,013,265,920 B.
    # Free VRAM: 25,769,803,776 − 10,000,000,000 = 15,769,803,776 B.
    evidence = alert.evidence
    assert evidence["context_needed_tokens"] == 19_456
    assert evidence["kv_extra_bytes"] == 2_013_265_920
    assert evidence["free_bytes"] == VRAM_TOTAL - used == 15_769_803_776
    assert evidence["fits"] is True
    assert evidence["tokens_sent"] == 18_200 and evidence["tokens_kept"] == 4096
    assert evidence["source"] == "ollama-log" and evidence["tokens_sent_exact"] is True
    assert alert.fix.startswith(
        "num_ctx 19456 needs +2.0 GB of KV cache (f16): it fits (15.8 GB of VRAM free)."
    )
    assert "OLLAMA_CONTEXT_LENGTH=19456 ollama serve" in alert.fix_commands
    assert any("PARAMETER num_ctx 19456" in c for c in alert.fix_commands)


def test_a_bigger_context_that_does_not_fit_says_what_spills() -> None:
    record = at(
        1, model="llama3.1:8b", prompt_tokens=4096, prompt_tokens_sent=100_000, prompt_sent_exact=True
    )
    # 100,000 + 1,024 → 101,376 tokens: (101,376 − 4,096) × 131,072 = 12,750,684,160 B of KV to add,
    # with only 25,769,803,776 − 20,000,000,000 = 5,769,803,776 B free.
    ticks = Ticks()
    ticks.tick(ollama_reading(record), hardware(20_000_000_000))
    (alert,) = ticks.overflow_alerts()
    assert alert.evidence["kv_extra_bytes"] == 12_750_684_160
    assert alert.evidence["fits"] is False
    assert "only 5.8 GB of VRAM is free, so about" in alert.fix and "would move to the CPU" in alert.fix
    now, then = alert.evidence["ceiling_tok_s_now"], alert.evidence["ceiling_tok_s_then"]
    assert isinstance(now, float) and isinstance(then, float) and then < now


def test_a_new_ollama_needs_twice_the_prompt() -> None:
    # v0.31's log line for num_ctx 4096 and keep 4: limit = 4096 − max((4096 − 4) // 2, 1) = 2050,
    # as in a user's log: `limit=2050 prompt=8707 keep=4 new=2050`.
    log_record = at(
        1, model="llama3.1:8b", source="ollama-log", prompt_tokens=2050, prompt_tokens_sent=8707,
        prompt_sent_exact=True, context_limit_tokens=4096,
    )  # fmt: skip
    ticks = Ticks()
    ticks.tick(ollama_reading(log_record, version=NEW_OLLAMA), hardware(10_000_000_000))
    (alert,) = ticks.overflow_alerts()
    assert alert.message.startswith("Ollama kept 2,050 of your 8,707 prompt tokens (num_ctx 4096)")
    # 8,707 + 1,024 → 10,240, but that keeps only 10,240 − 5,118 = 5,122 of a prompt; the first whole
    # 1,024 that keeps 8,707: 17,408 keeps 17,408 − 8,702 = 8,706 (one short); 18,432 keeps 9,218.
    assert alert.evidence["context_needed_tokens"] == 18_432
    assert alert.evidence["kv_extra_bytes"] == (18_432 - 4096) * 131_072 == 1_879_048_192
    assert "OLLAMA_CONTEXT_LENGTH=18432 ollama serve" in alert.fix_commands


def test_an_estimate_counts_when_a_new_ollama_cut_it_to_half_the_context() -> None:
    record = at(1, model="llama3.1:8b", prompt_tokens=2050, decode_tokens=9, prompt_tokens_sent=3000)
    ticks = Ticks()
    ticks.tick(ollama_reading(record, version=NEW_OLLAMA), hardware(10_000_000_000))
    (alert,) = ticks.overflow_alerts()
    assert "kept 2,050 of your ~3,000 prompt tokens" in alert.message
    # a prompt of exactly the cut size is kept whole: an estimate nearer it than a prompt over the
    # context (below √(2050 × 4096) ≈ 2,898) is no cut
    quiet = Ticks()
    near = replace(record, prompt_tokens_sent=2897)
    quiet.tick(ollama_reading(near, version=NEW_OLLAMA), hardware(10_000_000_000))
    assert quiet.overflow_alerts() == []
    # the same counts on the old runner (which would have kept 4,096): a prompt that fitted
    ticks = Ticks()
    ticks.tick(ollama_reading(record, version=OLD_OLLAMA), hardware(10_000_000_000))
    assert ticks.overflow_alerts() == []


def test_an_estimated_prompt_counts_only_when_the_kept_tokens_fill_the_context() -> None:
    base = RequestRecord(
        server=OLLAMA_URL, server_kind="ollama", model="m", finished_wall_s=WALL0, session_id=None,
        exact=True, prompt_tokens=4096, decode_tokens=10, prompt_tokens_sent=5000, prompt_sent_exact=False,
    )  # fmt: skip
    overflow = overflow_of(base, 4096)
    assert overflow is not None and overflow.cause == "truncated" and not overflow.sent_exact
    # 3,000 kept of a 4,096 context: the estimate (~5,000) alone cannot say the prompt was cut.
    assert overflow_of(replace(base, prompt_tokens=3000), 4096) is None
    # 4,014 = 98 % of 4,096 (4,014.08 rounds below it): still not full
    assert overflow_of(replace(base, prompt_tokens=4014), 4096) is None
    assert overflow_of(replace(base, prompt_tokens=4015), 4096) is not None
    # counted exactly, any shortfall is a truncation
    assert overflow_of(replace(base, prompt_tokens=3000, prompt_sent_exact=True), 4096) is not None
    # an estimate under the context is no truncation, whatever was kept
    assert overflow_of(replace(base, prompt_tokens_sent=4000), 4096) is None


def test_the_message_marks_an_estimated_prompt_size() -> None:
    record = at(1, model="llama3.1:8b", prompt_tokens=4096, prompt_tokens_sent=5000, decode_tokens=5)
    ticks = Ticks()
    ticks.tick(ollama_reading(record), hardware(10_000_000_000))
    (alert,) = ticks.overflow_alerts()
    assert "kept 4,096 of your ~5,000 prompt tokens" in alert.message
    assert "estimated from its text" in alert.message


# --------------------------------------------------------------------------- llama-server: rejected


def rejected(t: float, sent: int = 402, n_ctx: int = 256, max_tokens: int | None = None) -> FinishedRequest:
    # llama-server's own refusal (tests/fixtures/llama-server/exceed_context_400.json): 402 tokens, n_ctx 256.
    return at(
        t, model=GEMMA_NAME, source="proxy", http_status=400, prompt_tokens_sent=sent, prompt_sent_exact=True,
        context_limit_tokens=n_ctx, max_tokens_requested=max_tokens,
    )  # fmt: skip


def test_a_refused_prompt_gives_the_flag_and_the_sliding_window_kv_cost() -> None:
    ticks = Ticks()
    ticks.tick(llama_reading(rejected(1)), CPU_HOST)
    (alert,) = ticks.overflow_alerts()
    assert alert.severity == "warning" and alert.evidence["cause"] == "rejected"
    assert alert.message.startswith(
        "llama-server refused a 402-token prompt: its context holds 256 tokens per request (-c 256)."
    )
    # 402 + 1,024 = 1,426 → 2,048 tokens; KV 14,155,776 − 4,718,592 = 9,437,184 B (the sliding layers
    # stop growing at 512 tokens).
    assert alert.evidence["context_needed_tokens"] == 2048
    assert alert.evidence["kv_extra_bytes"] == GEMMA_KV_2048 - GEMMA_KV_256 == 9_437_184
    assert alert.fix.startswith("-c 2048 needs +9.4 MB of KV cache (f16): it fits (20.0 GB of RAM free).")
    assert alert.fix_commands == ("llama-server -c 2048",)


def test_a_refused_prompt_with_max_tokens_and_four_slots() -> None:
    ticks = Ticks()
    # 402 + 8 = 410 → 1,024 tokens a slot; -c is shared by the 4 slots: 4 × 1,024 = 4,096.
    ticks.tick(llama_reading(rejected(1, max_tokens=8), slots=4), CPU_HOST)
    (alert,) = ticks.overflow_alerts()
    assert "(-c 1024)" in alert.message  # 4 slots of 256
    assert alert.evidence["kv_extra_bytes"] == 4 * (GEMMA_KV_1024 - GEMMA_KV_256) == 25_165_824
    assert alert.fix.startswith("-c 4096 needs +25.2 MB of KV cache (f16) for its 4 slots: it fits")
    assert alert.fix_commands == ("llama-server -c 4096 -np 4",)
    # llama-server without -np runs 4 slots over one shared cache of -c (checked on the real build)
    assert alert.fix.endswith("Without -np (4 slots sharing one cache), -c 1024 alone is enough.")


def test_the_grouped_query_attention_kv_cost_by_hand() -> None:
    # Llama-3.1-8B: 32 layers × 8 KV heads × (128 + 128) = 65,536 elements = 131,072 B a token (f16).
    assert KV_8B.full_elems_per_token == 32 * 8 * (128 + 128)
    record = at(1, model="llama3.1:8b", http_status=400, prompt_tokens_sent=9000, prompt_sent_exact=True,
                context_limit_tokens=8192, max_tokens_requested=1000)  # fmt: skip
    ticks = Ticks()
    ticks.tick(ollama_reading(record, n_ctx=8192), hardware(10_000_000_000))
    (alert,) = ticks.overflow_alerts()
    # 9,000 + 1,000 = 10,000 → 10,240 tokens: (10,240 − 8,192) × 131,072 = 268,435,456 B.
    assert alert.evidence["kv_extra_bytes"] == 268_435_456


def test_a_q8_kv_cache_halves_the_cost() -> None:
    ticks = Ticks()
    hw = CPU_HOST
    machine = replace(resolve_machine(hw), kv_type="q8_0")
    out = ticks.pipeline.process([llama_reading(rejected(1))], hw, {}, machine, 1.0, WALL0 + 1)
    (alert,) = [a for a in out.snapshot.alerts if a.kind == "context_overflow"]
    # q8_0 stores 34 bytes per 32 elements (1.0625 B an element): 9,437,184 / 2 × 1.0625 = 5,013,504 B.
    assert alert.evidence["kv_extra_bytes"] == 5_013_504
    assert "(q8_0)" in alert.fix


# --------------------------------------------------------------------------- cut short


def test_an_answer_cut_at_the_context_end() -> None:
    # tests/fixtures/llama-server/chat_completion_context_end.json: prompt 224 + answer 32 = 256 = n_ctx,
    # finish_reason "length" with max_tokens 200 not reached.
    cut = at(1, model=GEMMA_NAME, source="proxy", http_status=200, prompt_tokens=224, decode_tokens=32,
             context_tokens=256, stop_reason="length", max_tokens_requested=200)  # fmt: skip
    ticks = Ticks()
    ticks.tick(llama_reading(cut), CPU_HOST)
    (alert,) = ticks.overflow_alerts()
    assert alert.evidence["cause"] == "cut_short"
    assert alert.message.startswith(
        "llama-server stopped an answer after 32 tokens: "
        "the prompt and the answer filled the 256-token context"
    )
    assert alert.evidence["context_needed_tokens"] == 1024  # 224 + 200 = 424 → 1,024


def test_an_answer_that_reached_its_own_max_tokens_is_not_cut_short() -> None:
    full = RequestRecord(
        server=LLAMA_URL, server_kind="llamacpp", model=GEMMA_NAME, finished_wall_s=WALL0, session_id=None,
        exact=True, prompt_tokens=56, decode_tokens=200, context_tokens=256, stop_reason="length",
        max_tokens_requested=200,
    )  # fmt: skip
    assert overflow_of(full, 256) is None
    assert overflow_of(replace(full, context_tokens=200, max_tokens_requested=None), 256) is None
    # with --context-shift llama-server says truncated of an answer that shifted and reached n_predict
    shifted = replace(full, stop_reason="context", decode_tokens=200, max_tokens_requested=200)
    assert overflow_of(shifted, 256) is None
    context_said = replace(full, stop_reason="context", decode_tokens=54, max_tokens_requested=None)
    overflow = overflow_of(context_said, 256)  # llama-server /completion's `truncated: true`
    assert overflow is not None and overflow.cause == "cut_short"


# --------------------------------------------------------------------------- one episode, one cause


def test_the_episode_ends_when_a_request_fits() -> None:
    ok = at(5, model=GEMMA_NAME, source="proxy", http_status=200, prompt_tokens=20, decode_tokens=8,
            context_tokens=28, stop_reason="stop")  # fmt: skip
    ticks = Ticks()
    ticks.tick(llama_reading(rejected(1)), CPU_HOST)
    ticks.tick(llama_reading(rejected(2, sent=500)), CPU_HOST)
    ticks.tick(llama_reading(), CPU_HOST)
    snap = ticks.tick(llama_reading(ok), CPU_HOST)
    alerts = ticks.overflow_alerts()
    assert len({a.id for a in alerts}) == 1 and len(alerts) == 3
    assert alerts[-1].evidence["tokens_sent"] == 500  # the latest numbers, the most needed
    assert alerts[-1].evidence["context_needed_tokens"] == 2048  # max(402, 500) + 1,024 → 2,048
    assert [a.kind for a in snap.ended_alerts] == ["context_overflow"]


def test_context_full_gives_way_to_the_overflow() -> None:
    busy = SlotReading(slot_id=0, is_processing=True, n_decoded=20, context_tokens=250, n_ctx=256)
    cut = at(
        1, model=GEMMA_NAME, prompt_tokens=230, decode_tokens=26, context_tokens=256, stop_reason="context"
    )
    reading = llama_reading(cut)
    (model,) = reading.models
    reading = replace(reading, models=(replace(model, slots=(busy,)),))
    alone = Ticks().tick(replace(reading, finished=()), CPU_HOST)  # 250 of 256: 98 % full
    assert {a.kind for a in alone.alerts} == {"context_full"}
    ticks = Ticks()
    snap = ticks.tick(reading, CPU_HOST)
    assert {a.kind for a in snap.alerts} == {"context_overflow"}


def test_a_reload_with_the_needed_context_ends_it() -> None:
    ticks = Ticks()
    ticks.tick(llama_reading(rejected(1)), CPU_HOST)
    snap = ticks.tick(llama_reading(n_ctx=2048), CPU_HOST)
    assert snap.alerts == () and [a.kind for a in snap.ended_alerts] == ["context_overflow"]


@pytest.mark.parametrize("status", [401, 404, 429])
def test_other_client_errors_are_no_overflow(status: int) -> None:
    ticks = Ticks()
    ticks.tick(llama_reading(at(1, model=GEMMA_NAME, http_status=status)), CPU_HOST)
    assert ticks.overflow_alerts() == []


def test_a_proxied_ollama_keeps_the_logs_exact_count_and_stores_one_row() -> None:
    log_record = at(
        1, model="llama3.1:8b", source="ollama-log", prompt_tokens=4096, prompt_tokens_sent=7268,
        prompt_sent_exact=True, context_limit_tokens=4096,
    )  # fmt: skip
    # The same request as the proxy saw it when it ended: prompt_eval_count 4,096, ~7,700 estimated.
    proxy_record = at(
        9, model="llama3.1:8b", source="proxy", http_status=200, prompt_tokens=4096, decode_tokens=120,
        prompt_tokens_sent=7700, prompt_sent_exact=False, stop_reason="stop",
    )  # fmt: skip
    hw = hardware(10_000_000_000)
    ticks = Ticks()
    first = ticks.tick(replace(ollama_reading(log_record), proxied=True), hw)
    assert first.requests == ()  # the proxy stores the request: the log line only informs the alert
    last = ticks.tick(replace(ollama_reading(proxy_record), proxied=True), hw)
    assert [r.source for r in last.requests] == ["proxy"]
    alerts = ticks.overflow_alerts()
    assert len({a.id for a in alerts}) == 1
    assert alerts[-1].evidence["tokens_sent"] == 7268 and alerts[-1].evidence["tokens_sent_exact"] is True


def test_an_unproxied_ollamas_log_line_is_the_requests_record() -> None:
    log_record = at(
        1, model="llama3.1:8b", source="ollama-log", prompt_tokens=4096, prompt_tokens_sent=7268,
        prompt_sent_exact=True, context_limit_tokens=4096,
    )  # fmt: skip
    snap = Ticks().tick(ollama_reading(log_record), hardware(10_000_000_000))
    (row,) = snap.requests
    assert (row.source, row.prompt_tokens_sent, row.prompt_tokens, row.context_limit_tokens) == (
        "ollama-log",
        7268,
        4096,
        4096,
    )


def test_a_routers_fix_goes_in_its_preset() -> None:
    ticks = Ticks()
    ticks.tick(replace(llama_reading(rejected(1)), router=True), CPU_HOST)
    (alert,) = ticks.overflow_alerts()
    # a router's settings per model are lines of its --models-preset file (long flags without dashes)
    assert alert.fix_commands == (
        "ctx-size = 2048",
        f"llama-server --models-preset <file> (section [{GEMMA_NAME}])",
    )


def test_the_logs_exact_count_replaces_the_proxys_estimate_that_came_first() -> None:
    # a quick request: the proxy's record (~9,000 estimated) lands a tick before the log's line (7,268)
    proxy_record = at(
        1, model="llama3.1:8b", source="proxy", http_status=200, prompt_tokens=4096, decode_tokens=12,
        prompt_tokens_sent=9000, prompt_sent_exact=False, stop_reason="stop",
    )  # fmt: skip
    log_record = at(
        1, model="llama3.1:8b", source="ollama-log", prompt_tokens=4096, prompt_tokens_sent=7268,
        prompt_sent_exact=True, context_limit_tokens=4096,
    )  # fmt: skip
    hw = hardware(10_000_000_000)
    ticks = Ticks()
    ticks.tick(replace(ollama_reading(proxy_record), proxied=True), hw)
    ticks.tick(replace(ollama_reading(log_record), proxied=True), hw)
    alerts = ticks.overflow_alerts()
    assert len({a.id for a in alerts}) == 1
    assert alerts[0].evidence["context_needed_tokens"] == 10_240  # ~9,000 + 1,024 = 10,024 → 10,240
    assert alerts[-1].evidence["tokens_sent"] == 7268 and alerts[-1].evidence["tokens_sent_exact"] is True
    assert alerts[-1].evidence["context_needed_tokens"] == 9216  # 7,268 + 1,024 = 8,292 → 9,216
