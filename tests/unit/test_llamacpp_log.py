"""llama-server's log (#20): parsing the lines captured from the real binary in every format it writes
(tests/fixtures/llama-server/log/), the records they become against the server's own answers for the
same requests, where a process's log is found (real child processes: a file, a pipe, /dev/null,
--log-file relative to the working directory, --log-jsonl), and the probe's use of it."""

from __future__ import annotations

import pytest

from tests.support.llamacpp_log import EXPECTED, N_CTX, RESPONSES, log_text
from tests.support.paths import FIXTURES_DIR
from trayapp.sources.llamacpp_log import (
    LOG_SOURCE,
    EvalLine,
    LogRecords,
    RefusalLine,
    ReleaseLine,
    cut_at_context_end,
    parse_log_line,
    parse_log_lines,
)
from trayapp.sources.llamacpp_log_location import log_options

CAPTURED = FIXTURES_DIR / "llama-server" / "captured"


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "name", ["stderr_default.log", "stderr_colors.log", "stdout_jsonl.log", "stderr_no_prefix.log"]
)
def test_every_format_the_server_writes_reads_the_same(name: str) -> None:
    assert parse_log_lines(log_text(name)) == EXPECTED


def test_the_refusal_holds_the_numbers_of_the_400_body() -> None:
    body = RESPONSES["plain"]["refused_400_body"]["error"]
    (refusal,) = [
        line for line in parse_log_lines(log_text("stderr_default.log")) if isinstance(line, RefusalLine)
    ]
    assert (refusal.prompt_tokens, refusal.context_tokens) == (body["n_prompt_tokens"], body["n_ctx"])


def test_records_equal_the_servers_own_numbers_for_the_same_requests() -> None:
    answer = RESPONSES["plain"]["filling_answer"]
    timings = answer["timings"]
    assert answer["truncated"] is True
    records = LogRecords().records(parse_log_lines(log_text("stderr_default.log")), "gemma", N_CTX, 1000.0)
    refused, cut = records  # "hello" (truncated = 0) is no record
    body = RESPONSES["plain"]["refused_400_body"]["error"]
    assert refused.source == LOG_SOURCE and refused.model == "gemma" and refused.finished_wall_s == 1000.0
    assert refused.http_status == 400 and refused.prompt_sent_exact
    assert (refused.prompt_tokens_sent, refused.context_limit_tokens) == (
        body["n_prompt_tokens"],
        body["n_ctx"],
    )
    assert cut.source == LOG_SOURCE and cut.stop_reason == "context" and cut.http_status is None
    filled = timings["prompt_n"] + timings["cache_n"] + timings["predicted_n"]
    assert cut.context_tokens == filled == answer["tokens_cached"] + 1 == N_CTX
    assert cut.decode_tokens == timings["predicted_n"] == answer["tokens_predicted"]
    assert cut.context_limit_tokens == N_CTX
    assert cut.prompt_tokens is None and cut.prompt_tokens_sent is None  # the log says neither


def test_a_context_shift_is_no_cut() -> None:
    answer = RESPONSES["shift"]["filling_answer"]
    assert answer["truncated"] is True and answer["tokens_predicted"] == 200  # all it asked for: not cut
    lines = parse_log_lines(log_text("stderr_context_shift.log"))
    (shifted,) = [line for line in lines if isinstance(line, ReleaseLine) and line.truncated]
    assert shifted.n_tokens == answer["tokens_cached"] < N_CTX - 1
    assert not cut_at_context_end(shifted, N_CTX)
    records = LogRecords().records(lines, "gemma", N_CTX, 0.0)
    assert [r.http_status for r in records] == [400]


def test_two_slots_each_with_its_own_context() -> None:
    lines = parse_log_lines(log_text("stderr_two_slots.log"))
    assert lines[0] == RefusalLine(0, 402, 256)
    assert ReleaseLine(slot_id=1, task_id=0, n_tokens=0, truncated=False) in lines
    records = LogRecords().records(lines, "gemma", 256, 0.0)  # /props n_ctx is per slot
    assert [(r.http_status, r.context_tokens, r.decode_tokens) for r in records] == [
        (400, None, None),
        (None, 256, 54),
    ]


def test_errors_only_logs_refusals_only() -> None:
    assert parse_log_lines(log_text("stderr_lv1.log")) == [RefusalLine(0, 402, 256)]


def test_a_routers_lines_name_the_child_by_its_port() -> None:
    lines = parse_log_lines(log_text("router_stdout.log"))
    assert lines == [
        RefusalLine(0, 402, 256, port=33329),
        ReleaseLine(0, 0, 0, False, port=33329),
        EvalLine(0, 0, 54, port=60305),
        ReleaseLine(0, 0, 255, True, port=60305),
    ]
    assert parse_log_lines(log_text("router_stderr.log")) == []  # the router's own lines


def test_an_answers_length_read_a_poll_before_its_release() -> None:
    lines = parse_log_lines(log_text("stderr_default.log"))
    records = LogRecords()
    assert records.records(lines[:3], "m", N_CTX, 0.0)[0].http_status == 400  # up to the eval line
    (cut,) = records.records(lines[3:4], "m", N_CTX, 1.0)
    assert cut.decode_tokens == 54 and cut.context_tokens == 256
    assert records.records([ReleaseLine(0, 9, 255, True)], "m", N_CTX, 2.0)[0].decode_tokens is None
    assert records.records([ReleaseLine(0, 9, 255, True)], "m", None, 2.0) == ()  # no context known


@pytest.mark.parametrize(
    "line",
    [
        # at -v the server logs requests: a prompt quoting the messages is not one
        'D srv  log_server_r: request: {"prompt": "srv    send_error: task id = 0, error: request (9 tokens)'
        ' exceeds the available context size (8 tokens)"}',
        "0.00.001.000 I srv  log_server_r: slot      release: id  0 | task 3 | stop processing: "
        "n_tokens = 255, truncated = 1",
        "0.01.257.794 E srv    send_error: task id = 0, error: Prompt contains invalid tokens",
        '{"type":"log","time":1,"level":"info","msg":"hello"}',
        "{not json at all: srv    send_error: task id = 0",
        "",
    ],
)
def test_lines_of_other_forms_are_nothing(line: str) -> None:
    assert parse_log_line(line) is None


def test_an_embedding_refusal_reads_too() -> None:
    line = (
        "0.00.100.000 E srv    send_error: task id = 7, error: input (9000 tokens) is larger than the max "
        "context size (8192 tokens). skipping"
    )
    assert parse_log_line(line) == RefusalLine(7, 9000, 8192)


# --------------------------------------------------------------------------- where the log is


def test_log_options_last_wins_and_the_environment_below() -> None:
    argv = [
        "llama-server",
        "--log-file",
        "a.log",
        "--log-file=b.log",
        "--log-jsonl",
        "--no-log-jsonl",
        "-lv",
        "1",
    ]
    options = log_options(argv, {"LLAMA_ARG_LOG_FILE": "env.log", "LLAMA_ARG_LOG_JSONL": "1"})
    assert (options.log_file, options.jsonl, options.disabled, options.verbosity) == (
        "b.log",
        False,
        False,
        1,
    )
    env_only = log_options(["llama-server"], {"LLAMA_ARG_LOG_FILE": "env.log", "LLAMA_ARG_LOG_JSONL": "true"})
    assert (env_only.log_file, env_only.jsonl) == ("env.log", True)
    assert log_options(["llama-server", "--log-disable", "-v", "-lv", "0"], {}).disabled
