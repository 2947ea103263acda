"""Ollama's server log: the `truncating input prompt` warnings it writes when it silently cuts a prompt.

Ollama answers HTTP 200 to a prompt longer than the model's context (`num_ctx`) and keeps only its
first `keep` tokens and its tail; the one trace is a WARN line in its server log (issue #20,
docs/ollama-log.md). This module finds that log for this OS, reads what is appended to it from the
moment it starts (never the history before; a file through `log_tail.FileTail`, or the journal), and
parses those lines into `TruncationLine`s.
`OllamaProbe` (`servers/ollama.py`) turns each into a `FinishedRequest`.

The line, as Go's `log/slog` text handler writes it (ollama/ollama `logutil/logutil.go`: `AddSource`,
the source file's base name only; key=value pairs, a value with a space quoted), on one line:

    time=2026-06-23T15:29:40.123-07:00 level=WARN source=llama_server.go:317
    msg="truncating input prompt" limit=2050 prompt=8707 keep=4 new=2050

What the numbers mean, by Ollama version (read at ollama/ollama fb30760, tags from `git tag --contains`):

* v0.4.6 – v0.29.x, the Go runners (`runner/llamarunner/runner.go` and `runner/ollamarunner/runner.go`
  `NewSequence`, at 9db4bdbad^ lines 133-154 and 142-188): a prompt of `prompt` tokens longer than
  `num_ctx` keeps its first `keep` (= `num_keep`, default 4, api/types.go:1102; +1 for a BOS token in
  the llama runner, never more than `num_ctx`-1) and its last `num_ctx - keep` tokens:
  `limit` = `new` = `num_ctx`.
* v0.3.13 – v0.4.5 (`llama/runner/runner.go`, 96efd9052 and c4b34f2a2): the same cut, logged as
  `limit=… prompt=… numKeep=…` with no `new` (the runner kept exactly `limit` tokens).
* v0.30.0 – v0.30.8 (`llm/llama_server.go` `completionPromptForRequest`, 9db4bdbad: the runner is
  now llama-server; Ollama tokenizes and cuts before it): cut when `prompt` > `num_ctx`-1, to
  `num_ctx`-1 tokens: `limit` = `num_ctx` (logged), `new` = `num_ctx`-1.
* v0.30.9 – v0.30.10 (0f047feef): `limit` = `new` = `num_ctx`-1. (v0.30.9-rc1, bbb40a0a6, refused
  with HTTP 400 instead.)
* v0.30.11 and later (c191a145b, "preserve generation headroom for shifted prompts"; still so at
  fb30760, llm/llama_server.go:279-331): `keep` = `num_keep` (+1 when the tokenizer adds a BOS
  token), and `limit` = `num_ctx` - max((`num_ctx` - `keep`) // 2, 1): about half the context, the
  rest left free for the answer. `new` = `limit`. E.g. `num_ctx` 4096, `keep` 4 → `limit=2050`.

In every version `prompt_eval_count` then reports `new` (the old runners' `numPromptInputs` after the
cut; since v0.30 llama-server's `cache_n + prompt_n`, llm/llama_server.go:1511). With context shift
off (deepseek2 models, or a request's `"shift": false`; v0.30.9+) Ollama refuses instead: HTTP 400
"the prompt is longer than the context length currently available to the model; …"
(llm/llama_server.go:295-300). A request's `"truncate": false` (v0.12.6+) is never cut: before v0.30
the runner answered HTTP 400 "the input length exceeds the context length" (runner.go
`errorInputTooLong`); since v0.30 the whole prompt goes to llama-server, whose error Ollama passes on
(llm/llama_server.go:1648-1655; what that llama-server build answers was not verified here).

Where the log is (ollama/ollama docs/troubleshooting.mdx; app/server/server_unix.go:20,
server_windows.go:19): macOS `~/.ollama/logs/server.log`, Windows `%LOCALAPPDATA%\\Ollama\\server.log`
(both renamed to `server-1.log` … `server-5.log` at each server start, app/logrotate/logrotate.go);
Linux: the systemd unit `ollama`'s journal (`journalctl -u ollama`).

Privacy: with `OLLAMA_DEBUG` the log holds prompts. Only lines that carry the warning are decoded, and
only their numbers are kept; no log text is logged or stored.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from trayapp.core.overflow import ollama_whole_prompt_tokens
from trayapp.sources import log_tail

ENV_VAR = "LLM_TRAY_OLLAMA_LOG"  # "auto" | "off" | a path; wins over the setting monitor.ollama_log
JOURNAL_UNIT = "ollama"  # the unit Ollama's Linux installer creates (scripts/install.sh)
MARKER = b"truncating input prompt"
MAX_READ_BYTES = log_tail.MAX_READ_BYTES  # read at most this much of the file per poll
MAX_BACKLOG_BYTES = log_tail.MAX_BACKLOG_BYTES  # further behind: skip to the newest MAX_READ_BYTES
JOURNAL_TIMEOUT_S = 3.0
JOURNAL_EVERY_S = 5.0  # read the journal at most this often
JOURNAL_RECHECK_S = 60.0  # while it shows nothing for the unit, or cannot be read
JOURNAL_GROUP_HINT = (
    "add this user to the systemd-journal group (sudo usermod -aG systemd-journal $USER), then log in again"
)

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


# --------------------------------------------------------------------------- pure parsing


@dataclass(frozen=True)
class TruncationLine:
    """One `truncating input prompt` warning: counts only (see the module docstring for what they mean)."""

    time_wall_s: float | None  # the line's `time=` (Unix seconds); None when it has none
    limit: int
    prompt: int  # the prompt as sent, in tokens (Ollama's tokenizer)
    keep: int  # tokens kept from its start (num_keep, + BOS)
    new: int  # tokens the model read: `keep` + the tail
    source: str | None = None  # slog's `source=` file:line: runner.go:… before v0.30, llama_server.go:…
    new_logged: bool = True  # False: v0.3.13–v0.4.5's form (`numKeep=`, no `new=`): `new` is `limit`


# A slog text pair: key=value, the value quoted ("…", with \-escapes) or bare. Scanning the line
# pair by pair keeps a quoted value (a prompt in a debug line) from being read as pairs of its own.
_PAIR = re.compile(r'(?:^|(?<=\s))([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S*)')
_INT = re.compile(r"-?\d+")
_MSG = '"truncating input prompt"'


def _int(pairs: Mapping[str, str], key: str) -> int | None:
    value = pairs.get(key)
    return int(value) if value is not None and _INT.fullmatch(value) else None


def parse_slog_time(text: str) -> float | None:
    """slog's `time=` (RFC 3339 with milliseconds and the local offset, or `Z`) → Unix seconds."""
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def parse_truncation_line(line: str) -> TruncationLine | None:
    """One log line → a `TruncationLine` when it is Ollama's `truncating input prompt` warning, else None.

    Accepts any prefix before the slog pairs (a journal or container prefix). A line whose `msg` is
    not exactly the warning (a debug line quoting it inside a value) is not one.
    """
    pairs = {m.group(1): m.group(2) for m in _PAIR.finditer(line.rstrip("\r\n"))}
    if pairs.get("msg") != _MSG or pairs.get("level", "WARN") != "WARN":
        return None
    limit, prompt = _int(pairs, "limit"), _int(pairs, "prompt")
    keep, new = _int(pairs, "keep"), _int(pairs, "new")
    new_logged = True
    if keep is None:  # v0.3.13–v0.4.5: numKeep=, no new= (those runners kept exactly `limit` tokens)
        keep, new, new_logged = _int(pairs, "numKeep"), limit, False
    if limit is None or prompt is None or keep is None or new is None:
        return None
    stamp = pairs.get("time")
    return TruncationLine(
        time_wall_s=parse_slog_time(stamp) if stamp else None,
        limit=limit,
        prompt=prompt,
        keep=keep,
        new=new,
        source=pairs.get("source") or None,
        new_logged=new_logged,
    )


