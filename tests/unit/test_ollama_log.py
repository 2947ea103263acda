"""Ollama's `truncating input prompt` warnings: parsing, what their numbers mean by version, which model
they belong to, and reading the log (a file that grows, rotates, is cut short or unreadable; the journal).

Expected numbers are worked by hand from ollama/ollama's source (trayapp/sources/ollama_log.py cites
it): old runners cut to `limit` = num_ctx; v0.30.0–v0.30.8 log `limit` = num_ctx and keep num_ctx-1;
v0.30.9–v0.30.10 `limit` = num_ctx-1; v0.30.11+ `limit` = num_ctx - max((num_ctx-keep)//2, 1).
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES_DIR
from trayapp.config.settings import Settings, parse_settings
from trayapp.sources import log_tail
from trayapp.sources.ollama_log import (
    ENV_VAR,
    FileTail,
    JournalTail,
    LogLocation,
    OllamaLogReader,
    TruncationLine,
    attribute_truncation,
    context_sizes,
    log_location,
    parse_truncation_line,
    parse_truncation_lines,
)
from trayapp.sources.servers.ollama import LOG_SOURCE, UNKNOWN_MODEL, truncation_record

FIXTURE = FIXTURES_DIR / "ollama" / "server_log_truncation.log"
UTC = timezone.utc


def utc(year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC).timestamp()


def line(limit: int, prompt: int, keep: int, new: int, source: str = "llama_server.go:317") -> TruncationLine:
    return TruncationLine(None, limit, prompt, keep, new, source)


WARNING = (
    'time=2026-06-23T15:29:40.123-07:00 level=WARN source=llama_server.go:317 msg="truncating input prompt" '
    "limit=2050 prompt=8707 keep=4 new=2050"
)


# --------------------------------------------------------------------------- parsing


def test_every_era_of_the_warning_in_the_fixture_log() -> None:
    found = parse_truncation_lines(FIXTURE.read_text(encoding="utf-8"))
    assert found == [
        # v0.3.13 (llama/runner/runner.go:121): numKeep=, no new=: that runner kept exactly `limit`
        TruncationLine(utc(2024, 10, 20, 9, 0, 3, 250000), 2048, 2773, 5, 2048, "runner.go:121", False),
        # the Go ollama runner (v0.5.12–v0.29), a quoted report's numbers; +01:00 is 09:11 UTC
        TruncationLine(utc(2025, 3, 14, 9, 11, 12, 345000), 4096, 7268, 4, 4096, "runner.go:187"),
        # v0.30.0: limit logged as num_ctx, the prompt cut to num_ctx - 1; -04:00 is 12:15 UTC
        TruncationLine(utc(2026, 6, 2, 12, 15, 30, 500000), 8192, 9000, 5, 8191, "llama_server.go:278"),
        # v0.30.9: limit = new = num_ctx - 1
        TruncationLine(utc(2026, 6, 18, 11, 0, 0), 4095, 6000, 4, 4095, "llama_server.go:299"),
        # v0.30.11+: about half of num_ctx 4096, the other quoted report; -07:00 is 22:29 UTC
        TruncationLine(utc(2026, 6, 23, 22, 29, 40, 123000), 2050, 8707, 4, 2050, "llama_server.go:317"),
        TruncationLine(utc(2026, 9, 30, 12, 37, 7, 118000), 16387, 160689, 5, 16387, "llama_server.go:317"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        # a pre-v0.7 DEBUG line quoting a prompt that holds the warning's words (escaped quotes)
        'time=2025-03-14T10:11:12.346+01:00 level=DEBUG source=routes.go:1501 msg="chat request" images=0 '
        'prompt="say msg=\\"truncating input prompt\\" limit=1 prompt=2 keep=3 new=4"',
        WARNING.replace("level=WARN", "level=INFO"),
        WARNING.replace('"truncating input prompt"', '"truncating input messages"'),
        WARNING.replace("limit=2050 ", ""),
        WARNING.replace("new=2050", "new=lots"),
        '[GIN] 2026/06/23 - 15:29:52 | 200 | 12.331094117s |       127.0.0.1 | POST     "/api/chat"',
        "slot launch_slot_: id  0 | task 0 | processing task",
        "",
    ],
)
def test_what_is_not_the_warning(text: str) -> None:
    assert parse_truncation_line(text) is None


def test_a_prefix_a_crlf_and_no_time() -> None:
    journal = f"Jun 23 15:29:40 box ollama[812]: {WARNING}\r\n"
    parsed = parse_truncation_line(journal)
    assert parsed is not None and (parsed.limit, parsed.prompt, parsed.keep, parsed.new) == (
        2050,
        8707,
        4,
        2050,
    )
    assert parsed.time_wall_s == utc(2026, 6, 23, 22, 29, 40, 123000)
    bare = parse_truncation_line(
        'level=WARN msg="truncating input prompt" limit=4096 prompt=5000 keep=4 new=4096'
    )
    assert bare == TruncationLine(None, 4096, 5000, 4, 4096, None)
    zulu = parse_truncation_line(WARNING.replace("-07:00", "Z"))
    assert zulu is not None and zulu.time_wall_s == utc(2026, 6, 23, 15, 29, 40, 123000)


# --------------------------------------------------------------------------- what the numbers mean


@pytest.mark.parametrize(
    ("warning", "version", "sizes"),
    [
        (line(4096, 7268, 4, 4096, "runner.go:187"), "0.29.0", (4096,)),
        (line(8192, 9000, 5, 8191, "llama_server.go:278"), "0.30.5", (8192,)),
        (line(4095, 6000, 4, 4095, "llama_server.go:299"), "0.30.9", (4096,)),
        (line(4095, 6000, 4, 4095, "llama_server.go:299"), "0.30.10-rc1", (4096,)),
        # 4096 - 4092//2 = 2050 and 4095 - 4091//2 = 2050: two sizes a token apart
        (line(2050, 8707, 4, 2050), "0.32.15", (4096, 4095)),
        # keep 5: 32769 - 32764//2 = 16387, 32768 - 32763//2 = 16387
        (line(16387, 160689, 5, 16387), "v0.33.0-rc2", (32769, 32768)),
        # no version known (a development build says 0.0.0): the newest rule, unless the line shows its era
        (line(2050, 8707, 4, 2050), "0.0.0", (4096, 4095)),
        (line(8192, 9000, 5, 8191), None, (8192,)),  # new = limit - 1: only v0.30.0–v0.30.8 do that
        (line(2048, 2773, 5, 2048, "runner.go:121"), None, (2048,)),  # the old runners' source file
        (line(4096, 7268, 4, 4096, "runner.go:187"), "0.32.15", (4096,)),  # a line from before an upgrade
    ],
)
def test_context_sizes_by_version(
    warning: TruncationLine, version: str | None, sizes: tuple[int, ...]
) -> None:
    assert context_sizes(warning, version) == sizes


def test_which_model_cut_it() -> None:
    warning = line(2050, 8707, 4, 2050)  # num_ctx 4096 (or 4095) on v0.32.15
    version = "0.32.15"
    # the one loaded model whose /api/ps context_length fits
    assert attribute_truncation(warning, [("qwen3:30b", 32768), ("qwen2.5:7b", 4096)], version) == (
        "qwen2.5:7b",
        4096,
    )
    # the only loaded model, though its context says otherwise: the line's own size
    assert attribute_truncation(warning, [("llama3.1:8b", 8192)], version) == ("llama3.1:8b", 4096)
    assert attribute_truncation(warning, [("old", None)], version) == ("old", 4096)  # ps before v0.10
    # several could be it, or none: unknown, the size still known
    assert attribute_truncation(warning, [("a", 8192), ("b", 32768)], version) == (None, 4096)
    assert attribute_truncation(warning, [("a", 4096), ("b", 4096)], version) == (None, 4096)
    assert attribute_truncation(warning, [], version) == (None, 4096)


def test_the_record_a_warning_becomes() -> None:
    warning = TruncationLine(utc(2026, 6, 23, 22, 29, 40, 123000), 2050, 8707, 4, 2050, "llama_server.go:317")
    record = truncation_record(warning, [("qwen3:30b", 32768), ("qwen2.5:7b", 4096)], "0.32.15", 1.0e9)
    assert record.model == "qwen2.5:7b"
    assert record.source == LOG_SOURCE == "ollama-log"
    assert record.finished_wall_s == utc(2026, 6, 23, 22, 29, 40, 123000)
    assert (record.prompt_tokens, record.prompt_tokens_sent, record.context_limit_tokens) == (
        2050,
        8707,
        4096,
    )
    assert record.prompt_sent_exact is True
    assert record.decode_tokens is None and record.stop_reason is None  # the log does not say
    timeless = truncation_record(line(2050, 8707, 4, 2050), [], "0.32.15", 1.0e9)
    assert timeless.model == UNKNOWN_MODEL == "unknown" and timeless.finished_wall_s == 1.0e9


# --------------------------------------------------------------------------- where the log is


def test_where_auto_looks_on_each_os(tmp_path: Path) -> None:
    home = tmp_path / "ann"
    mac = log_location("auto", environ={}, platform="darwin", home=home)
    assert mac == LogLocation("file", home / ".ollama" / "logs" / "server.log")
    local = str(tmp_path / "Local")
    win = log_location("auto", environ={"LOCALAPPDATA": local}, platform="win32", home=home)
    assert win == LogLocation("file", Path(local) / "Ollama" / "server.log")
    linux = log_location(
        "auto", environ={}, platform="linux", home=home, which=lambda _: "/usr/bin/journalctl"
    )
    assert linux.kind == "journal" and linux.label == "journalctl -u ollama"
    bare = log_location("auto", environ={}, platform="linux", home=home, which=lambda _: None)
    assert bare.kind == "none" and bare.why is not None and "monitor.ollama_log" in bare.why


def test_off_a_path_and_the_environment(tmp_path: Path) -> None:
    assert log_location("off", environ={}, platform="darwin", home=tmp_path).kind == "none"
    given = log_location("~/ollama.log", environ={"HOME": str(tmp_path)}, platform="linux", home=tmp_path)
    assert given.kind == "file" and given.path == Path("~/ollama.log").expanduser()
    env = {ENV_VAR: str(tmp_path / "serve.log")}
    assert log_location("off", environ=env, platform="linux", home=tmp_path) == LogLocation(
        "file", tmp_path / "serve.log"
    )
    assert log_location("auto", environ={ENV_VAR: "off"}, platform="darwin", home=tmp_path).kind == "none"


def test_a_reader_with_nothing_to_read_says_why() -> None:
    reader = OllamaLogReader(LogLocation("none", why="reading Ollama's log is off"))
    assert reader.poll() == [] and reader.reason == "reading Ollama's log is off"


# --------------------------------------------------------------------------- reading a file


def warning(limit: int, prompt: int, keep: int = 4) -> bytes:
    return (
        "time=2026-06-23T15:29:40.123-07:00 level=WARN source=llama_server.go:317 "
        f'msg="truncating input prompt" limit={limit} prompt={prompt} keep={keep} new={limit}\n'
    ).encode()


GIN = b'[GIN] 2026/06/23 - 15:29:52 | 200 | 12.331094117s |       127.0.0.1 | POST     "/api/chat"\n'


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def prompts(lines: list[str]) -> list[int]:
    return [t.prompt for raw in lines if (t := parse_truncation_line(raw)) is not None]


def test_starts_at_the_end_and_reads_what_comes(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN + warning(2050, 1111))  # history: never read
    tail = FileTail(log)
    assert tail.read() == ([], None)
    append(log, GIN + warning(2050, 5000) + GIN + warning(2050, 6000))
    lines, reason = tail.read()
    assert prompts(lines) == [5000, 6000] and reason is None
    assert tail.read() == ([], None)


def test_a_file_that_did_not_grow_is_not_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN)
    tail = FileTail(log)
    tail.read()
    opened: list[object] = []
    real_open = open

    def counting_open(*args: Any, **kwargs: Any) -> Any:
        opened.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(log_tail, "open", counting_open, raising=False)
    assert tail.read() == ([], None)
    assert opened == []  # same size as at the last read: only its size was looked at
    append(log, warning(2050, 5000))
    assert prompts(tail.read()[0]) == [5000]
    assert opened == [log]


def test_a_line_written_in_two_parts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = FileTail(log)
    tail.read()
    whole = warning(2050, 7000)
    append(log, GIN + whole[:40])
    assert tail.read() == ([], None)
    append(log, whole[40:])
    assert prompts(tail.read()[0]) == [7000]


def test_rotation_finishes_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN)
    tail = FileTail(log)
    tail.read()
    append(log, warning(2050, 5001) + warning(2050, 5002)[:30])  # written before the restart, unread
    os.rename(log, tmp_path / "server-1.log")  # app/logrotate: server.log -> server-1.log at a start
    log.write_bytes(warning(2050, 5003))
    assert prompts(tail.read()[0]) == [5001, 5003]  # the cut-off last line of the old file is no line


def test_a_file_cut_short_in_place_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN * 20)
    tail = FileTail(log)
    tail.read()
    with open(log, "r+b") as f:
        f.truncate(0)
    append(log, warning(4096, 9000))
    assert prompts(tail.read()[0]) == [9000]


def test_a_file_that_appears_after_the_start_is_all_new(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = FileTail(log)
    lines, reason = tail.read()
    assert lines == [] and reason == f"Ollama's log {log} does not exist"
    log.write_bytes(warning(2050, 4000) + GIN)
    assert prompts(tail.read()[0]) == [4000]


def test_reads_are_bounded_and_catch_up(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = FileTail(log, max_read_bytes=200)
    tail.read()
    three = warning(2050, 5001) + warning(2050, 5002) + warning(2050, 5003)  # ~140 bytes each
    append(log, three)
    seen: list[int] = []
    for _ in range(5):
        seen += prompts(tail.read()[0])
    assert seen == [5001, 5002, 5003]


def test_far_behind_skips_to_the_newest(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = FileTail(log, max_read_bytes=1000, max_backlog_bytes=4000)
    tail.read()
    append(log, warning(2050, 1) + GIN * 100 + warning(2050, 2))
    assert prompts(tail.read()[0]) == [2]
    assert tail.skipped_bytes > 0


def test_an_over_long_line_is_dropped(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = FileTail(log, max_read_bytes=32 * 1024)
    tail.read()
    append(log, b"x" * (100 * 1024))  # no newline yet: more than a line may be
    for _ in range(4):
        tail.read()
    append(log, b"x" * 10 + b" truncating input prompt limit=1 prompt=2 keep=3 new=4\n" + warning(2050, 3000))
    assert prompts(tail.read()[0]) == [3000]


def test_a_file_it_may_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN)

    def denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    tail = FileTail(log)
    monkeypatch.setattr("trayapp.sources.ollama_log.os.stat", denied)
    assert tail.read() == ([], f"Ollama's log at {log} is not readable: permission denied")
    directory = FileTail(tmp_path)
    monkeypatch.undo()
    directory.read()  # at start: its end
    lines, reason = directory.read()
    assert (
        lines == []
        and reason is not None
        and reason.startswith(f"Ollama's log at {tmp_path} is not readable")
    )


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="needs file permissions that bind this user"
)
def test_a_file_without_read_permission(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(GIN)
    tail = FileTail(log)
    tail.read()
    log.chmod(0)
    try:
        assert tail.read()[1] == f"Ollama's log at {log} is not readable: permission denied"
    finally:
        log.chmod(0o600)


# --------------------------------------------------------------------------- reading the journal


class FakeJournalctl:
    """Stands in for `subprocess.run(["journalctl", ...])`: each call answers the next reply."""

    def __init__(self, *replies: tuple[int, str, str] | BaseException) -> None:
        self.replies = list(replies)
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] == 3.0 and kwargs["check"] is False
        self.calls.append(argv)
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        code, out, err = reply
        return subprocess.CompletedProcess(argv, code, out, err)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


WARN_TEXT = warning(2050, 8707).decode()


def test_the_journal_from_its_newest_entry_on() -> None:
    run = FakeJournalctl(
        (0, "msg=history\n-- cursor: s=1;i=a\n", ""),
        (0, f"[GIN] ...\n{WARN_TEXT}-- cursor: s=1;i=c\n", ""),
        (0, "", ""),
    )
    clock = Clock()
    journal = JournalTail(run=run, clock=clock, start_wall_s=1_790_000_000)
    assert journal.read() == ([], None)
    assert run.calls[0] == [
        "journalctl",
        "-u",
        "ollama",
        "-o",
        "cat",
        "--no-pager",
        "--show-cursor",
        "-n",
        "1",
    ]
    clock.now += 1.0
    assert journal.read() == ([], None) and len(run.calls) == 1  # not again within every_s
    clock.now += 5.0
    lines, reason = journal.read()
    assert prompts(lines) == [8707] and reason is None
    assert run.calls[1][-1] == "--after-cursor=s=1;i=a"
    clock.now += 5.0
    assert journal.read() == ([], None)
    assert run.calls[2][-1] == "--after-cursor=s=1;i=c"


def test_a_journal_with_no_entries_for_the_unit() -> None:
    run = FakeJournalctl((0, "-- No entries --\n", ""), (0, f"{WARN_TEXT}-- cursor: s=2\n", ""))
    clock = Clock()
    journal = JournalTail(run=run, clock=clock, start_wall_s=1_790_000_000.7)
    lines, reason = journal.read()
    assert lines == [] and reason is not None and "no entries of the systemd unit ollama" in reason
    clock.now += 59.0
    journal.read()
    assert len(run.calls) == 1  # asked again only after recheck_s
    clock.now += 1.0
    lines, reason = journal.read()
    assert run.calls[1][-1] == "--since=@1790000000" and prompts(lines) == [8707] and reason is None


def test_a_journal_this_user_may_not_read() -> None:
    hint = (
        "Hint: You are currently not seeing messages from other users and the system.\n"
        "      Users in groups 'adm', 'systemd-journal', 'wheel' can see all messages.\n"
    )
    journal = JournalTail(run=FakeJournalctl((0, "-- No entries --\n", hint)), clock=Clock())
    lines, reason = journal.read()
    assert lines == [] and reason is not None
    assert "not readable by this user" in reason and "systemd-journal" in reason


def test_a_machine_with_no_journal_files() -> None:
    """systemd 252's journalctl with --show-cursor and nothing to show exits 1, with or without a word."""
    journal = JournalTail(run=FakeJournalctl((1, "", "No journal files were found.\n")), clock=Clock())
    assert journal.read() == (
        [],
        "no journal to read here (journalctl -u ollama: no journal files were found)",
    )
    silent = JournalTail(run=FakeJournalctl((1, "", "")), clock=Clock())
    lines, reason = silent.read()
    assert lines == [] and reason is not None and reason.startswith("no entries of the systemd unit ollama")


