"""The recording proxy's tap reads whether a request fit its context (#20), from real llama-server
answers (captured from the build the tests use, n_ctx 256: tests/fixtures/llama-server/) and from
vLLM's and Ollama's documented shapes. Expected numbers are read from the fixture files (json) or
worked by hand, never from the code under test."""

from __future__ import annotations

import json
from typing import Any

from tests.support.paths import TESTS_DIR
from trayapp.cli.proxy import record_line
from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.recorder import RequestTap
from trayapp.sources.servers.lms_cli import parse_lms_log_line

LLAMA = TESTS_DIR / "fixtures" / "llama-server"
T0 = 1000.0


def record_of(
    path: str,
    request: dict[str, Any],
    body: bytes,
    *,
    status: int = 200,
    content_type: str = "application/json",
    server_kind: str = "llamacpp",
    pieces: int = 1,
) -> FinishedRequest:
    tap = RequestTap(server_kind=server_kind, method="POST", path=path, started_mono_s=T0, started_wall_s=5e9)
    tap.request_body(json.dumps(request).encode())
    tap.response_head(status, {"content-type": content_type}, T0 + 0.5)
    step = max(1, len(body) // pieces)
    for i in range(0, len(body), step):  # split anywhere, as TCP reads do
        tap.response_body(body[i : i + step], T0 + 1 + i / 1e6)
    record = tap.finish(now_mono_s=T0 + 60, now_wall_s=5e9 + 60, aborted=False)
    assert record is not None
    return record


def test_a_refusal_keeps_the_servers_two_numbers() -> None:
    body = (LLAMA / "exceed_context_400.json").read_bytes()
    error = json.loads(body)["error"]
    for pieces in (1, 7):
        record = record_of("/completion", {"prompt": "x", "n_predict": 8}, body, status=400, pieces=pieces)
        assert record.http_status == 400
        assert record.prompt_tokens_sent == error["n_prompt_tokens"] == 402
        assert record.context_limit_tokens == error["n_ctx"] == 256
        assert record.prompt_sent_exact is True
        assert record.max_tokens_requested == 8


def test_a_completion_that_ran_out_of_context_says_so() -> None:
    body = (LLAMA / "completion_context_end.json").read_bytes()
    doc = json.loads(body)
    assert doc["truncated"] is True and doc["stop_type"] == "limit"
    for pieces in (1, 13):
        record = record_of("/completion", {"prompt": "x", "n_predict": 200}, body, pieces=pieces)
        assert record.stop_reason == "context"
        t = doc["timings"]
        assert record.context_tokens == t["prompt_n"] + t["cache_n"] + t["predicted_n"] == 256


def test_an_openai_answer_cut_by_the_context_is_a_length_stop_below_max_tokens() -> None:
    body = (LLAMA / "chat_completion_context_end.json").read_bytes()
    doc = json.loads(body)
    assert doc["choices"][0]["finish_reason"] == "length"
    request = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 200}
    for pieces in (1, 5):
        record = record_of("/v1/chat/completions", request, body, pieces=pieces)
        assert record.stop_reason == "length"
        assert record.max_tokens_requested == 200
        assert record.decode_tokens == doc["usage"]["completion_tokens"] == 32
        assert record.context_tokens == doc["usage"]["total_tokens"] == 256


def test_a_streamed_answer_cut_by_the_context() -> None:
    body = (LLAMA / "chat_stream_context_end.sse").read_bytes()
    last = next(
        json.loads(line[6:])
        for line in reversed(body.split(b"\n"))
        if line.startswith(b"data: {") and b'"finish_reason":"length"' in line
    )
    t = last["timings"]
    request = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 200, "stream": True}
    for pieces in (1, 29):
        record = record_of(
            "/v1/chat/completions", request, body, content_type="text/event-stream", pieces=pieces
        )
        assert record.stop_reason == "length"
        assert record.decode_tokens == t["predicted_n"] == 30
        assert record.context_tokens == t["prompt_n"] + t["cache_n"] + t["predicted_n"] == 256


def test_a_stop_word_inside_generated_text_is_not_read_as_the_stop_reason() -> None:
    text = 'the API said "finish_reason":"length" and "truncated":true'
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in (chunk, final)) + b"data: [DONE]\n\n"
    )
    request = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    record = record_of("/v1/chat/completions", request, body, content_type="text/event-stream")
    assert record.stop_reason == "stop"


