"""The `lms` reader threads' boundary (#19, no bug hidden): a bug in a parser is logged once with
its traceback, the reader goes on with the next line, and the prompt text never reaches the log.

A fake `lms` on PATH (tests/support/fake_servers.FakeLms, per fixtures/lmstudio); the parser is
broken on purpose for one kind of line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_servers import FakeLms, fixture_text, wait_until
from trayapp.core.model import FinishedRequest
from trayapp.sources.servers import lms_cli
from trayapp.sources.servers.lms_cli import LmsCli

OUTPUT_LINE = json.loads(fixture_text("lmstudio/lms_log_stream.ndjson").splitlines()[1])
CANARY = "canary-prompt-text-7c1f"  # in the broken lines; must never be logged


def output_line(predicted: int, text: str) -> str:
    event = json.loads(json.dumps(OUTPUT_LINE))
    event["data"]["stats"]["predictedTokensCount"] = predicted
    event["data"]["output"] = text
    return json.dumps(event)


@pytest.fixture
def lms(tmp_path: Path) -> Iterator[tuple[FakeLms, LmsCli]]:
    fake = FakeLms(tmp_path)
    reader = LmsCli(str(fake.path), ps_interval_s=0.1, backoff_s=0.1)
    reader.set_enabled(True)
    try:
        yield fake, reader
    finally:
        reader.stop()


def test_a_parser_bug_is_logged_once_and_the_reader_goes_on(
    lms: tuple[FakeLms, LmsCli], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake, reader = lms
    real_parse = lms_cli.parse_lms_log_line

    def buggy_parse(line: str | bytes) -> FinishedRequest | None:
        text = line.decode() if isinstance(line, bytes) else line
        if CANARY in text:
            raise KeyError(text)  # a bug whose message quotes the line, prompt and all
        return real_parse(line)

    monkeypatch.setattr(lms_cli, "parse_lms_log_line", buggy_parse)
    caplog.set_level(logging.ERROR, logger=lms_cli.__name__)
    fake.emit(*(output_line(n, text) for n, text in ((11, "fine"), (12, CANARY), (13, CANARY), (14, "fine"))))
    reader.start()
    got: list[FinishedRequest] = []

    def both_good_lines_read() -> bool:
        got.extend(reader.drain())
        return len(got) >= 2

    wait_until(both_good_lines_read, timeout_s=15.0, interval_s=0.05)
    assert [r.decode_tokens for r in got] == [11, 14]  # the lines around the bug were read
    bug_records = [r for r in caplog.records if r.exc_info]
    assert len(bug_records) == 1, [r.getMessage() for r in caplog.records]  # twice met, logged once
    logged = caplog.text
    assert "lms log stream: internal error" in logged
    assert "KeyError" in logged and "buggy_parse" in logged  # the traceback names the code
    assert CANARY not in logged  # never the line's text
