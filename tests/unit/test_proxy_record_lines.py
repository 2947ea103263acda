"""`llm-tray proxy`'s record lines: each record made since the last look printed as one line, all of
them in one write; with `--json`, each line the record's every field as `dataclasses.asdict` (the
standard library's own conversion, the oracle) gives it."""

from __future__ import annotations

import dataclasses
import json
import queue
import typing

import pytest

from trayapp.cli.proxy import _print_records
from trayapp.core.model import FinishedRequest


def _every_field_set(i: int) -> FinishedRequest:
    """A record whose every field differs from its default (a field added later is caught here)."""
    values: dict[str, object] = {}
    hints = typing.get_type_hints(FinishedRequest)
    for field in dataclasses.fields(FinishedRequest):
        kind = hints[field.name]
        args = set(typing.get_args(kind)) or {kind}
        if bool in args:
            values[field.name] = not field.default
        elif int in args:
            values[field.name] = 1000 + i
        elif float in args:
            values[field.name] = 0.25 + i
        elif str in args:
            values[field.name] = f"{field.name}-{i}"
        else:  # a Literal vocabulary (stop_reason)
            literal = next(arg for arg in args if typing.get_origin(arg) is typing.Literal)
            values[field.name] = typing.get_args(literal)[-1]
    return FinishedRequest(**values)  # type: ignore[arg-type]


def test_json_lines_hold_every_field_as_asdict_gives_it(capsys: pytest.CaptureFixture[str]) -> None:
    printed: queue.SimpleQueue[FinishedRequest] = queue.SimpleQueue()
    records = [_every_field_set(i) for i in range(3)]
    for record in records:
        printed.put(record)
    _print_records(printed, as_json=True)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"event": "request", **dataclasses.asdict(record)} for record in records
    ]
    _print_records(printed, as_json=True)  # nothing new: nothing printed
    assert capsys.readouterr().out == ""


def test_plain_lines_one_a_record(capsys: pytest.CaptureFixture[str]) -> None:
    printed: queue.SimpleQueue[FinishedRequest] = queue.SimpleQueue()
    for i in range(2):
        printed.put(FinishedRequest(model=f"m{i}", finished_wall_s=1.0, decode_tokens=5, decode_tok_s=50.0))
    _print_records(printed, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "m0" in lines[0] and "m1" in lines[1]