def test_journalctl_that_hangs_or_fails() -> None:
    clock = Clock()
    journal = JournalTail(
        run=FakeJournalctl(
            subprocess.TimeoutExpired("journalctl", 3.0), (1, "", "Failed to add match 'x'\n")
        ),
        clock=clock,
    )
    assert journal.read() == ([], "journalctl -u ollama did not answer within 3 s")
    clock.now += 60.0
    assert journal.read() == ([], "journalctl -u ollama failed (exit 1): Failed to add match 'x'")


def test_the_reader_reports_the_journals_lines() -> None:
    run = FakeJournalctl((0, "-- cursor: s=1\n", ""), (0, WARN_TEXT, ""))
    clock = Clock()
    reader = OllamaLogReader(LogLocation("journal"), run=run, clock=clock)
    assert reader.poll() == [] and reader.where == "journalctl -u ollama"
    clock.now += 10.0
    (found,) = reader.poll()
    assert (found.limit, found.prompt, found.keep, found.new) == (2050, 8707, 4, 2050)
    assert (
        found.time_wall_s
        == (datetime(2026, 6, 23, 15, 29, 40, 123000) + timedelta(hours=7)).replace(tzinfo=UTC).timestamp()
    )


# --------------------------------------------------------------------------- the setting


def test_the_setting() -> None:
    assert Settings().monitor.ollama_log == "auto"
    settings, errors = parse_settings({"monitor": {"ollama_log": "~/ollama.log"}})
    assert settings.monitor.ollama_log == "~/ollama.log" and errors == []
    assert parse_settings({"monitor": {"ollama_log": "off"}})[0].monitor.ollama_log == "off"
    _, errors = parse_settings({"monitor": {"ollama_log": " "}})
    assert errors == ['monitor.ollama_log: expected "auto", "off" or the path of Ollama\'s server log']
    _, errors = parse_settings({"monitor": {"ollama_log": False}})
    assert errors == ["monitor.ollama_log: expected a string, got False"]
