"""Find local LLM server processes with psutil (best effort, never raises).

Since v0.30 Ollama runs one upstream `llama-server` child per loaded GGUF
model on a random loopback port (`llama-server --model <blob> --port N
--no-webui ...`, reference/backends.md §1.1). Its `/slots` is the only way to
see live decode progress of an Ollama model without a proxy.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from trayapp.core.vram_holders import OTHER_USER
from trayapp.sources.procfs import read_bytes

OLLAMA_NAMES = ("ollama", "ollama.exe")
LLAMA_SERVER_NAMES = ("llama-server", "llama-server.exe")

_PSUTIL_ERRORS = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError)


@dataclass(frozen=True)
class ChildServer:
    """A `llama-server` process started by Ollama."""

    pid: int
    port: int | None
    model_path: str | None
    parent_pid: int | None


def parse_server_args(cmdline: Sequence[str]) -> tuple[int | None, str | None]:
    """(port, model path) from a llama-server command line; None where absent or malformed."""
    port: int | None = None
    model: str | None = None
    args = list(cmdline[1:])
    for i, arg in enumerate(args):
        value: str | None = None
        name = arg
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
        elif i + 1 < len(args):
            value = args[i + 1]
        if value is None:
            continue
        if name == "--port":
            try:
                port = int(value)
            except ValueError:
                port = None
        elif name in ("-m", "--model"):
            model = value
    return port, model


def _basename(path: str | None) -> str:
    return os.path.basename(path or "").lower()


def _is_llama_server(name: str | None, exe: str | None, cmdline: Sequence[str] | None) -> bool:
    candidates = {(name or "").lower(), _basename(exe)}
    if cmdline:
        candidates.add(_basename(cmdline[0]))
    return any(c in LLAMA_SERVER_NAMES for c in candidates)


def process_name(pid: int) -> str | None:
    """A process's name; `OTHER_USER` when the system hides it from us; None when it is gone."""
    try:
        return str(psutil.Process(pid).name())
    except psutil.AccessDenied:
        return OTHER_USER
    except _PSUTIL_ERRORS:
        return None


def find_ollama_children() -> list[ChildServer]:
    """Every `llama-server` whose parent process is named `ollama`; [] when none or not allowed."""
    children: list[ChildServer] = []
    try:
        processes = list(psutil.process_iter(["pid", "ppid", "name", "exe", "cmdline"]))
    except _PSUTIL_ERRORS:
        return children
    for proc in processes:
        info = proc.info
        cmdline = info.get("cmdline") or []
        if not _is_llama_server(info.get("name"), info.get("exe"), cmdline):
            continue
        parent_pid = info.get("ppid")
        if not parent_pid or (process_name(parent_pid) or "").lower() not in OLLAMA_NAMES:
            continue
        port, model = parse_server_args(cmdline)
        children.append(ChildServer(pid=info["pid"], port=port, model_path=model, parent_pid=parent_pid))
    return children


def _listening_pid(connections: Sequence[object], port: int) -> int | None:
    for conn in connections:
        laddr = getattr(conn, "laddr", None)
        if getattr(conn, "status", None) == psutil.CONN_LISTEN and laddr and laddr.port == port:
            pid = getattr(conn, "pid", None)
            if pid:
                return int(pid)
    return None


def find_child_by_alias(parent_pid: int, alias: str) -> int | None:
    """The child of `parent_pid` started with `--alias ALIAS` (a llama-server router's child for
    one model); None when there is none or the OS does not say."""
    try:
        children = psutil.Process(parent_pid).children()
    except _PSUTIL_ERRORS:
        return None
    for child in children:
        try:
            args = child.cmdline()
        except _PSUTIL_ERRORS:
            continue
        if any(arg == "--alias" and value == alias for arg, value in itertools.pairwise(args)):
            return int(child.pid)
    return None