def parse_truncation_lines(text: str) -> list[TruncationLine]:
    """Every warning in a block of log text, in order."""
    return [t for line in text.splitlines() if (t := parse_truncation_line(line)) is not None]


OLD_RUNNERS = "0.29.0"  # a version under the Go runners' rule (a cut prompt keeps num_ctx tokens)
FIRST_LLAMA_SERVER = "0.30.0"  # a version under v0.30.0–v0.30.10's rule (it keeps num_ctx - 1)


def context_sizes(line: TruncationLine, version: str | None) -> tuple[int, ...]:
    """The `num_ctx` values the line can stand for, largest first: the sizes whose cut keeps exactly
    the line's `new` tokens, under the rule of the line's era for what a cut prompt keeps
    (`core/overflow.ollama_whole_prompt_tokens`, that rule's one home).

    The era shows in the line where it can: a `runner.go` source is the Go runners' (before v0.30),
    `new` = `limit` - 1 only v0.30.0–v0.30.8's; else the server's `version` decides (unknown: the
    newest rule). One value, except from v0.30.11 on, where two sizes a token apart keep the same
    (4095 and 4096 both keep 2050 with keep 4).
    """
    new, keep = line.new, line.keep
    if (line.source or "").startswith("runner.go"):
        era: str | None = OLD_RUNNERS
    elif new == line.limit - 1:
        era = FIRST_LLAMA_SERVER
    else:
        era = version
    candidates = {new, new + 1, 2 * new - keep, 2 * new - keep - 1}
    found = {n for n in candidates if n > 1 and ollama_whole_prompt_tokens(n, era, keep) == new}
    return tuple(sorted(found, reverse=True))


