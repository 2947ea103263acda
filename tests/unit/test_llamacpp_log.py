"""llama-server's log (#20): parsing the lines captured from the real binary in every format it writes
(tests/fixtures/llama-server/log/), the records they become against the server's own answers for the
same requests, where a process's log is found (real child processes: a file, a pipe, /dev/null,
--log-file relative to the working directory, --log-jsonl), and the probe's use of it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.fake_servers import FakeHttpServer, Reply, wait_until
from tests.support.paths import FIXTURES_DIR
from trayapp.sources.llamacpp_log import (
    LOG_SOURCE,
    EvalLine,
    LlamaLogReader,
    LogFile,
    LogRecords,
    RefusalLine,
    ReleaseLine,
    cut_at_context_end,
    locate_log,
    log_options,
    parse_log_line,
    parse_log_lines,
)
from trayapp.sources.servers.llamacpp import LlamaCppProbe

LOGS = FIXTURES_DIR / "llama-server" / "log"
CAPTURED = FIXTURES_DIR / "llama-server" / "captured"
RESPONSES = json.loads((LOGS / "responses.json").read_text())
N_CTX = 256


def log_text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- parsing


EXPECTED = [
    RefusalLine(task_id=0, prompt_tokens=402, context_tokens=256),
    ReleaseLine(slot_id=0, task_id=0, n_tokens=0, truncated=False),
    EvalLine(slot_id=0, task_id=3, tokens=54),
    ReleaseLine(slot_id=0, task_id=3, n_tokens=255, truncated=True),
    EvalLine(slot_id=0, task_id=59, tokens=4),
    ReleaseLine(slot_id=0, task_id=59, n_tokens=5, truncated=False),
]


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


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts a real stand-in process (python sleeping, its argv[0] "llama-server") with the given
    argv tail and streams."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, argv0: str = "llama-server", **streams: Any) -> subprocess.Popen[bytes]:
        argv = [argv0, "-c", "import time; time.sleep(60)", *args]
        process = subprocess.Popen(
            argv, executable=sys.executable, stdin=subprocess.DEVNULL, cwd=tmp_path, **streams
        )
        started.append(process)
        # Popen returns once the child's exec began; its argv shows in /proc a moment later
        wait_until(lambda: psutil.Process(process.pid).cmdline()[1:] == argv[1:], 10.0)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc (Linux)")


@needs_proc
def test_its_stderr_when_a_file(spawn: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    with open(tmp_path / "server.log", "ab") as log:
        process = spawn(stderr=log)
    found = locate_log(process.pid)
    assert found == LogFile(tmp_path / "server.log", f"its stderr, {tmp_path / 'server.log'}")


@needs_proc
def test_its_stdout_with_jsonl(spawn: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    with open(tmp_path / "out.jsonl", "ab") as out:
        process = spawn("--log-jsonl", stdout=out, stderr=subprocess.DEVNULL)
    assert locate_log(process.pid).path == tmp_path / "out.jsonl"


@needs_proc
@pytest.mark.parametrize(
    ("streams", "what"),
    [
        ({"stderr": subprocess.PIPE}, "which is a pipe"),
        ({"stderr": subprocess.DEVNULL}, "/dev/null (discarded)"),
    ],
)
def test_a_stderr_it_cannot_read_says_so(
    spawn: Callable[..., subprocess.Popen[bytes]], streams: dict[str, int], what: str
) -> None:
    process = spawn(**streams)
    found = locate_log(process.pid)
    assert found.path is None and found.why is not None
    assert what in found.why and f"(pid {process.pid})" in found.why and "--log-file PATH" in found.why


def test_log_file_relative_to_its_working_directory(
    spawn: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    process = spawn("--log-file", "logs/server.log", stderr=subprocess.DEVNULL)
    found = locate_log(process.pid)
    assert found.path == tmp_path / "logs" / "server.log" and found.why is None
    assert found.where == f"--log-file {tmp_path / 'logs' / 'server.log'}"


def test_log_disable_and_verbosity(spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    disabled = locate_log(spawn("--log-disable", stderr=subprocess.DEVNULL).pid)
    assert disabled.path is None and disabled.why == "llama-server runs with --log-disable: it writes no log"
    quiet = locate_log(spawn("--log-file", "x.log", "-lv", "1", stderr=subprocess.DEVNULL).pid)
    assert quiet.note is not None and "not answers cut short" in quiet.note


def test_a_process_that_is_not_llama_server(spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    process = spawn(argv0="docker-proxy", stderr=subprocess.DEVNULL)
    found = locate_log(process.pid)
    assert found.path is None and found.why is not None
    assert f"(pid {process.pid}, docker-proxy) is not llama-server itself" in found.why


def test_a_process_gone_and_an_os_without_proc(spawn: Callable[..., subprocess.Popen[bytes]]) -> None:
    process = spawn(stderr=subprocess.DEVNULL)
    other_os = locate_log(process.pid, platform="win32")
    assert (
        other_os.path is None
        and other_os.why is not None
        and "only llama-server's --log-file" in other_os.why
    )
    process.kill()
    process.wait()
    gone = locate_log(process.pid)
    assert gone.path is None and gone.why == f"llama-server (pid {process.pid}) is gone"


# --------------------------------------------------------------------------- the reader


def test_the_reader_locates_once_per_pid_and_reads_from_the_end(tmp_path: Path) -> None:
    first, second = tmp_path / "one.log", tmp_path / "two.log"
    first.write_text("history: " + log_text("stderr_default.log"))
    second.write_text("")
    located: list[int] = []

    def locate(pid: int) -> LogFile:
        located.append(pid)
        return LogFile(first if pid == 1 else second, "test")

    reader = LlamaLogReader(locate=locate)
    assert reader.poll(1) == [] and reader.reason is None  # at the end: history is never read
    with open(first, "a") as f:
        f.write(log_text("stderr_default.log"))
    assert reader.poll(1) == EXPECTED
    assert reader.poll(None) == [] and reader.poll(1) == []  # a pid lost a moment keeps its place
    with open(second, "a") as f:
        f.write(log_text("stderr_lv1.log"))
    assert reader.poll(2) == []  # a new process: its log from its end on
    assert located == [1, 2]
    unreadable = LlamaLogReader(locate=lambda pid: LogFile(None, "its stderr", why="a pipe"))
    assert unreadable.poll(5) == [] and unreadable.reason == "a pipe" and unreadable.where == "its stderr"
    assert LlamaLogReader().poll(None) == []


# --------------------------------------------------------------------------- the probe


class FakeLlamaServer(FakeHttpServer):
    """A llama-server's monitoring endpoints from the captured answers (`-c 256` in /props), on a real
    port of this process: the probe finds its pid (this process) by that port, as for a real one."""

    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if path == "/props":
            props = json.loads((CAPTURED / "props.json").read_text())
            props["default_generation_settings"]["n_ctx"] = N_CTX
            return 200, props
        if path == "/metrics":
            return 200, (CAPTURED / "metrics_after.txt").read_text()
        files = {"/health": "health.json", "/slots": "slots_after.json", "/v1/models": "v1_models.json"}
        if path in files:
            return 200, json.loads((CAPTURED / files[path]).read_text())
        return 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}


@pytest.fixture
def fake_llama() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer() as server:
        yield server


def test_the_probe_adds_the_logs_records_to_its_reading(fake_llama: FakeLlamaServer, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    pids: list[int] = []

    def locate(pid: int) -> LogFile:
        pids.append(pid)
        return LogFile(log, f"--log-file {log}")

    probe = LlamaCppProbe(fake_llama.url, log_reader=lambda: LlamaLogReader(locate=locate))
    try:
        assert probe.poll(0.0).finished == ()
        with open(log, "a") as f:
            f.write(
                log_text("stderr_default.log") + log_text("router_stdout.log")
            )  # a child's lines: not its own
        reading = probe.poll(1.0)
    finally:
        probe.close()
    assert reading.status == "ok", reading.reason
    assert pids == [os.getpid()]  # the process listening on the server's port, located once
    logged = [f for f in reading.finished if f.source == LOG_SOURCE]
    (model,) = reading.models
    assert [(f.model, f.http_status, f.stop_reason) for f in logged] == [
        (model.name, 400, None),
        (model.name, None, "context"),
    ]
    assert probe.log_where == f"--log-file {log}" and probe.log_reason is None


def test_a_bug_reading_the_log_costs_only_its_records(
    fake_llama: FakeLlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trayapp")

    class Broken(LlamaLogReader):
        def poll(self, pid: int | None) -> list[Any]:
            raise KeyError("a bug")

    probe = LlamaCppProbe(fake_llama.url, log_reader=Broken)
    try:
        readings = [probe.poll(float(t)) for t in range(3)]
    finally:
        probe.close()
    assert all(r.status == "ok" for r in readings), readings[-1].reason
    assert all(not r.finished for r in readings)
    bugs = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], KeyError)]
    assert len(bugs) == 1 and "reading its log" in bugs[0].getMessage()
