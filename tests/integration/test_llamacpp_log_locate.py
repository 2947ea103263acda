"""Finding a llama-server's log from its process, and the probe reading it (#20): real stand-in
processes (python, argv[0] "llama-server") with their streams on files, pipes and terminals, and a
fake llama-server over HTTP. Moved from tests/unit/test_llamacpp_log.py (unit tests start no process)."""

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
from tests.support.llamacpp_log import EXPECTED, N_CTX, log_text
from tests.support.paths import FIXTURES_DIR
from trayapp.sources.llamacpp_log import LOG_SOURCE, LlamaLogReader
from trayapp.sources.llamacpp_log_location import LogFile, locate_log
from trayapp.sources.servers.llamacpp import LlamaCppProbe

CAPTURED = FIXTURES_DIR / "llama-server" / "captured"


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