def find_listening_pid(port: int) -> int | None:
    """The pid listening on a local TCP port, when the OS lets us see it; else None.

    `psutil.net_connections` needs root on macOS and only reports our own
    processes' pids elsewhere, so fall back to asking each process in turn.
    """
    try:
        pid = _listening_pid(psutil.net_connections(kind="tcp"), port)
        if pid is not None:
            return pid
    except _PSUTIL_ERRORS:
        pass
    try:
        processes = list(psutil.process_iter(["pid"]))
    except _PSUTIL_ERRORS:
        return None
    for proc in processes:
        try:
            conns = proc.net_connections(kind="tcp")
        except _PSUTIL_ERRORS:
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return int(proc.pid)
    return None


_LINUX = sys.platform.startswith("linux")
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if _LINUX else 100


def proc_stat_cpu_seconds(pid: int, proc_root: str = "/proc") -> float | None:
    """User + system CPU seconds from Linux's /proc/PID/stat, read as psutil reads it for
    `cpu_times()` (fields 14 and 15 in clock ticks, counted after the name's closing parenthesis)
    but without making a psutil.Process: a third of the cost (issue #26). None when unreadable."""
    try:
        data = read_bytes(f"{proc_root}/{pid}/stat")
        fields = data[data.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, s) a process has used so far; None when it cannot be read."""
    if _LINUX:
        return proc_stat_cpu_seconds(pid)
    try:
        times = psutil.Process(pid).cpu_times()
    except _PSUTIL_ERRORS:
        return None
    return float(times.user + times.system)


# An idle server uses ~0 CPU (answering our /health and /props costs it well under 1 %): this share of
# one core since the last look means work, even for a server mostly waiting on its GPU.
WORK_CPU_SHARE = 0.05


@dataclass
class CpuActivity:
    """Whether a process used CPU since the last look: the passive sign that an idle server got work.

    Reading a process's CPU time asks nothing of the server, so it wakes nothing and resets no
    idle timer (unlike llama-server's `/slots`).
    """

    mark: tuple[float, float] | None = None  # (when, CPU seconds) at the last look
    # kept (not on Linux, where /proc/PID/stat is read directly): one look per poll, not two (#26)
    _process: psutil.Process | None = field(default=None, init=False, repr=False, compare=False)

    def worked(self, pid: int | None, now_s: float) -> bool | None:
        """True / False since the last look; None when it cannot be told (no pid, first look)."""
        used = self._cpu_seconds(pid) if pid is not None else None
        if used is None:
            self.mark = None
            return None
        mark, self.mark = self.mark, (now_s, used)
        if mark is None or now_s <= mark[0]:
            return None
        if used < mark[1]:
            return True  # another process on that port: look
        return (used - mark[1]) / (now_s - mark[0]) >= WORK_CPU_SHARE

    def _cpu_seconds(self, pid: int) -> float | None:
        """`cpu_seconds(pid)`: elsewhere than Linux through a kept handle (made again for another pid)."""
        if _LINUX:
            return proc_stat_cpu_seconds(pid)
        try:
            if self._process is None or self._process.pid != pid:
                self._process = psutil.Process(pid)
            times = self._process.cpu_times()
        except _PSUTIL_ERRORS:
            self._process = None
            return None
        return float(times.user + times.system)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in `args` (the last one given wins, as argparse does)."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def mlx_served_model(pid: int) -> str | None:
    """The `--model` an `mlx_lm.server` process was started with, as the server names it in
    `/v1/models`: a local folder by its resolved path (a relative one against the process's working
    directory), anything else (a Hugging Face repo id) as given. None when the process is not
    `mlx_lm.server`, has no `--model`, or the OS does not say."""
    try:
        process = psutil.Process(pid)
        args = process.cmdline()
    except _PSUTIL_ERRORS:
        return None
    if not any("mlx_lm" in arg or "mlx-lm" in arg for arg in args[:3]):
        return None
    model = _flag_value(args, "--model")
    if not model:
        return None
    try:
        path = os.path.join(process.cwd(), os.path.expanduser(model))
    except _PSUTIL_ERRORS:
        path = os.path.expanduser(model)
    return os.path.realpath(path) if os.path.exists(path) else model
