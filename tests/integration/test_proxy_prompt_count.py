"""The prompt counter through the real proxy (issue #26), against a fake that answers llama-server's
`/apply-template` and `/tokenize` (tests/support/fake_streaming.py, at the real server's measured
pace): a prompt longer than one batch is counted and its record holds the count; a short one costs
the server no request at all (the count would show no progress: limits.COUNT_PROMPT_FROM_BYTES).
The real server's count is tests/integration/test_prefill_proxy.py's."""

from __future__ import annotations

import httpx

from tests.support.fake_streaming import FakeStreamingUpstream
from tests.support.proxy import running_proxy
from trayapp.services.proxy import limits
from trayapp.services.proxy.inbox import RecordInbox

PREFILL_S = 3.0  # the fake's prompt reading: the count (a few ms of two requests) is done long before


def _chat(url: str, content: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": True}
    with httpx.Client(trust_env=False, timeout=60) as client:
        response = client.post(url + "/v1/chat/completions", json=body)
        assert response.status_code == 200 and "[DONE]" in response.text


def test_a_long_prompt_is_counted_and_a_short_one_costs_no_request() -> None:
    short, long = "word " * 100, "word " * 3000
    assert len(short) < limits.COUNT_PROMPT_FROM_BYTES < len(long)
    knobs = {"tokens": 3, "prefill_delay_s": PREFILL_S, "token_delay_s": 0.01, "answers_counts": True}
    with (
        FakeStreamingUpstream("vllm", **knobs) as fake,  # type: ignore[arg-type]
        running_proxy(fake.url, "llamacpp", prompts=RecordInbox([fake.url])) as proxy,
    ):
        _chat(proxy.url, short)
        first = proxy.records.wait_for(1, timeout_s=30)[0]
        assert [c.path for c in fake.captures] == ["/v1/chat/completions"]  # no count for it
        _chat(proxy.url, long)
        second = proxy.records.wait_for(2, timeout_s=30)[1]
        paths = [c.path for c in fake.captures]
    assert sorted(paths[1:]) == ["/apply-template", "/tokenize", "/v1/chat/completions"]  # in any order
    assert first.prompt_tokens_sent is None  # never guessed for llama-server
    templated = len("<|user|>") + len(long) + len("<|assistant|>")  # the fake's template
    assert (second.prompt_tokens_sent, second.prompt_sent_exact) == (templated // 4, True)
