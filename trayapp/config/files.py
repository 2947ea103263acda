"""The one atomic file write: readers see the old file or the new one, never a part of either.

The data goes to a temp file of a unique name in the target's folder (so two writers of one
path never share one), is flushed and fsynced, then `os.replace`d over the target, and the
folder is fsynced where the OS allows it (POSIX), so the rename itself survives a power cut. On
any failure the temp file is removed, the target is left as it was, and the error propagates.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload

DEFAULT_PERMISSIONS = 0o666  # as `open()`: the umask takes its share
PRIVATE_PERMISSIONS = 0o600  # for files holding a token or a process's address

_WINDOWS_FLAGS = getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0)
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _WINDOWS_FLAGS


def _create_temp(path: Path, permissions: int) -> tuple[int, Path]:
    """An exclusive new file beside `path` (created with `permissions`, less the umask)."""
    while True:
        temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temp, _OPEN_FLAGS, permissions), temp
        except FileExistsError:
            continue


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable; a no-op where folders cannot be opened (Windows)."""
    if os.name == "nt":
        return
    with contextlib.suppress(OSError):  # some file systems refuse to fsync a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@overload
def atomic_output(
    path: str | os.PathLike[str],
    mode: Literal["w"] = "w",
    *,
    encoding: str = "utf-8",
    newline: str | None = None,
    fsync: bool = True,
    permissions: int = DEFAULT_PERMISSIONS,
) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_output(
    path: str | os.PathLike[str],
    mode: Literal["wb"],
    *,
    encoding: None = None,
    newline: None = None,
    fsync: bool = True,
    permissions: int = DEFAULT_PERMISSIONS,
) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_output(
    path: str | os.PathLike[str],
    mode: Literal["w", "wb"] = "w",
    *,
    encoding: str | None = "utf-8",
    newline: str | None = None,
    fsync: bool = True,
    permissions: int = DEFAULT_PERMISSIONS,
) -> contextlib.AbstractContextManager[IO[Any]]:
    """A context manager yielding the open temp file (text for "w", binary for "wb"): when the
    block ends normally it replaces `path`; when it raises, `path` is untouched and the temp file
    removed. For writers that stream (an export of a million rows)."""
    return _atomic_output(Path(path), mode, encoding if mode == "w" else None, newline, fsync, permissions)


@contextlib.contextmanager
def _atomic_output(
    path: Path, mode: str, encoding: str | None, newline: str | None, fsync: bool, permissions: int
) -> Iterator[IO[Any]]:
    fd, temp = _create_temp(path, permissions)
    try:
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as file:
            yield file
            file.flush()
            if fsync:
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    if fsync:
        _fsync_folder(path.parent)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, fsync: bool = True, permissions: int = DEFAULT_PERMISSIONS
) -> None:
    """Replace `path` with `data` atomically (see the module's docstring)."""
    with atomic_output(path, "wb", fsync=fsync, permissions=permissions) as file:
        file.write(data)


def atomic_write_text(
    path: str | os.PathLike[str],
    text: str,
    *,
    encoding: str = "utf-8",
    fsync: bool = True,
    permissions: int = DEFAULT_PERMISSIONS,
) -> None:
    """Replace `path` with `text` atomically (see the module's docstring)."""
    with atomic_output(path, "w", encoding=encoding, fsync=fsync, permissions=permissions) as file:
        file.write(text)
