"""The one atomic file write, the one private-file rule, the one checked reader of a secret file and
the one bounded read of an open file.

An atomic write: readers see the old file or the new one, never a part of either.

The data goes to a temp file of a unique name in the target's folder (so two writers of one
path never share one), is flushed and fsynced, then `os.replace`d over the target, and the
folder is fsynced where the OS allows it (POSIX), so the rename itself survives a power cut. On
any failure the temp file is removed, the target is left as it was, and the error propagates. The
temp file is opened with `O_EXCL | O_NOFOLLOW`: a file or link planted at its name is never written
through.

Private files (docs/security.md, "Files and permissions"): llm-tray's folders are 0700 and what it
keeps in them (the store, its log, the sampler file, tokens) 0600; `private_dir` and `make_private`
create them so and tighten a looser one llm-tray owns. `read_secret_file` is the one way a token file
is read: a regular file (never followed through a link), owned by this user, readable by no one else;
anything else is refused with the command that fixes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload

DEFAULT_PERMISSIONS = 0o666  # as `open()`: the umask takes its share
PRIVATE_PERMISSIONS = 0o600  # for files holding a token or a process's address

_WINDOWS_FLAGS = getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; Windows has no symlink to follow at open
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _WINDOWS_FLAGS
PRIVATE_DIR_PERMISSIONS = 0o700
SECRET_FILE_MAX_BYTES = 64 * 1024  # a token is a line; a bigger file is not one


def read_at_most(fd: int, max_bytes: int, chunk_bytes: int = 65536) -> bytes:
    """Up to `max_bytes` of an open file, read to its end or to that bound (a short read is not the
    end); OSError as os.read raises it."""
    chunks: list[bytes] = []
    size = 0
    while size < max_bytes:
        chunk = os.read(fd, min(chunk_bytes, max_bytes - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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


# --------------------------------------------------------------------------- private files


class SecretFileError(ValueError):
    """A secret (token) file llm-tray refuses to use; the message says why and what fixes it."""


def _owned_by_me(st: os.stat_result) -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is None or st.st_uid == geteuid()


def make_private(path: Path, permissions: int = PRIVATE_PERMISSIONS) -> None:
    """Tighten `path` to `permissions` when it is looser and this user owns it (never through a
    link; a no-op on Windows and for a path that is not there or cannot be changed)."""
    if os.name == "nt":
        return
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not _owned_by_me(st):
            return
        if stat.S_IMODE(st.st_mode) & ~permissions:
            os.chmod(path, stat.S_IMODE(st.st_mode) & permissions)


def private_dir(path: Path) -> Path:
    """`path` as a folder only this user can enter (0700): created so, or tightened when llm-tray
    owns it. Never raises: a folder that cannot be made (a read-only home) is left to the first
    write, which says so; reading still works."""
    with contextlib.suppress(OSError):
        path.mkdir(mode=PRIVATE_DIR_PERMISSIONS, parents=True, exist_ok=True)
    make_private(path, PRIVATE_DIR_PERMISSIONS)
    return path


def create_private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 when it is not there (so what SQLite or a log handler
    then opens is private from the first byte); tighten it when it is. Raises OSError."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _WINDOWS_FLAGS, PRIVATE_PERMISSIONS
        )
    except FileExistsError:
        make_private(path)
        return
    os.close(fd)


def read_secret_file(path: Path) -> str | None:
    """The text of the secret file `path`, stripped; None when there is none.

    Refused (SecretFileError, naming the fix): a symbolic link, anything but a regular file, a file
    another user owns, one the group or others may read or write, one that cannot be read, one that
    is not UTF-8 or is larger than a token can be."""
    flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOINHERIT", 0)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise SecretFileError(
            f"{path} is a symbolic link: llm-tray reads a token only from a regular file "
            f'(replace the link with the file: cp --remove-destination "$(readlink -f {path})" {path})'
        )
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SecretFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)  # the file opened, not the name looked up: nothing swapped between
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(
                f"{path} is not a regular file: remove it, or put the token in a file there"
            )
        if os.name != "nt":
            if not _owned_by_me(st):
                raise SecretFileError(
                    f"{path} belongs to another user (uid {st.st_uid}): llm-tray uses only a token file "
                    f"you own (chown $(id -u) {path})"
                )
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise SecretFileError(
                    f"{path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                    f"chmod 600 {path}"
                )
        data = read_at_most(fd, SECRET_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise SecretFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > SECRET_FILE_MAX_BYTES:
        raise SecretFileError(f"{path} is larger than a token ({SECRET_FILE_MAX_BYTES} bytes at most)")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretFileError(f"{path} is not UTF-8 text: write the token again") from None
