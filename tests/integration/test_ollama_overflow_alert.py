"""Ollama's silent prompt truncation through the recording proxy, end to end (#20).

A fake Ollama built from Ollama's own truncation rules (tests/support/fake_servers.py `FakeOllama`:
v0.32.15, the rules of v0.30.11 and later), the real recording proxy in front of it
(`running_proxy(url, "ollama", inbox=…)`) and the real Monitor ticking once a second with the
proxy's records in its inbox, as the tray runs them. A too-long prompt is sent through the proxy to
`/api/chat` and to the OpenAI-compatible `/v1/chat/completions` (whose num_ctx Ollama ignores), with
Ollama's log unreadable (only the proxy sees the request: its size is estimated) and readable (the
log's exact count wins; the request is still one stored row). `context_overflow` must fire within
2 s of the answer, with these sizes, worked by hand from the fake's tokenizer (one token per word)
and Ollama's rule (docs/ollama-log.md):

* a prompt longer than num_ctx − 1 tokens keeps `keep` = num_keep 4 (qwen3 adds no BOS token) and
  its tail, to num_ctx − max((num_ctx − keep) // 2, 1) = 4096 − 4092 // 2 = **2050** tokens at
  num_ctx 4096, which is what `prompt_eval_count` and `usage.prompt_tokens` report;
* the proxy's estimate is the characters of every string in the messages (`role` included) ÷ 4,
  rounded: one message `user` of 6000 × "lorem" is 4 + 6000 × 5 + 5999 = 36,003 → **~9,001**; a
  `system` message of 10 words and a `user` one of 5000 is 6 + 59 + 4 + 29,999 = 30,068 → **~7,517**;
* the fix's context holds the prompt and 1,024 tokens of answer, a whole 1,024 at which this Ollama
  keeps the whole prompt (N − (N − 4) // 2 ≥ prompt): 9,001 → **18432** (keeps 9,218; 17408 keeps
  8,706), 6,000 → **12288** (6,146; 11264 keeps 5,634), 7,517 → **15360** (7,682; 14336 keeps 7,170),
  5,010 → **10240** (5,122; 9216 keeps 4,610).

Applying the printed fix to the fake (the request option for `/api/chat`; OLLAMA_CONTEXT_LENGTH,
a restart, for `/v1`) and resending the same prompt: nothing is cut and the episode ends.
Every wait is bounded. Counts only: no prompt text is looked for in any record.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_servers import FakeOllama
from tests.support.proxy import RunningProxy, running_proxy
from trayapp.config.settings import EndpointConfig, MonitorConfig, Settings
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import Alert, RequestRecord, Snapshot
from trayapp.services.monitor import Monitor
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.ollama_log import ENV_VAR

ALERT_WITHIN_S = 2.0
TICK_S = 1.0  # the sampler's pace while something generates
PROFILE = HardwareProfile(ram_bandwidth_gbps=30.0)  # given: no RAM benchmark competes for the cores
MODEL = "qwen3:30b"  # adds no BOS token (its /api/show): keep = num_keep = 4
NUM_CTX = 4096
KEPT = 2050  # 4096 - (4096 - 4) // 2


def words(n: int, word: str = "lorem") -> str:
    return " ".join([word] * n)


@dataclass(frozen=True)
class Case:
    """One too-long request and what it must show, worked by hand (the module's docstring)."""

    path: str
    body: dict[str, Any]
    tokens: int  # the prompt in the fake's tokens (one a word): the log's exact count
    estimate: int  # the proxy's estimate from its characters
    fix_estimated: int  # the fix's num_ctx from the estimate (proxy only)
    fix_exact: int  # from the log's count

    def kept(self, answer: dict[str, Any]) -> int:
        """What the server says it read of the prompt."""
        return int(
            answer["prompt_eval_count"] if self.path.startswith("/api/") else answer["usage"]["prompt_tokens"]
        )


NATIVE = Case(
    "/api/chat",
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": words(6000)}],
        "options": {"num_ctx": NUM_CTX},
        "stream": False,
    },
    tokens=6000,
    estimate=9001,
    fix_estimated=18432,
    fix_exact=12288,
)
OPENAI = Case(
    "/v1/chat/completions",
    {
        "model": MODEL,
        "messages": [{"role": "system", "content": words(10)}, {"role": "user", "content": words(5000)}],
        # every way a client tries to ask for a context; Ollama's OpenAI endpoint reads none of them
        "options": {"num_ctx": 32768},
        "num_ctx": 32768,
    },
    tokens=5010,
    estimate=7517,
    fix_estimated=15360,
    fix_exact=10240,
)


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@dataclass
class Watched:
    ollama: FakeOllama
    monitor: Monitor
    proxy: RunningProxy


