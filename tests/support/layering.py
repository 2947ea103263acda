"""The layering rules as data, and the AST checker that applies them.

The external libraries each layer's ruff.toml bans (tests/unit/test_architecture.py checks they are
equal), the bad and good modules the real ruff must judge so (tests/integration/test_layering_tools.py),
the AST import reader the purity tests use, and the call check no tool does (core reads no files, no
terminal, no clock). Which trayapp layers import which is import-linter's (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trayapp"

QT = frozenset({"PySide6", "shiboken6", "pyqtgraph", "PyQt5", "PyQt6", "PySide2"})
# The external libraries each folder's ruff.toml bans (which trayapp layers a layer may import is
# import-linter's contract in pyproject.toml; tests/integration/test_layers.py feeds it bad modules).
CORE_BANS = (
    QT
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
    # third-party I/O that sources and sinks wrap
    | {"httpx", "requests", "urllib3", "aiohttp", "psutil", "pynvml", "gguf", "prometheus_client"}
    | {"keyring", "platformdirs", "tomli", "tomli_w", "pyarrow"}
)
UI_BANS = (
    {"PyQt5", "PyQt6", "PySide2"}
    # the sampler thread's libraries: the GUI thread never does network, NVML, psutil, SQLite, files
    | {"httpx", "requests", "urllib.request", "socket", "psutil", "pynvml", "sqlite3", "gguf"}
    | {"prometheus_client", "keyring"}
)
# Every folder with a ruff.toml; app/ (the tray's composition root) bans nothing beyond the root.
LAYER_BANS: dict[str, frozenset[str]] = {
    "core": frozenset(CORE_BANS),
    "config": QT,
    "sources": QT,
    "sinks": QT,
    "services": QT,
    "cli": QT,
    "ui": frozenset(UI_BANS),
}
# Ruff can also ban attributes: core's ruff.toml bans these clock reads and numpy's file I/O (the AST
# call check, forbidden_calls, covers the clock in the tests too).
CORE_MEMBER_BANS = frozenset(
    {"datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today"}
    | {"numpy.load", "numpy.save", "numpy.loadtxt", "numpy.fromfile", "numpy.genfromtxt"}
)
# Calls that read files, the terminal or the clock; core must not make them.
CORE_BANNED_BUILTINS = frozenset({"open", "print", "input", "breakpoint", "exec", "eval", "__import__"})
CORE_BANNED_METHODS = frozenset(
    {"now", "utcnow", "today", "read_text", "write_text", "read_bytes", "write_bytes"}
)


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


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# (layer, a small bad module, the ban it must trip): external libraries, judged by ruff.
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
    ("core", "from PySide6.QtCore import QObject\n", "PySide6"),
    ("core", "def later():\n    import PySide6.QtWidgets\n", "PySide6"),
    ("core", "import numpy as np\n\ndef f(path):\n    return np.load(path)\n", "numpy.load"),
    ("sources", "from PySide6.QtCore import QTimer\n", "PySide6"),
    ("sinks", "import pyqtgraph as pg\n", "pyqtgraph"),
    ("services", "def f():\n    from PySide6 import QtCore\n", "PySide6"),
    ("config", "import shiboken6\n", "shiboken6"),
    ("cli", "import PySide6\n", "PySide6"),
    ("ui", "import httpx\n", "httpx"),
    ("ui", "def later():\n    import keyring\n", "keyring"),
]
GOOD_MODULES = [
    ("core", "import math, re, json, hashlib\nfrom urllib.parse import urlsplit\nimport numpy as np\n"),
    ("core", "from trayapp import __version__\nfrom trayapp.core import physics\nfrom . import model\n"),
    ("core", "from datetime import datetime, timezone\nfrom collections.abc import Sequence\n"),
    ("sources", "import os, socket, sqlite3, subprocess, threading, time\nimport httpx, psutil\n"),
    ("sinks", "from trayapp.config import paths\nfrom trayapp.core.model import Snapshot\n"),
    ("ui", "from PySide6.QtCore import QObject\nimport pyqtgraph\nfrom trayapp.config import settings\n"),
    ("ui", "from trayapp.core.model import Snapshot\nfrom trayapp.ui.icons import draw\n"),
]


def case_id(value: object) -> str:
    return str(value).strip().replace("\n", "; ")
