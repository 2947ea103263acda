"""The layering rules as data, and the AST checker that applies them.

The ban lists (equal to trayapp/<layer>/ruff.toml, as tests/unit/test_architecture.py checks), the
import and call checkers, and the small bad and good modules that both the checker
(tests/unit/test_architecture.py) and the real ruff (tests/integration/test_layering_tools.py) must
judge alike.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trayapp"

QT = frozenset({"PySide6", "shiboken6", "pyqtgraph", "PyQt5", "PyQt6", "PySide2"})
ROOTS = frozenset({"trayapp.app", "trayapp.cli", "trayapp.__main__"})
CORE_BANS = (
    QT
    | ROOTS
    | {"trayapp.adapters", "trayapp.ui", "trayapp.commands", "trayapp.monitor", "trayapp.config"}
    | {"trayapp.paths"}
    # files, processes, environment
    | {"os", "sys", "io", "pathlib", "shutil", "tempfile", "glob", "fileinput", "mmap", "fcntl"}
    | {"msvcrt", "winreg", "ctypes", "platform", "getpass", "pickle", "shelve", "dbm", "sqlite3"}
    | {"tomllib", "logging", "importlib", "signal", "subprocess", "multiprocessing"}
    # network
    | {"socket", "socketserver", "ssl", "select", "selectors", "http", "urllib.request"}
    | {"urllib.error", "ftplib", "smtplib", "xmlrpc", "wsgiref", "webbrowser"}
    # concurrency
    | {"threading", "_thread", "concurrent", "asyncio", "queue"}
    # hidden inputs: time is passed in as now_s
    | {"time", "random", "secrets", "uuid"}
    # third-party I/O that adapters wrap
    | {"httpx", "requests", "urllib3", "aiohttp", "psutil", "pynvml", "gguf", "prometheus_client"}
    | {"keyring", "platformdirs", "tomli", "tomli_w", "pyarrow"}
)
UPPER = ROOTS | {"trayapp.ui", "trayapp.commands", "trayapp.monitor"}
ADAPTER_BANS = QT | UPPER
COMMAND_BANS = QT | ROOTS | {"trayapp.ui"}
UI_BANS = (
    {"PyQt5", "PyQt6", "PySide2", "trayapp.adapters", "trayapp.commands"}
    | ROOTS
    # the adapters' own libraries: the GUI thread never does network, NVML, psutil, SQLite, files
    | {"httpx", "requests", "urllib.request", "socket", "psutil", "pynvml", "sqlite3", "gguf"}
    | {"prometheus_client", "keyring"}
)
LAYER_BANS: dict[str, frozenset[str]] = {
    "core": frozenset(CORE_BANS),
    "adapters": frozenset(ADAPTER_BANS),
    "commands": frozenset(COMMAND_BANS),
    "ui": frozenset(UI_BANS),
}
# Ruff can also ban attributes: these clock reads are banned in core's ruff.toml only (the AST
# call check, forbidden_calls, covers them in the tests).
CORE_MEMBER_BANS = frozenset(
    {"datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today"}
)
# Calls that read files, the terminal or the clock; core must not make them.
CORE_BANNED_BUILTINS = frozenset({"open", "print", "input", "breakpoint", "exec", "eval"})
CORE_BANNED_METHODS = frozenset(
    {"now", "utcnow", "today", "read_text", "write_text", "read_bytes", "write_bytes"}
)


class Violation(NamedTuple):
    line: int
    imported: str  # the absolute dotted name imported
    ban: str  # the banned package or module it falls under


def imported_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every absolute dotted name `source` imports, anywhere (functions, TYPE_CHECKING blocks too).

    `module` is the dotted name of the module itself, used to resolve relative imports.
    `from a import b` yields both "a" and "a.b" (b may be a submodule); `__import__("x")` and
    `importlib.import_module("x")` with a literal name count as imports.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[: len(package) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "__import__") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )


def forbidden_imports(
    layer: str, source: str, module: str | None = None, is_package: bool = False
) -> list[Violation]:
    """The imports in `source` that `layer` forbids (one per banned name per line)."""
    bans = LAYER_BANS[layer]
    hits: dict[tuple[int, str], Violation] = {}
    for line, name in imported_names(source, module or f"trayapp.{layer}._probe", is_package):
        ban = next((b for b in sorted(bans) if name == b or name.startswith(b + ".")), None)
        if ban is not None:
            hits.setdefault((line, ban), Violation(line, name, ban))
    return sorted(hits.values())


def forbidden_calls(source: str) -> list[str]:
    """Calls in core source that read files, the terminal or the clock: "line N: name()"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in CORE_BANNED_BUILTINS:
            found.append(f"line {node.lineno}: {func.id}()")
        elif isinstance(func, ast.Attribute) and func.attr in CORE_BANNED_METHODS:
            found.append(f"line {node.lineno}: .{func.attr}()")
    return found