@contextmanager
def watched(tmp_path: Path, *, log_readable: bool) -> Iterator[Watched]:
    """The fake (writing its log in tmp_path), the proxy in front, and the monitor as the tray wires
    them; Ollama's log set to the fake's file, or to one that does not exist."""
    log_path = tmp_path / "server.log"
    log_path.write_text("")
    setting = str(log_path if log_readable else tmp_path / "elsewhere" / "server.log")
    with FakeOllama(log_path=log_path) as ollama:
        ollama.load(MODEL)  # at 32768, as the fixture's /api/ps has it
        inbox = RecordInbox([ollama.url])
        monitor = Monitor(
            Settings(monitor=MonitorConfig(discover=False, ollama_log=setting)),
            extra_endpoints=[EndpointConfig(url=ollama.url, kind="ollama")],
            discover=False,
            record=False,
            measure_ram=False,
            profile=PROFILE,
            proxy_inbox=inbox,
        )
        try:
            with running_proxy(ollama.url, "ollama", inbox=inbox) as proxy:
                monitor.tick()  # the log reader starts at the log's end
                yield Watched(ollama, monitor, proxy)
        finally:
            monitor.close()


def post(url: str, case: Case, body: dict[str, Any] | None = None) -> dict[str, Any]:
    response = httpx.post(url + case.path, json=body or case.body, timeout=10.0, trust_env=False)
    assert response.status_code == 200, response.text  # Ollama answers a cut prompt as if nothing happened
    answer: dict[str, Any] = response.json()
    return answer


def overflow_alerts(snapshot: Snapshot) -> list[Alert]:
    return [a for a in snapshot.alerts if a.kind == "context_overflow"]


def tick_until(monitor: Monitor, done: Any, limit_s: float) -> list[Snapshot]:
    """The sampler's loop (a tick a second) until `done(snapshot)` or `limit_s` after the start."""
    start = time.monotonic()
    snapshots: list[Snapshot] = []
    pace = threading.Event()
    while True:
        snapshots.append(monitor.tick())
        if done(snapshots[-1]) or time.monotonic() - start >= limit_s:
            return snapshots
        pace.wait(TICK_S)


def requests_of(snapshots: list[Snapshot]) -> list[RequestRecord]:
    return [r for s in snapshots for r in s.requests]


