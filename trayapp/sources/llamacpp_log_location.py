"""Where a llama-server process writes its log (`locate_log`): its `--log-file`, else the file its
stderr (stdout with `--log-jsonl`) goes to, or why it cannot be read from here (llamacpp_log.py reads it)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

LOG_FILE_ENV = "LLAMA_ARG_LOG_FILE"
LOG_JSONL_ENV = "LLAMA_ARG_LOG_JSONL"
LOG_VERBOSITY_ENV = "LLAMA_ARG_LOG_VERBOSITY"
INFO_VERBOSITY = 3  # LOG_LEVEL_INFO: a threshold below it hides the release lines
ERROR_VERBOSITY = 1  # LOG_LEVEL_ERROR: below it, the refusals too

_PSUTIL_ERRORS = (psutil.NoSuchProcess, psutil.ZombieProcess, OSError)


@dataclass(frozen=True)
class LogFile:
    """Where a llama-server process writes its log: `path` to read, or `why` it cannot be read.

    `where` says how it was found ("--log-file /x.log", "its stderr, /x.log"); `note` what the log
    leaves out at the server's verbosity (None: nothing that matters here)."""

    path: Path | None
    where: str
    why: str | None = None
    note: str | None = None


def _option(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last `--name VALUE` / `--name=VALUE` among `args` (llama.cpp: the last wins)."""
    value: str | None = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif name.startswith("--") and arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
    return value


def _flag(args: Sequence[str], on: str, off: str) -> bool | None:
    """True / False by the last of `on` / `off` in `args`; None when neither is there."""
    state: bool | None = None
    for arg in args:
        if arg == on:
            state = True
        elif arg == off:
            state = False
    return state


def _truthy(value: str | None) -> bool:
    """A boolean `LLAMA_ARG_*` variable as llama-server reads it (checked on b11434: "1", "true", "on"
    and "enabled" turn `LLAMA_ARG_LOG_JSONL` on; "yes" is refused at start)."""
    return (value or "").strip().lower() in ("on", "enabled", "true", "1")


@dataclass(frozen=True)
class LogOptions:
    """What a llama-server's command line and environment say about its log."""

    log_file: str | None = None
    jsonl: bool = False
    disabled: bool = False
    verbosity: int | None = None


def log_options(cmdline: Sequence[str], environ: Mapping[str, str]) -> LogOptions:
    """The log options of a llama-server from its argv and environment (an argument wins over its
    `LLAMA_ARG_*` variable, as in llama.cpp)."""
    args = list(cmdline[1:])
    log_file = _option(args, ("--log-file",)) or environ.get(LOG_FILE_ENV) or None
    jsonl = _flag(args, "--log-jsonl", "--no-log-jsonl")
    verbosity = _option(args, ("-lv", "--verbosity", "--log-verbosity")) or environ.get(LOG_VERBOSITY_ENV)
    level: int | None
    try:
        level = int(verbosity) if verbosity is not None else None
    except ValueError:
        level = None
    if any(arg in ("-v", "--verbose", "--log-verbose") for arg in args):
        level = None  # everything is logged
    return LogOptions(
        log_file=log_file,
        jsonl=_truthy(environ.get(LOG_JSONL_ENV)) if jsonl is None else jsonl,
        disabled="--log-disable" in args,
        verbosity=level,
    )


def _verbosity_note(level: int | None) -> str | None:
    if level is not None and level < ERROR_VERBOSITY:
        return f"at -lv {level} llama-server logs neither refusals nor cut answers"
    if level is not None and level < INFO_VERBOSITY:
        return f"at -lv {level} llama-server logs refusals but not answers cut short (info lines)"
    return None


def _kind_of(mode: int, target: str) -> str:
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if target == os.devnull:
        return os.devnull + " (discarded)"
    if stat.S_ISCHR(mode):
        return "a terminal" if target.startswith(("/dev/pts/", "/dev/tty")) else f"a device ({target})"
    return f"not a file ({target})"


def _stream_on_linux(pid: int, fd: int, proc_root: Path) -> tuple[Path | None, str]:
    """(the regular file fd `fd` of `pid` writes to, or None; what it is, in words)."""
    link = proc_root / str(pid) / "fd" / str(fd)
    target = os.readlink(link)  # PermissionError: another user's process
    st = os.stat(link)
    if not stat.S_ISREG(st.st_mode):
        return None, _kind_of(st.st_mode, target)
    if target.endswith(" (deleted)"):
        return link, f"a deleted file, {target[: -len(' (deleted)')]}"
    try:
        same = os.stat(target)
        if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
            return Path(target), target
    except OSError:
        pass
    return link, target  # another mount namespace (a container): read it through the process


def _stream_by_psutil(proc: psutil.Process, fd: int) -> tuple[Path | None, str]:
    """macOS and the BSDs: the file psutil lists open on `fd`, when it is a regular file."""
    for opened in proc.open_files():
        if getattr(opened, "fd", -1) == fd:
            return Path(opened.path), opened.path
    return None, "not a file (a terminal, a pipe or a socket)"


def _uid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.uids().real)
    except (AttributeError, *_PSUTIL_ERRORS, psutil.AccessDenied):
        return None


