"""llama-server's log as captured from the real binary (tests/fixtures/llama-server/log/README.md):
the files, the server's own answers to the same requests, and the lines every format parses to."""

from __future__ import annotations

import json
from typing import Any

from tests.support.paths import FIXTURES_DIR
from trayapp.sources.llamacpp_log import EvalLine, RefusalLine, ReleaseLine

LOGS = FIXTURES_DIR / "llama-server" / "log"
RESPONSES: dict[str, Any] = json.loads((LOGS / "responses.json").read_text())
N_CTX = 256  # the captures' -c 256 -np 1

# What every format of the capture's log parses to: a 402-token prompt refused (n_ctx 256), an answer
# cut at the context end (54 tokens, 255 in the cache), a short answer (4 tokens).
EXPECTED = [
    RefusalLine(task_id=0, prompt_tokens=402, context_tokens=256),
    ReleaseLine(slot_id=0, task_id=0, n_tokens=0, truncated=False),
    EvalLine(slot_id=0, task_id=3, tokens=54),
    ReleaseLine(slot_id=0, task_id=3, n_tokens=255, truncated=True),
    EvalLine(slot_id=0, task_id=59, tokens=4),
    ReleaseLine(slot_id=0, task_id=59, n_tokens=5, truncated=False),
]


def log_text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")