@pytest.mark.parametrize("case", [NATIVE, OPENAI], ids=["api-chat", "openai"])
@pytest.mark.parametrize("log_readable", [False, True], ids=["proxy-only", "proxy-and-log"])
def test_a_cut_prompt_alerts_with_its_sizes_and_the_fix_makes_it_fit(
    case: Case, log_readable: bool, tmp_path: Path
) -> None:
    with watched(tmp_path, log_readable=log_readable) as w:
        answer = post(w.proxy.url, case)
        answered = time.monotonic()
        snapshots = tick_until(w.monitor, lambda s: bool(overflow_alerts(s)), limit_s=10.0)
        seen_s = time.monotonic() - answered
        for _ in range(2):  # the episode goes on: one alert, not one per tick
            snapshots.append(w.monitor.tick())

        # HTTP 200, and the server's own count is the cut size: the model read 2050 tokens
        assert case.kept(answer) == KEPT
        generation = w.ollama.generations[-1]
        assert (generation.num_ctx, generation.prompt_tokens, generation.prompt_eval_count) == (
            NUM_CTX,
            case.tokens,
            KEPT,
        )

        alerts = [a for s in snapshots for a in overflow_alerts(s)]
        assert alerts, "no context_overflow alert"
        assert seen_s <= ALERT_WITHIN_S and len(snapshots) - 2 <= 2, seen_s  # the first or second tick
        assert len({a.id for a in alerts}) == 1
        alert = alerts[-1]
        evidence = alert.evidence
        assert (evidence["cause"], evidence["tokens_kept"], evidence["context_tokens"]) == (
            "truncated",
            KEPT,
            NUM_CTX,
        )
        assert alert.severity == "critical"
        if log_readable:  # the log's exact count, kept over the proxy's estimate of the same request
            exact, fix = True, case.fix_exact
            assert (evidence["source"], evidence["tokens_sent"]) == ("ollama-log", case.tokens)
            assert f"Ollama kept 2,050 of your {case.tokens:,} prompt tokens (num_ctx 4096)" in alert.message
            assert "~" not in alert.message and "estimated" not in alert.message
        else:
            exact, fix = False, case.fix_estimated
            assert (evidence["source"], evidence["tokens_sent"]) == ("proxy", case.estimate)
            assert (
                f"Ollama kept 2,050 of your ~{case.estimate:,} prompt tokens (num_ctx 4096)" in alert.message
            )
            assert "(the prompt's size is estimated from its text)" in alert.message
        assert evidence["tokens_sent_exact"] is exact and evidence["context_needed_tokens"] == fix
        print(alert.message, alert.fix, *alert.fix_commands, sep="\n")

        # One stored row for the request, the proxy's, whether or not the log also saw it.
        (row,) = requests_of(snapshots)
        assert (row.source, row.model, row.endpoint) == ("proxy", MODEL, case.path)
        assert (row.prompt_tokens, row.prompt_tokens_sent, row.prompt_sent_exact) == (
            KEPT,
            case.estimate,
            False,
        )

        # The fix, applied to the fake as the user would, makes the same prompt fit.
        commands = alert.fix_commands
        env = next(c for c in commands if c.startswith("OLLAMA_CONTEXT_LENGTH="))
        option = next(c for c in commands if c.startswith('"options"'))
        found = re.match(r"OLLAMA_CONTEXT_LENGTH=(\d+) ollama serve$", env)
        assert found is not None and int(found.group(1)) == fix, env
        assert json.loads("{" + option + "}") == {"options": {"num_ctx": fix}}
        if case is OPENAI:  # its requests cannot carry num_ctx: the server's default, and a restart
            w.ollama.default_num_ctx = int(found.group(1))
            w.ollama.unload(MODEL)
            body = case.body
        else:
            body = case.body | json.loads("{" + option + "}")
        fixed = post(w.proxy.url, case, body)
        assert case.kept(fixed) == case.tokens  # the whole prompt was read
        assert w.ollama.generations[-1].num_ctx == fix
        resolved = tick_until(w.monitor, lambda s: not overflow_alerts(s), limit_s=3.0)
        assert not overflow_alerts(resolved[-1])  # the request fitted: the episode is over


def test_a_prompt_of_the_cut_size_whose_estimate_is_below_the_context_is_no_alert(tmp_path: Path) -> None:
    """2050 words fit a 4096 context whole (2050 <= 4095: nothing cut), so `prompt_eval_count` is 2050,
    exactly what this Ollama cuts a longer prompt to. With words of three letters (4 characters a token,
    as English averages) the estimate is 4 + 2050 × 3 + 2049 = 8,203 characters → ~2,051 tokens:
    below √(2050 × 4096) ≈ 2,898, nearer the kept size than a prompt over the context — no cut."""
    case = Case(
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": words(KEPT, "abc")}],
            "options": {"num_ctx": NUM_CTX},
            "stream": False,
        },
        tokens=KEPT,
        estimate=2051,
        fix_estimated=0,
        fix_exact=0,
    )
    with watched(tmp_path, log_readable=False) as w:
        answer = post(w.proxy.url, case)
        snapshots = tick_until(w.monitor, lambda s: bool(overflow_alerts(s)), limit_s=ALERT_WITHIN_S + TICK_S)
    assert case.kept(answer) == KEPT and w.ollama.generations[-1].prompt_eval_count == KEPT  # read whole
    (row,) = requests_of(snapshots)
    assert (row.prompt_tokens, row.prompt_tokens_sent, row.prompt_sent_exact) == (KEPT, 2051, False)
    assert not [a for s in snapshots for a in overflow_alerts(s)]