def attribute_truncation(
    line: TruncationLine, loaded: Sequence[tuple[str, int | None]], version: str | None
) -> tuple[str | None, int | None]:
    """(model, num_ctx) for a warning, from the loaded models `(name, /api/ps context_length)`.

    The model: the one whose context length the line stands for (`context_sizes`); else the only
    loaded model; else None (several could be it, or none is loaded any more). The context size: the
    model's own when the line agrees with it, else the line's (the largest value it can stand for).
    """
    sizes = context_sizes(line, version)
    matching = [(name, ctx) for name, ctx in loaded if ctx is not None and ctx in sizes]
    if len(matching) == 1:
        return matching[0]
    if matching and len({ctx for _name, ctx in matching}) == 1:
        return None, matching[0][1]  # several models of that size: which one cut it is unknown
    guess = sizes[0] if sizes else None
    if len(loaded) == 1 and not matching:
        return loaded[0][0], guess
    return None, guess


# --------------------------------------------------------------------------- where the log is


@dataclass(frozen=True)
class LogLocation:
    """What to read: a file, the journal of the unit `ollama`, or nothing (`why` says why)."""

    kind: Literal["file", "journal", "none"]
    path: Path | None = None
    why: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "file" and self.path is not None:
            return str(self.path)
        if self.kind == "journal":
            return f"journalctl -u {JOURNAL_UNIT}"
        return "nothing"


def auto_log_path(platform: str, environ: Mapping[str, str], home: Path) -> Path | None:
    """Where the Ollama app writes its server log on this OS; None where it writes none (Linux)."""
    if platform == "darwin":
        return home / ".ollama" / "logs" / "server.log"
    if platform == "win32":
        local = environ.get("LOCALAPPDATA")
        return (
            Path(local) / "Ollama" / "server.log"
            if local
            else home / "AppData" / "Local" / "Ollama" / "server.log"
        )
    return None


