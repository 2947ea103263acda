"""The proxy's prompt lengths put beside llama-server's polled prefill (core/rate_helpers.py), and
what the proxy counts (services/proxy/prompt_length.py's pure rules). Values by hand."""

from __future__ import annotations

from trayapp.core.model import ModelReading, ServerReading, SlotReading
from trayapp.core.rate_helpers import with_prompt_totals
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.services.proxy.prompt_length import _text_only, counts_prompts


def _prefilling(slot_id: int, processed: int, cached: int = 0) -> SlotReading:
    return SlotReading(
        slot_id, True, task_id=slot_id + 10, n_decoded=0, prompt_tokens_processed=processed,
        prompt_tokens_cached=cached,
    )  # fmt: skip


def _reading(*models: ModelReading) -> ServerReading:
    return ServerReading(kind="llamacpp", url="http://127.0.0.1:8080", status="ok", models=models)


def _totals(reading: ServerReading) -> list[list[int | None]]:
    return [[s.prompt_tokens_total for s in m.slots] for m in reading.models]


def test_one_prompt_being_read_takes_the_one_total_whatever_name_the_client_used() -> None:
    reading = _reading(ModelReading("gemma", slots=(_prefilling(0, 512, 256), SlotReading(1, False))))
    assert _totals(with_prompt_totals(reading, [("gpt-4o", 28_000)])) == [[28_000, None]]


def test_two_prompts_pair_smallest_with_smallest() -> None:
    reading = _reading(ModelReading("m", slots=(_prefilling(0, 4_000), _prefilling(1, 100))))
    assert _totals(with_prompt_totals(reading, [(None, 9_000), (None, 2_000)])) == [[9_000, 2_000]]


def test_no_total_when_the_counts_disagree_or_a_total_is_short() -> None:
    one_slot = _reading(ModelReading("m", slots=(_prefilling(0, 64),)))
    assert _totals(with_prompt_totals(one_slot, [(None, 2_000), (None, 3_000)])) == [[None]]
    two_slots = _reading(ModelReading("m", slots=(_prefilling(0, 64), _prefilling(1, 64))))
    assert _totals(with_prompt_totals(two_slots, [(None, 2_000)])) == [[None, None]]
    # 1,000 read + 500 cached is past a 1,200-token total: not this prompt's count.
    past = _reading(ModelReading("m", slots=(_prefilling(0, 1_000, 500),)))
    assert _totals(with_prompt_totals(past, [(None, 1_200)])) == [[None]]


def test_decoding_slots_and_no_totals_are_left_alone() -> None:
    decoding = SlotReading(0, True, n_decoded=5, prompt_tokens_processed=2_000)
    reading = _reading(ModelReading("m", slots=(decoding,)))
    assert _totals(with_prompt_totals(reading, [(None, 2_000)])) == [[None]]
    assert with_prompt_totals(reading, []) is reading


def test_a_router_gives_each_model_the_totals_that_name_it() -> None:
    reading = _reading(
        ModelReading("alpha", slots=(_prefilling(0, 64),)),
        ModelReading("beta", slots=(_prefilling(0, 128),)),
        ModelReading("gamma", loaded=False),
    )
    totals = [("beta", 5_000), ("alpha", 3_000)]
    assert _totals(with_prompt_totals(reading, totals)) == [[3_000], [5_000], []]
    # A name the router does not list goes nowhere (two models are loaded: no guessing).
    assert _totals(with_prompt_totals(reading, [("delta", 5_000)])) == [[None], [None], []]


def test_the_inbox_holds_a_prompt_only_until_it_ends() -> None:
    inbox = RecordInbox(["http://127.0.0.1:8080"])
    inbox.prompt_started(1, "http://localhost:8080", "m", 2_000)
    inbox.prompt_started(2, "http://127.0.0.1:9090", None, 50)
    assert inbox.prompt_totals("http://127.0.0.1:8080") == [("m", 2_000)]
    inbox.prompt_ended(1)
    inbox.prompt_ended(1)  # twice is harmless
    assert inbox.prompt_totals("http://127.0.0.1:8080") == []


def test_what_the_proxy_counts() -> None:
    assert counts_prompts("llamacpp", "openai-chat")
    assert counts_prompts("llamacpp", "llamacpp-completion")
    assert not counts_prompts("ollama", "ollama-chat")  # Ollama has no tokenize endpoint
    assert not counts_prompts("llamacpp", "openai-responses")
    assert not counts_prompts("llamacpp", None)
    assert _text_only([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert _text_only([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert not _text_only([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    assert not _text_only([])
    assert not _text_only("hi")
