"""`llm-tray proxy`'s records: each made since the last look printed as one line, all of them in one
write (with `--json`, each line the record's every field as `dataclasses.asdict`, the standard
library's own conversion, gives it); and who keeps them in the store — the proxy, or a tray or agent
it sends them to."""

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


@pytest.mark.parametrize(
    ("role", "locked", "sends_to_it", "says"),
    [
        ("tray", None, True, None),  # a tray starting: it opens the store ~3 s after it answers
        ("tray", "another llm-tray process (pid 7) is already recording", True, None),
        (
            "agent",
            None,
            False,
            None,
        ),  # an agent opens its store before it answers: free means it does not record
        ("agent", "another llm-tray process (pid 7) is already recording", True, None),
        (None, None, False, None),  # nothing runs: the proxy records itself
        (None, "another llm-tray process (pid 7) is already recording", False, "not recording: another"),
    ],
)
def test_who_records_a_proxy_commands_records(
    monkeypatch: pytest.MonkeyPatch, role: str | None, locked: str | None, sends_to_it: bool, says: str | None
) -> None:
    from trayapp.cli import proxy
    from trayapp.sinks import sampler_file

    info = (
        None
        if role is None
        else sampler_file.SamplerInfo(url="http://127.0.0.1:9", pid=7, started="", role=role)
    )
    monkeypatch.setattr(
        sampler_file, "locate_sampler", lambda: (info, "" if info else "no tray or agent is running")
    )
    monkeypatch.setattr(proxy, "store_locked", lambda: locked)
    sampler, refusal = proxy._sampler_for_records()
    assert (sampler is info) if sends_to_it else sampler is None
    assert (refusal is None) if says is None else (refusal is not None and refusal.startswith(says))
