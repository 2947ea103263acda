"""The layering rules, enforced twice: an AST check here and ruff's TID251 in lint.

core is pure (no Qt, no upper layer, no I/O, no clock); adapters and commands never touch Qt;
ui never imports adapters. The same ban lists live in trayapp/<layer>/ruff.toml; the tests below
check that the two stay equal and that ruff really flags a bad module placed in each layer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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
# call check below covers them here).
CORE_MEMBER_BANS = frozenset(
    {"datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today"}
)
# Calls that read files, the terminal or the clock; core must not make them.
CORE_BANNED_BUILTINS = frozenset({"open", "print", "input", "breakpoint", "exec", "eval"})
CORE_BANNED_METHODS = frozenset(
    {"now", "utcnow", "today", "read_text", "write_text", "read_bytes", "write_bytes"}
)

# Violations in today's tree, allowed until their owners remove them. Each file listed here also has
# a TID251 per-file ignore in its layer's ruff.toml.
KNOWN_VIOLATIONS: dict[str, set[str]] = {}  # none left; a new entry needs a reason and an issue


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


def _layer_files() -> list[tuple[str, Path]]:
    return [(layer, path) for layer in LAYER_BANS for path in sorted((PACKAGE / layer).rglob("*.py"))]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _violations_in(layer: str, path: Path) -> set[str]:
    source = path.read_text(encoding="utf-8")
    found = forbidden_imports(layer, source, _module_name(path), path.name == "__init__.py")
    return {v.imported for v in found}


# --------------------------------------------------------------------------- the real tree


@pytest.mark.parametrize(
    ("layer", "path"), _layer_files(), ids=[p.relative_to(PACKAGE).as_posix() for _, p in _layer_files()]
)
def test_every_module_imports_only_what_its_layer_allows(layer: str, path: Path) -> None:
    rel = path.relative_to(PACKAGE).as_posix()
    bad = _violations_in(layer, path) - KNOWN_VIOLATIONS.get(rel, set())
    assert not bad, f"trayapp/{rel} imports {sorted(bad)}: forbidden in {layer} (see ARCHITECTURE.md)"


def test_known_violations_are_still_there() -> None:
    """An entry whose import is gone must be deleted, so the allow-list only ever shrinks."""
    stale = []
    for rel, names in KNOWN_VIOLATIONS.items():
        path = PACKAGE / rel
        gone = names if not path.exists() else names - _violations_in(rel.split("/")[0], path)
        stale += [f"{rel}: {name}" for name in sorted(gone)]
    assert not stale, (
        f"fixed, thank you: delete {stale} from KNOWN_VIOLATIONS here and the file's TID251 "
        "per-file ignore from its layer's ruff.toml"
    )


def test_core_reads_no_files_terminal_or_clock() -> None:
    offenders = [
        f"{path.name} {hit}"
        for path in sorted((PACKAGE / "core").rglob("*.py"))
        for hit in forbidden_calls(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders


def test_core_and_adapters_import_with_qt_blocked() -> None:
    """Import every core and adapter module in a fresh interpreter where PySide6 cannot load."""
    modules = [
        _module_name(p)
        for p in [*(PACKAGE / "core").rglob("*.py"), *(PACKAGE / "adapters").rglob("*.py")]
        if p.name != "__init__.py"
    ]
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'PySide6', 'pyqtgraph', 'shiboken6'}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"import importlib\nfor m in {sorted(modules)!r}:\n    importlib.import_module(m)\n"
        "import trayapp.monitor, trayapp.cli\n"
        "print('ok', len(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


# --------------------------------------------------------------------------- the checker itself

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


def _case_id(value: object) -> str:
    return str(value).strip().replace("\n", "; ")


@pytest.mark.parametrize(("layer", "source", "ban"), BAD_MODULES, ids=_case_id)
def test_checker_reports_each_forbidden_import(layer: str, source: str, ban: str) -> None:
    found = forbidden_imports(layer, source)
    assert [v.ban for v in found] == [ban], found


@pytest.mark.parametrize(("layer", "source"), GOOD_MODULES, ids=_case_id)
def test_checker_allows_what_the_layer_may_use(layer: str, source: str) -> None:
    assert forbidden_imports(layer, source) == []


def test_checker_resolves_relative_imports_against_the_module() -> None:
    source = "from . import secrets\nfrom ..adapters.gpu import NvmlProbe\n"
    assert imported_names(source, "trayapp.core.text") == [
        (1, "trayapp.core"),
        (1, "trayapp.core.secrets"),
        (2, "trayapp.adapters.gpu"),
        (2, "trayapp.adapters.gpu.NvmlProbe"),
    ]
    # In a package's __init__, "." is the package itself.
    assert imported_names("from .adapters import x\n", "trayapp", is_package=True) == [
        (1, "trayapp.adapters"),
        (1, "trayapp.adapters.x"),
    ]


def test_checker_sees_dynamic_imports() -> None:
    source = "import importlib\nm = importlib.import_module('sqlite3')\nn = __import__('os')\n"
    assert [v.ban for v in forbidden_imports("core", source)] == ["importlib", "sqlite3", "os"]


def test_call_check_reports_files_terminal_and_clock() -> None:
    source = "def f(p, datetime):\n    open('x')\n    print(1)\n    p.read_text()\n    datetime.now()\n"
    assert forbidden_calls(source) == [
        "line 2: open()",
        "line 3: print()",
        "line 4: .read_text()",
        "line 5: .now()",
    ]


# --------------------------------------------------------------------------- the same rule in ruff


def _ruff_config(layer: str) -> dict[str, Any]:
    with (PACKAGE / layer / "ruff.toml").open("rb") as f:
        return tomllib.load(f)


def _banned_api(config: dict[str, Any]) -> set[str]:
    return set(config["lint"]["flake8-tidy-imports"]["banned-api"])


def test_ruff_selects_tid_and_bans_relative_imports() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        lint = tomllib.load(f)["tool"]["ruff"]["lint"]
    assert "TID" in lint["select"]
    assert lint["flake8-tidy-imports"]["ban-relative-imports"] == "all"


@pytest.mark.parametrize("layer", sorted(LAYER_BANS))
def test_ruff_config_bans_exactly_what_this_test_bans(layer: str) -> None:
    config = _ruff_config(layer)
    assert config["extend"] == "../../pyproject.toml"
    members = CORE_MEMBER_BANS if layer == "core" else frozenset()
    assert _banned_api(config) == LAYER_BANS[layer] | members
    with (ROOT / "pyproject.toml").open("rb") as f:
        root_bans = set(tomllib.load(f)["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"])
    assert root_bans <= _banned_api(config), (
        "ruff replaces an extended banned-api table: repeat the root bans"
    )


@pytest.mark.parametrize("layer", sorted(LAYER_BANS))
def test_ruff_ignores_tid251_only_for_known_violations(layer: str) -> None:
    lint = _ruff_config(layer)["lint"]
    ignored = {name for name, codes in lint.get("extend-per-file-ignores", {}).items() if "TID251" in codes}
    known = {rel.split("/", 1)[1] for rel in KNOWN_VIOLATIONS if rel.startswith(layer + "/")}
    assert ignored == known


RUFF = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "json"]


def _ruff_bans(layer: str, source: str) -> list[str]:
    """Run the real ruff, with the repository's own config layout, on `source` as a file in `layer`."""
    result = subprocess.run(
        [*RUFF, "--select", "TID251", "--stdin-filename", f"trayapp/{layer}/_layering_probe.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode in (0, 1), result.stderr
    return [d["message"].split("`")[1] for d in json.loads(result.stdout) if d["code"] == "TID251"]


@pytest.mark.parametrize(("layer", "source", "ban"), BAD_MODULES, ids=_case_id)
def test_ruff_flags_the_same_bad_module(layer: str, source: str, ban: str) -> None:
    assert _ruff_bans(layer, source) == [ban]


@pytest.mark.parametrize(("layer", "source"), GOOD_MODULES, ids=_case_id)
def test_ruff_allows_the_same_good_module(layer: str, source: str) -> None:
    assert _ruff_bans(layer, source) == []


def test_ruff_flags_clock_reads_in_core() -> None:
    source = "from datetime import date, datetime\nx = datetime.now()\ny = date.today()\n"
    assert _ruff_bans("core", source) == ["datetime.datetime.now", "datetime.date.today"]
