"""Reading what a server appends to its log file: from where the file was at the first read, bounded.

Any server's log (Ollama's `server.log`, a llama-server's `--log-file` or the file its stderr goes to)
is read the same way: `FileTail` starts at the file's end, returns the complete new lines that carry
one of its markers (every other line is passed over unread as text), follows a rotation or a file cut
short in place, and never reads more than `max_read_bytes` per call. The server-specific parts — where
the log is, which markers, what a line means — stay with that server (`ollama_log.py`,
`servers/llamacpp_log.py`).

Privacy: a server's log can hold prompts (Ollama with `OLLAMA_DEBUG`, llama-server with `-v`). Only
lines with a marker are decoded and handed back, for the caller to keep their numbers; no log text is
logged here.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

MAX_READ_BYTES = 256 * 1024  # read at most this much of the file per call
MAX_BACKLOG_BYTES = 16 * 1024 * 1024  # further behind than this, skip to the newest MAX_READ_BYTES
MAX_LINE_BYTES = 64 * 1024  # a partial line longer than this is dropped (the lines wanted are short)


def default_rotated_names(path: Path) -> tuple[Path, ...]:
    """Where a rotation moves a log: `server-1.log` (the Ollama app), `server.log.1` (logrotate)."""
    return (path.with_name(f"{path.stem}-1{path.suffix}"), Path(f"{path}.1"))


def lines_with_markers(block: bytes, markers: Sequence[bytes]) -> list[str]:
    """The lines of `block` that carry one of `markers`, decoded (undecodable bytes replaced)."""
    if not any(marker in block for marker in markers):
        return []
    return [
        raw.decode("utf-8", "replace")
        for raw in block.split(b"\n")
        if any(marker in raw for marker in markers)
    ]


class FileTail:
    """Reads what is appended to one file from where it was at the first `read`, bounded per call.

    The first `read` that finds the file starts at its end; a file that did not exist then, and
    appears later, is read from its start. A file replaced (a new inode: Ollama renames `server.log`
    to `server-1.log` at each server start) is finished from its rotated name when found there
    (`rotated_names`) and read again from its start; one cut short in place (copytruncate, or a
    llama-server restarted on its `--log-file`, which it opens with "w") is read from its start. Only
    complete lines are returned; the file is opened and closed on each read (on Windows an open
    handle would stop Ollama's rotation).

    `label` names the log in the reasons and messages ("Ollama's log", "llama-server's log"), always
    followed by the file's path.
    """

    def __init__(
        self,
        path: Path,
        *,
        markers: Sequence[bytes],
        label: str,
        max_read_bytes: int = MAX_READ_BYTES,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        rotated_names: Callable[[Path], Sequence[Path]] = default_rotated_names,
    ) -> None:
        if not markers or not all(markers):
            raise ValueError("FileTail needs at least one non-empty marker")
        self.path = path
        self.markers = tuple(markers)
        self.label = label
        self.max_read_bytes = max_read_bytes
        self.max_backlog_bytes = max_backlog_bytes
        self._rotated_names = rotated_names
        self._ident: tuple[int, int] | None = None
        self._pos: int | None = None  # None until the file was first seen
        self._missing_at_start = False
        self._started = False
        self._partial = b""
        self._dropping = False  # inside an over-long line: skip to its end
        self.skipped_bytes = 0  # bytes passed over because reading fell too far behind

    def read(self) -> tuple[list[str], str | None]:
        """(the new lines that carry a marker, why the file cannot be read now or None)."""
        first = not self._started
        self._started = True
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._missing_at_start = self._missing_at_start or first
            self._ident, self._pos = None, (0 if self._pos is not None else None)
            self._partial, self._dropping = b"", False
            return [], f"{self.label} {self.path} does not exist"
        except OSError as exc:
            return [], self._unreadable(exc)
        ident = (st.st_dev, st.st_ino)
        lines: list[str] = []
        if self._ident is None:
            if self._pos is None and not self._missing_at_start:
                self._ident, self._pos = ident, st.st_size  # at start: only what comes next
                return [], None
            self._pos = 0  # appeared (again) after the start: all of it is new
        elif ident != self._ident:
            lines += self._finish_rotated()
            self._pos, self._partial, self._dropping = 0, b"", False
        elif st.st_size < (self._pos or 0):
            self._pos, self._partial, self._dropping = 0, b"", False
        self._ident = ident
        if st.st_size == self._pos and stat.S_ISREG(st.st_mode):
            return lines, None  # nothing appended: not opened and read (most polls, issue #26)
        try:
            lines += self._read_from(self.path, st.st_size)
        except OSError as exc:
            return lines, self._unreadable(exc)
        return lines, None

    def _unreadable(self, exc: OSError) -> str:
        why = "permission denied" if isinstance(exc, PermissionError) else (exc.strerror or str(exc))
        return f"{self.label} at {self.path} is not readable: {why}"

    def _read_from(self, path: Path, size: int) -> list[str]:
        pos = self._pos or 0
        if size - pos > self.max_backlog_bytes:
            skip_to = size - self.max_read_bytes
            self.skipped_bytes += skip_to - pos
            behind = size - pos
            log.info("%s: %d bytes behind, skipped to its newest %d", self.label, behind, self.max_read_bytes)
            pos, self._partial, self._dropping = skip_to, b"", True
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read(self.max_read_bytes)
        self._pos = pos + len(data)
        return self._complete_lines(data)

    def _complete_lines(self, data: bytes) -> list[str]:
        end = data.rfind(b"\n")
        if end < 0:
            self._keep_partial(data)
            return []
        block, rest = self._partial + data[: end + 1], data[end + 1 :]
        if self._dropping:  # the start of the block is the end of an over-long line
            block = block[block.find(b"\n") + 1 :]
            self._dropping = False
        self._partial = b""
        self._keep_partial(rest)
        return lines_with_markers(block, self.markers)

    def _keep_partial(self, data: bytes) -> None:
        if self._dropping:
            return
        self._partial += data
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._dropping = b"", True

    def _finish_rotated(self) -> list[str]:
        """The unread end of the file just replaced, where rotation moved it."""
        old_ident, pos = self._ident, self._pos or 0
        for rotated in self._rotated_names(self.path):
            try:
                st = os.stat(rotated)
                if (st.st_dev, st.st_ino) != old_ident or st.st_size <= pos:
                    continue
                self._pos = pos
                lines = self._read_from(rotated, st.st_size)
                if self._pos == st.st_size and self._partial:  # its last line, unended: it is complete
                    lines += self._complete_lines(b"\n")
                return lines
            except OSError:
                continue
        return []
