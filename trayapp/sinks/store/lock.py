"""The one-writer lock: an exclusive, non-blocking lock on `<db>.lock` holding the writer's pid."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from trayapp.sinks.store.schema import StoreLockedError

_WIN_LOCK_OFFSET = 4096  # Windows locks are mandatory: lock a byte past the pid text


def lock_path_for(db_path: Path) -> Path:
    """Where the writer lock of the store at `db_path` lives."""
    return db_path.with_name(db_path.name + ".lock")


def acquire_lock(lock_path: Path, db_path: Path) -> int:
    """Take the one-writer lock (non-blocking) and write our pid into the lock file.

    Returns the lock file's descriptor (pass it to `release_lock`); raises
    `StoreLockedError` naming the holder's pid when another process has it.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        if sys.platform == "win32":
            import msvcrt

            os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        os.close(fd)
        pid = text if text.isdigit() else "unknown"
        raise StoreLockedError(
            f"another llm-tray process (pid {pid}) is already recording to {db_path}"
        ) from None
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid():<20}\n".encode("ascii"))
    return fd


def release_lock(fd: int) -> None:
    """Give the lock back and close its descriptor."""
    if sys.platform == "win32":
        import msvcrt

        with contextlib.suppress(OSError):
            os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    os.close(fd)