def layer_files() -> list[tuple[str, Path]]:
    return [(layer, path) for layer in LAYER_BANS for path in sorted((PACKAGE / layer).rglob("*.py"))]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations_in(layer: str, path: Path) -> set[str]:
    source = path.read_text(encoding="utf-8")
    found = forbidden_imports(layer, source, module_name(path), path.name == "__init__.py")
    return {v.imported for v in found}


# (layer, a small bad module, the ban it must trip)
BAD_MODULES = [
    ("core", "import os\n", "os"),
    ("core", "import os.path\n", "os"),
    ("core", "from os import path\n", "os"),
    ("core", "import socket\n", "socket"),
    ("core", "import sqlite3\n", "sqlite3"),
    ("core", "from subprocess import run\n", "subprocess"),
    ("core", "import httpx\n", "httpx"),
    ("core", "import time\n", "time"),
    ("core", "from pathlib import Path\n", "pathlib"),
    ("core", "import threading\n", "threading"),
    ("core", "import trayapp.adapters.store\n", "trayapp.adapters"),
    ("core", "from trayapp.adapters.http import fetch\n", "trayapp.adapters"),
    ("core", "from trayapp import adapters\n", "trayapp.adapters"),
    ("core", "from trayapp.ui.tray import Tray\n", "trayapp.ui"),
    ("core", "from ..ui import icons\n", "trayapp.ui"),
    ("core", "from ..adapters.gpu import NvmlProbe\n", "trayapp.adapters"),
    ("core", "from PySide6.QtCore import QObject\n", "PySide6"),
    ("core", "def later():\n    import PySide6.QtWidgets\n", "PySide6"),
    ("adapters", "from PySide6.QtCore import QTimer\n", "PySide6"),
    ("adapters", "import pyqtgraph as pg\n", "pyqtgraph"),
    ("adapters", "def f():\n    from trayapp.ui import tray\n", "trayapp.ui"),
    ("commands", "import PySide6\n", "PySide6"),
    ("ui", "from trayapp.adapters.secrets import store_api_key\n", "trayapp.adapters"),
    ("ui", "def later():\n    import trayapp.adapters.secrets\n", "trayapp.adapters"),
    ("ui", "import httpx\n", "httpx"),
]
GOOD_MODULES = [
    ("core", "import math, re, json, hashlib\nfrom urllib.parse import urlsplit\nimport numpy as np\n"),
    ("core", "from trayapp import __version__\nfrom trayapp.core import physics\nfrom . import model\n"),
    ("core", "from datetime import datetime, timezone\nfrom collections.abc import Sequence\n"),
    ("adapters", "import os, socket, sqlite3, subprocess, threading, time\nimport httpx, psutil\n"),
    ("adapters", "from trayapp import paths\nfrom trayapp.core.model import Snapshot\n"),
    ("ui", "from PySide6.QtCore import QObject\nimport pyqtgraph\nfrom trayapp.config import Settings\n"),
    ("ui", "from trayapp.core.model import Snapshot\nfrom trayapp.ui.icons import draw\n"),
]


def case_id(value: object) -> str:
    return str(value).strip().replace("\n", "; ")