def log_location(
    setting: str,
    *,
    environ: Mapping[str, str] = os.environ,
    platform: str = sys.platform,
    home: Path | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> LogLocation:
    """What "auto" | "off" | a path (the setting, or `LLM_TRAY_OLLAMA_LOG` when set) reads here.

    auto: macOS `~/.ollama/logs/server.log`, Windows `%LOCALAPPDATA%\\Ollama\\server.log`, Linux the
    journal of the systemd unit `ollama` (when `journalctl` exists).
    """
    value = (environ.get(ENV_VAR) or setting or "auto").strip()
    if value.lower() == "off":
        return LogLocation("none", why="reading Ollama's log is off")
    if value.lower() != "auto":
        return LogLocation("file", Path(value).expanduser())
    path = auto_log_path(platform, environ, home or Path.home())
    if path is not None:
        return LogLocation("file", path)
    if platform.startswith("linux"):
        if which("journalctl"):
            return LogLocation("journal")
        return LogLocation(
            "none",
            why=f"no journalctl here to read Ollama's log: set monitor.ollama_log or {ENV_VAR} to its path",
        )
    return LogLocation("none", why=f"no known Ollama log on {platform}: set monitor.ollama_log or {ENV_VAR}")


# --------------------------------------------------------------------------- reading a file


class FileTail(log_tail.FileTail):
    """Ollama's log file, tailed (`trayapp/sources/log_tail.py`): lines with the warning's marker,
    named "Ollama's log" in the reasons; rotated to `server-1.log` at each start of the app."""

    def __init__(
        self, path: Path, *, max_read_bytes: int = MAX_READ_BYTES, max_backlog_bytes: int = MAX_BACKLOG_BYTES
    ) -> None:
        super().__init__(
            path,
            markers=(MARKER,),
            label="Ollama's log",
            max_read_bytes=max_read_bytes,
            max_backlog_bytes=max_backlog_bytes,
        )


# --------------------------------------------------------------------------- reading the journal


class JournalTail:
    """New entries of the systemd unit `ollama`'s journal, read with `journalctl` now and then.

    The first call asks for the newest entry only, for its cursor (so the history before is never
    read), then each call reads what came after the cursor (`--after-cursor`), at most every
    `every_s`, each run bounded by `timeout_s`. While the unit has no entries it asks again every
    `recheck_s` for what came since the start (`--since=@<start>`). A journal this user may not read
    (journalctl's "not seeing messages from other users and the system" hint) is a reason saying how
    to allow it.
    """

    def __init__(
        self,
        *,
        run: Runner = subprocess.run,
        unit: str = JOURNAL_UNIT,
        start_wall_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = JOURNAL_TIMEOUT_S,
        every_s: float = JOURNAL_EVERY_S,
        recheck_s: float = JOURNAL_RECHECK_S,
    ) -> None:
        self._run = run
        self.unit = unit
        self._start_wall_s = time.time() if start_wall_s is None else start_wall_s
        self._clock = clock
        self.timeout_s = timeout_s
        self.every_s = every_s
        self.recheck_s = recheck_s
        self._cursor: str | None = None
        self._checked = False  # the first call (newest entry, for its cursor) was made
        self._next_at: float | None = None
        self._reason: str | None = None

    def read(self) -> tuple[list[str], str | None]:
        now = self._clock()
        if self._next_at is not None and now < self._next_at:
            return [], self._reason
        argv = ["journalctl", "-u", self.unit, "-o", "cat", "--no-pager", "--show-cursor"]
        if self._cursor is not None:
            argv.append(f"--after-cursor={self._cursor}")
        elif not self._checked:
            argv += ["-n", "1"]
        else:
            argv.append(f"--since=@{int(self._start_wall_s)}")
        lines, self._reason = self._call(argv)
        if not self._checked:
            self._checked, lines = True, []  # the newest entry before the start is history
        self._next_at = now + (
            self.every_s if self._cursor is not None and self._reason is None else self.recheck_s
        )
        return lines, self._reason

    def _call(self, argv: list[str]) -> tuple[list[str], str | None]:
        label = f"journalctl -u {self.unit}"
        try:
            done = self._run(
                argv,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return [], f"{label} did not answer within {self.timeout_s:g} s"
        except OSError as exc:
            return [], f"{label} could not run: {exc.strerror or exc}"
        stderr = done.stderr or ""
        if "insufficient permissions" in stderr or "not seeing messages from other users" in stderr:
            return [], f"Ollama's journal ({label}) is not readable by this user: {JOURNAL_GROUP_HINT}"
        no_entries = (
            f"no entries of the systemd unit {self.unit} in the journal (is Ollama a systemd service?)"
        )
        if "No journal files were found" in stderr:
            return [], f"no journal to read here ({label}: no journal files were found)"
        if done.returncode != 0 and not stderr.strip() and not (done.stdout or "").strip():
            return [], no_entries  # systemd 252: --show-cursor with nothing shown exits 1, silently
        if done.returncode != 0:
            first = next((s.strip() for s in stderr.splitlines() if s.strip()), "")[:200]
            return [], f"{label} failed (exit {done.returncode}){': ' + first if first else ''}"
        lines: list[str] = []
        for line in (done.stdout or "").splitlines():
            if line.startswith("-- cursor: "):
                self._cursor = line[len("-- cursor: ") :].strip() or self._cursor
            elif "truncating input prompt" in line:
                lines.append(line)
        if self._cursor is None:
            return lines, no_entries
        return lines, None


# --------------------------------------------------------------------------- the reader


class OllamaLogReader:
    """New `truncating input prompt` warnings from Ollama's log, wherever it is on this machine.

    `poll()` never raises for the OS's reasons and never blocks for long (a file read is bounded by
    `MAX_READ_BYTES`, a journal read by its timeout); `reason` says why nothing can be read now
    (a missing file, permission denied, …), `where` what is read. Not thread-safe: one poll thread.
    """

    def __init__(
        self,
        location: LogLocation,
        *,
        run: Runner = subprocess.run,
        clock: Callable[[], float] = time.monotonic,
        max_read_bytes: int = MAX_READ_BYTES,
    ) -> None:
        self.location = location
        self.reason: str | None = location.why
        self._file: FileTail | None = None
        self._journal: JournalTail | None = None
        if location.kind == "file" and location.path is not None:
            self._file = FileTail(location.path, max_read_bytes=max_read_bytes)
        elif location.kind == "journal":
            self._journal = JournalTail(run=run, clock=clock)

    @property
    def where(self) -> str:
        return self.location.label

    def poll(self) -> list[TruncationLine]:
        tail = self._file or self._journal
        if tail is None:
            return []
        lines, self.reason = tail.read()
        return [t for line in lines if (t := parse_truncation_line(line)) is not None]
