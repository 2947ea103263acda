"""The sampler file's claim rules (#24 item 1), on real files under this test's LLM_TRAY_HOME.

One sampler per machine: a claim never takes over a live sampler's entry (its pid runs and its
endpoint answers), replaces a stale one, and `remove_sampler_file` removes only this process's own
entry. tests/unit starts no server, so whether an endpoint answers is given here by replacing
`sampler_file.answers`; the same rules against real endpoints and a real agent are in
tests/integration/test_sampler_owner.py.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trayapp.sinks import sampler_file
from trayapp.sinks.sampler_file import SamplerInfo, claim_sampler_file, remove_sampler_file

TRAY_URL = "http://127.0.0.1:40123"
AGENT_URL = "http://127.0.0.1:40124"
STARTED = "2026-12-01T12:00:00.123Z"


def _gone_pid() -> int:
    """A pid no process has (pids count down from the largest a 64-bit Linux hands out)."""
    for pid in range(4_194_303, 4_000_000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid found")


def _answering(*urls: str) -> Callable[[SamplerInfo, float], bool]:
    """`sampler_file.answers` as if exactly `urls` were endpoints that answer."""

    def answers(info: SamplerInfo, timeout_s: float = 1.0) -> bool:
        return info.url in urls

    return answers


def _entry(url: str, pid: int, role: str = "tray") -> str:
    return json.dumps({"url": url, "pid": pid, "started": STARTED, "role": role}) + "\n"


@pytest.fixture
def path() -> Path:
    return sampler_file.sampler_path()  # under this test's LLM_TRAY_HOME (tests/conftest.py)


def test_with_no_entry_the_claim_writes_ours(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering())
    owner = claim_sampler_file(AGENT_URL, "agent")
    assert owner.is_this_process(AGENT_URL) and owner.role == "agent"
    data = json.loads(path.read_text())
    assert data == {"url": AGENT_URL, "pid": os.getpid(), "started": owner.started, "role": "agent"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [".sampler.json.lock", "sampler.json"]  # no temp


def test_a_live_samplers_entry_is_never_taken_over_nor_removed(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering(TRAY_URL))
    tray = _entry(TRAY_URL, os.getppid())  # another process, running, whose endpoint answers
    path.write_text(tray)
    owner = claim_sampler_file(AGENT_URL, "agent")
    assert owner == SamplerInfo(url=TRAY_URL, pid=os.getppid(), started=STARTED, role="tray")
    assert owner.describe() == f"the tray (pid {os.getppid()}, {TRAY_URL})"
    remove_sampler_file(AGENT_URL)  # the agent leaving
    remove_sampler_file()
    assert path.read_text() == tray  # byte for byte


def test_another_endpoint_of_this_same_process_counts_as_another_sampler(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering(TRAY_URL))
    path.write_text(_entry(TRAY_URL, os.getpid()))
    assert claim_sampler_file(AGENT_URL).url == TRAY_URL
    remove_sampler_file(AGENT_URL)
    assert path.exists()


@pytest.mark.parametrize(
    ("stale", "answering"),
    [
        (lambda: _entry(TRAY_URL, _gone_pid()), (TRAY_URL,)),  # its process is gone
        (lambda: _entry(TRAY_URL, os.getppid()), ()),  # running, its endpoint does not answer
        (lambda: "{not json", ()),
        (lambda: "", ()),
        (lambda: json.dumps({"pid": os.getppid()}), ()),  # no url
    ],
    ids=["dead-pid", "no-answer", "garbage", "empty", "no-url"],
)
def test_a_stale_entry_is_replaced(
    stale: Callable[[], str], answering: tuple[str, ...], path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering(*answering))
    path.write_text(stale())
    owner = claim_sampler_file(AGENT_URL, "agent")
    assert owner.is_this_process(AGENT_URL)
    assert sampler_file.read_sampler_file() == owner
    remove_sampler_file(AGENT_URL)
    assert not path.exists()


def test_a_claim_again_keeps_our_own_entry(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering())  # our own entry needs no answer
    first = claim_sampler_file(TRAY_URL, "tray")
    written = path.read_bytes()
    assert claim_sampler_file(TRAY_URL, "tray") == first
    assert path.read_bytes() == written
    remove_sampler_file("http://127.0.0.1:1")  # another url of ours: not this entry
    assert path.read_bytes() == written
    remove_sampler_file(TRAY_URL)
    assert not path.exists()


@pytest.mark.parametrize("start", ["no-entry", "stale-entry"])
def test_samplers_claiming_at_once_agree_on_one(
    start: str, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight endpoints, all up, claim at the same moment: exactly one entry is written and every
    claim names it (a read-then-replace without the lock lets several write and each think it won)."""
    urls = [f"http://127.0.0.1:{41000 + i}" for i in range(8)]
    monkeypatch.setattr(sampler_file, "answers", _answering(*urls))
    if start == "stale-entry":
        path.write_text(_entry(TRAY_URL, _gone_pid()))
    writes: list[str] = []
    real_replace = os.replace

    def counting_replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst) == path:
            writes.append(json.loads(Path(src).read_text())["url"])
        real_replace(src, dst)

    monkeypatch.setattr(sampler_file.os, "replace", counting_replace)
    barrier = threading.Barrier(len(urls))

    def claim(url: str) -> SamplerInfo:
        barrier.wait(timeout=30)
        return claim_sampler_file(url, "agent")

    with ThreadPoolExecutor(len(urls)) as pool:
        owners = list(pool.map(claim, urls))
    assert len(writes) == 1
    assert {owner.url for owner in owners} == {writes[0]}
    assert sampler_file.read_sampler_file() == owners[0]


# --------------------------------------------------------------------------- what clients are told


def test_clients_are_told_why_there_is_no_sampler(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_file, "answers", _answering(TRAY_URL))
    assert sampler_file.locate_sampler() == (None, "no tray or agent is running")
    gone = _gone_pid()
    path.write_text(_entry(TRAY_URL, gone))
    assert sampler_file.locate_sampler() == (
        None, f"no tray or agent is running (the sampler file names pid {gone}, which is gone)"
    )  # fmt: skip
    path.write_text(_entry(AGENT_URL, os.getppid(), role="agent"))
    assert sampler_file.locate_sampler() == (
        None,
        f"the agent (pid {os.getppid()}, {AGENT_URL}) does not answer",
    )
    path.write_text(_entry(TRAY_URL, os.getppid()))
    info, why_not = sampler_file.locate_sampler()
    assert info is not None and info.url == TRAY_URL and why_not == ""
    path.write_text(json.dumps({"url": TRAY_URL, "pid": os.getppid()}))  # a file from before roles
    assert sampler_file.find_sampler() == SamplerInfo(url=TRAY_URL, pid=os.getppid(), started="")