def _names(proc: psutil.Process, cmdline: Sequence[str]) -> tuple[str, ...]:
    """Its argv[0]'s file name and the process's name, lower case."""
    try:
        name = proc.name()
    except (psutil.AccessDenied, *_PSUTIL_ERRORS):
        name = ""
    first = os.path.basename(cmdline[0].replace("\\", "/")) if cmdline else ""
    return tuple(n.lower() for n in (first, name) if n)


def locate_log(
    pid: int,
    *,
    platform: str = sys.platform,
    proc_root: Path = Path("/proc"),
    name_has: str | None = "llama",
) -> LogFile:
    """Where the llama-server process `pid` writes its log (never raises for the OS's reasons).

    A process whose name and argv[0] lack `name_has` is not llama-server itself (Docker's port
    forwarder in front of one in a container): its own output is not the server's log."""
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
    except psutil.AccessDenied:
        return LogFile(
            None, "nothing", why=f"llama-server (pid {pid}) runs as another user: its log cannot be read here"
        )
    except _PSUTIL_ERRORS:
        return LogFile(None, "nothing", why=f"llama-server (pid {pid}) is gone")
    names = _names(proc, cmdline)
    if name_has is not None and names and not any(name_has in n for n in names):
        return LogFile(
            None,
            "nothing",
            why=f"the process on its port (pid {pid}, {names[0]}) is not llama-server itself (a container's "
            "port forwarder?): its log cannot be found from here",
        )
    own_uid = os.getuid() if hasattr(os, "getuid") else None
    uid = _uid(proc)
    other_user = own_uid is not None and uid is not None and uid != own_uid and own_uid != 0
    try:
        environ: Mapping[str, str] = proc.environ()
    except (psutil.AccessDenied, *_PSUTIL_ERRORS):
        environ = {}
    options = log_options(cmdline, environ)
    note = _verbosity_note(options.verbosity)
    if options.log_file:
        path = Path(options.log_file).expanduser()
        if not path.is_absolute():
            try:
                path = Path(proc.cwd()) / path
            except (psutil.AccessDenied, *_PSUTIL_ERRORS):
                return LogFile(
                    None,
                    f"--log-file {options.log_file}",
                    why=f"llama-server (pid {pid}) logs to {options.log_file}, relative to a working "
                    "directory this user cannot see",
                )
        return LogFile(path, f"--log-file {path}", note=note)
    if options.disabled:
        return LogFile(None, "nothing", why="llama-server runs with --log-disable: it writes no log")
    fd, stream = (1, "stdout") if options.jsonl else (2, "stderr")
    if other_user:
        return LogFile(
            None,
            f"its {stream}",
            why=f"llama-server (pid {pid}) runs as another user: its log cannot be read here",
        )
    hint = (
        "start it with --log-file PATH, or send its output to a file, to see its refusals without the proxy"
    )
    try:
        if platform.startswith("linux") and (proc_root / str(pid) / "fd").is_dir():
            found, what = _stream_on_linux(pid, fd, proc_root)
        elif platform == "darwin" or "bsd" in platform:
            found, what = _stream_by_psutil(proc, fd)
        else:
            return LogFile(
                None, f"its {stream}", why=f"only llama-server's --log-file is read on {platform}: {hint}"
            )
    except PermissionError:
        return LogFile(
            None,
            f"its {stream}",
            why=f"this user may not see where llama-server (pid {pid}) writes its log (another user's "
            "process?): it cannot be read here",
        )
    except (psutil.AccessDenied, *_PSUTIL_ERRORS) as exc:
        return LogFile(
            None, f"its {stream}", why=f"llama-server's {stream} (pid {pid}) cannot be looked up: {exc}"
        )
    if found is None:
        return LogFile(
            None,
            f"its {stream}",
            why=f"llama-server (pid {pid}) logs to its {stream}, which is {what}: {hint}",
        )
    return LogFile(found, f"its {stream}, {what}", note=note)
