"""The prompt counter's copy of a request body counts against the listener's budget for held bodies
(issue #25: it was outside the 64 MiB budget, so ten big chat bodies held ten more copies)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from trayapp.services.proxy.admission import HeldBytes
from trayapp.services.proxy.prompt_length import PromptCounter


@dataclass
class _Tap:
    """What the counter reads of a request (a RequestTap's fields)."""

    body: bytes
    family: str = "openai-chat"
    prompt_tokens_sent: int | None = None
    first_text_mono_s: float | None = None

    def request_copy(self) -> bytes:
        return bytes(self.body)


class _Board:
    def prompt_started(self, key: int, upstream_url: str, model: str | None, tokens: int) -> None:
        raise AssertionError("no count can come from an unreachable server")

    def prompt_ended(self, key: int) -> None:
        pass


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 200}]}).encode()


def test_a_copy_past_the_budget_is_not_made_and_a_held_one_is_given_back() -> None:
    async def scenario() -> list[int]:
        held = HeldBytes(limit_bytes=len(BODY) + 10)  # room for one copy, not two
        counter = PromptCounter(_Board(), "http://127.0.0.1:9", "llamacpp", held)  # port 9: refused
        seen = [held.held_bytes]
        counter.request_sent(_Tap(BODY), None)  # type: ignore[arg-type]
        seen.append(held.held_bytes)  # the first copy is held, counted against the budget
        counter.request_sent(_Tap(BODY), None)  # type: ignore[arg-type]
        seen.append(held.held_bytes)  # the second would pass the budget: no copy, no count
        await asyncio.wait_for(asyncio.gather(*counter._tasks.values(), return_exceptions=True), 30)
        seen.append(held.held_bytes)  # the count ended (the server is unreachable): given back
        await counter.close()
        return seen

    assert asyncio.run(scenario()) == [0, len(BODY), len(BODY), 0]


def test_the_recorder_and_the_counter_share_one_budget() -> None:
    held = HeldBytes(limit_bytes=100)
    assert held.take(60) and not held.take(41) and held.take(40)
    held.give(100)
    assert held.held_bytes == 0
