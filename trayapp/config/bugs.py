"""The one way a thread's boundary reports a bug: logged once per distinct failure, with its traceback.

Each long-lived thread (the sampler's tick, a probe's poll, the store writer, the
dashboard's background jobs) catches the failures it knows — HTTP, timeouts,
`UnexpectedAnswer`, `sqlite3.Error`, `OSError` on files — and maps them to the reason
the user sees. Anything else is a bug: `BugLog.report` logs it with its traceback the
first time it happens, says "internal error: …" for the status, and stays quiet when
the same bug comes back at the next tick. (Plumbing every layer above `core` uses;
`core` is pure and logs nothing.)
"""

from __future__ import annotations

import logging
import threading
import traceback

MAX_REMEMBERED_BUGS = 32  # distinct bugs remembered per boundary; past it, the memory starts afresh


KNOWN_FAILURE_MODULES = ("trayapp.", "httpx", "httpcore", "sqlite3", "ssl", "keyring")


def is_known_failure(exc: BaseException) -> bool:
    """A failure a boundary reports without a traceback: the OS's (`OSError`, timeouts included),
    HTTP's, SQLite's, TLS's, the keyring's, or one of this project's own error types (each says
    what went wrong for the user). Anything else — `KeyError`, `TypeError`, a bare `ValueError` —
    is a bug."""
    if isinstance(exc, OSError):
        return True
    module = type(exc).__module__
    return any(module == prefix.rstrip(".") or module.startswith(prefix) for prefix in KNOWN_FAILURE_MODULES)


def internal_error(exc: BaseException) -> str:
    """The reason a status shows for a bug."""
    return f"internal error: {type(exc).__name__}: {exc}"


def bug_signature(exc: BaseException) -> str:
    """What makes two failures the same bug: the type, the message and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__}: {exc} @ {where}"


class BugLog:
    """One boundary's memory of the bugs it has logged (safe from any thread)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def report(self, exc: BaseException, where: str) -> str:
        """Log `exc` with its traceback unless this bug was logged already; the status reason."""
        signature = bug_signature(exc)
        with self._lock:
            first = signature not in self._seen
            if first:
                if len(self._seen) >= MAX_REMEMBERED_BUGS:
                    self._seen.clear()
                self._seen.add(signature)
        if first:
            self._log.error("%s: internal error (logged once)", where, exc_info=exc)
        return internal_error(exc)