def test_vllm_refusal_message_gives_both_numbers() -> None:
    # vLLM's serving_engine validation message (an OpenAI-style error object)
    message = (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). "
        "Please reduce the length of the messages or completion."
    )
    body = json.dumps(
        {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
    ).encode()
    record = record_of("/v1/chat/completions", {"messages": []}, body, status=400, server_kind="vllm")
    assert record.context_limit_tokens == 4096 and record.prompt_tokens_sent == 4000


def test_ollama_prompt_is_estimated_from_its_text_and_tools() -> None:
    messages = [{"role": "system", "content": "a" * 1000}, {"role": "user", "content": "b" * 3000}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    tools_chars = len(json.dumps(tools, separators=(",", ":")))  # 61
    final = {
        "model": "llama3.1:8b", "done": True, "done_reason": "stop", "prompt_eval_count": 900,
        "prompt_eval_duration": 10**9, "eval_count": 10, "eval_duration": 10**9,
    }  # fmt: skip
    request = {"model": "llama3.1:8b", "messages": messages, "tools": tools, "options": {"num_predict": 64}}
    body = json.dumps(final).encode() + b"\n"
    record = record_of("/api/chat", request, body, content_type="application/x-ndjson", server_kind="ollama")
    # every string of the messages (1,000 + 3,000, and the roles "system" and "user": 10) and the tool
    # schema (61): 4,071 characters ÷ 4 ≈ 1,018 tokens
    assert record.prompt_tokens_sent == round((1000 + 3000 + 10 + tools_chars) / 4) == 1018
    assert record.prompt_sent_exact is False
    assert record.prompt_tokens == 900 and record.max_tokens_requested == 64
    assert record.stop_reason == "stop"


def test_no_text_is_kept_on_the_tap() -> None:
    secret = "canary-4f2e prompt text"
    tap = RequestTap(
        server_kind="ollama", method="POST", path="/api/chat", started_mono_s=T0, started_wall_s=5e9
    )
    tap.request_body(json.dumps({"messages": [{"role": "user", "content": secret}]}).encode())
    tap.response_head(400, {"content-type": "application/json"}, T0)
    tap.response_body(json.dumps({"error": secret}).encode(), T0)
    record = tap.finish(now_mono_s=T0 + 1, now_wall_s=5e9 + 1, aborted=False)
    assert record is not None
    assert secret not in repr(vars(tap)) and secret not in repr(record)


def test_lm_studio_says_when_the_context_stopped_an_answer() -> None:
    # reference/backends.md: `stats.stop_reason` is one of eosFound, stopStringFound,
    # maxPredictedTokensReached, userStopped, contextLengthReached, modelUnloaded, failed, toolCalls.
    fixture = TESTS_DIR / "fixtures" / "lmstudio" / "api_v0_chat_completion.json"
    doc = json.loads(fixture.read_bytes())
    expected = {"contextLengthReached": "context", "maxPredictedTokensReached": "length", "eosFound": "stop"}
    for word, reason in expected.items():
        doc["stats"]["stop_reason"] = word
        record = record_of("/api/v0/chat/completions", {"messages": []}, json.dumps(doc).encode(),
                           server_kind="lmstudio")  # fmt: skip
        assert record.stop_reason == reason
    line = (TESTS_DIR / "fixtures" / "lmstudio" / "lms_log_stream.ndjson").read_text().splitlines()[1]
    event = json.loads(line)
    event["data"]["stats"]["stopReason"] = "contextLengthReached"
    logged = parse_lms_log_line(json.dumps(event))
    assert logged is not None and logged.stop_reason == "context"


def test_the_proxy_command_line_says_what_did_not_fit() -> None:
    body = (LLAMA / "exceed_context_400.json").read_bytes()
    refused = record_of("/completion", {"prompt": "x"}, body, status=400)
    assert record_line(refused).endswith("refused: a 402-token prompt, the context holds 256")
    cut = record_of("/completion", {"prompt": "x"}, (LLAMA / "completion_context_end.json").read_bytes())
    assert record_line(cut).endswith("cut short: the context is full")


def test_a_context_shift_that_ended_the_answer_normally_is_no_context_stop() -> None:
    doc = json.loads((LLAMA / "completion_context_end.json").read_bytes())
    doc["stop_type"] = "eos"  # --context-shift: the context shifted (truncated) and the model ended it
    record = record_of("/completion", {"prompt": "x"}, json.dumps(doc).encode())
    assert record.stop_reason == "stop"


def test_the_proxy_naming_the_status_at_the_end_keeps_the_upstreams_body() -> None:
    # services/proxy/server.py names a 400 or 502 status again when it records the exchange
    tap = RequestTap(
        server_kind="llamacpp", method="POST", path="/completion", started_mono_s=T0, started_wall_s=5e9
    )
    tap.request_body(b'{"prompt": "x", "n_predict": 8}')
    tap.response_head(400, {"content-type": "application/json"}, T0)
    tap.response_body((LLAMA / "exceed_context_400.json").read_bytes(), T0)
    tap.response_head(400, {}, T0 + 1)
    record = tap.finish(now_mono_s=T0 + 1, now_wall_s=5e9 + 1, aborted=False)
    assert record is not None
    assert (record.http_status, record.prompt_tokens_sent, record.context_limit_tokens) == (400, 402, 256)
