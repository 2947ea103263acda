"""tests/unit is pure: no module there starts a server or a process (README, Layout).

Each tests/unit/*.py is read as an AST. A module may import `subprocess` to build
`subprocess.CompletedProcess` fakes for a runner, but may not call what starts a process; tests
that start servers or processes belong in tests/integration.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.layering import imported_names
from tests.support.paths import TESTS_DIR

UNIT_DIR = TESTS_DIR / "unit"

# Modules that open sockets, serve HTTP or start processes (a submodule counts as its package).
BANNED_IMPORTS = frozenset(
    {"socket", "socketserver", "http.server", "multiprocessing"}
    | {"tests.support.fake_http", "tests.support.fake_servers", "tests.support.llama"}
    | {"tests.support.smoke_llama", "tests.support.cli", "tests.support.trayapp_process"}
    | {"tests.support.xdisplay"}
)
# Calls that start a process, as dotted names after import aliases are resolved; importing one of
# these names directly (`from subprocess import run`) counts too.
BANNED_CALLS = frozenset(
    {"subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call"}
    | {"subprocess.check_output", "subprocess.getoutput", "subprocess.getstatusoutput"}
    | {"os.system", "os.popen", "os.fork"}
)
# Calls that start a server or process, by their own name wherever they are imported from.
BANNED_CALL_NAMES = frozenset(
    {"start_exporter", "FakeServer", "LlamaServer", "ProcessPoolExecutor"}
    | {"create_subprocess_exec", "create_subprocess_shell"}
)
# Fixtures from tests/conftest.py that start a server for the test that asks for them.
SERVER_FIXTURES = frozenset({"llama_server"})


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Each name an import binds → the absolute dotted name it stands for."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _dotted(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """`sp.run` → "subprocess.run" after `import subprocess as sp`; None for other callees."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    return ".".join([aliases.get(func.id, func.id), *reversed(parts)])


def impurities(source: str, module: str = "tests.unit._probe") -> list[str]:
    """What in `source` starts a server or a process, one "line N: ..." per finding, in line order."""
    tree = ast.parse(source)
    found: dict[tuple[int, str], None] = {}
    for line, name in imported_names(source, module):
        if name in BANNED_CALLS:
            found[(line, f"imports {name}")] = None
        ban = next((b for b in sorted(BANNED_IMPORTS) if name == b or name.startswith(b + ".")), None)
        if ban is not None:
            found[(line, f"imports {ban}")] = None
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = _dotted(node.func, aliases)
            if callee is not None and (callee in BANNED_CALLS or callee.split(".")[-1] in BANNED_CALL_NAMES):
                found[(node.lineno, f"calls {callee}")] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if arg.arg in SERVER_FIXTURES:
                    found[(node.lineno, f"uses fixture {arg.arg}")] = None
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _unit_modules() -> list[Path]:
    return sorted(UNIT_DIR.glob("*.py"))


# --------------------------------------------------------------------------- the real tree


@pytest.mark.parametrize("path", _unit_modules(), ids=lambda p: p.name)
def test_no_unit_test_starts_a_server_or_a_process(path: Path) -> None:
    found = impurities(path.read_text(encoding="utf-8"), f"tests.unit.{path.stem}")
    assert not found, f"tests/unit/{path.name}: {found}: move these tests to tests/integration"


def test_the_scan_covers_the_unit_modules() -> None:
    names = {path.name for path in _unit_modules()}
    assert {"test_store.py", "test_hwtable.py", "test_unit_tests_are_pure.py"} <= names


# --------------------------------------------------------------------------- the scanner itself

BAD_MODULE = """\
import socket
import subprocess as sp
from http import server
from subprocess import check_output
from tests.support.fake_http import FakeServer, json_reply
from trayapp.sinks.metrics import start_exporter


def test_serves(llama_server):
    with FakeServer({"/": json_reply({})}) as fake:
        sp.run(["true"])
    exporter = start_exporter(None, port=0)
"""


def test_the_scanner_flags_a_bad_module() -> None:
    assert impurities(BAD_MODULE) == [
        "line 1: imports socket",
        "line 3: imports http.server",
        "line 4: imports subprocess.check_output",
        "line 5: imports tests.support.fake_http",
        "line 9: uses fixture llama_server",
        "line 10: calls tests.support.fake_http.FakeServer",
        "line 11: calls subprocess.run",
        "line 12: calls trayapp.sinks.metrics.start_exporter",
    ]


@pytest.mark.parametrize(
    ("source", "finding"),
    [
        ("import multiprocessing.pool\n", "line 1: imports multiprocessing"),
        ("from tests.support import llama\n", "line 1: imports tests.support.llama"),
        ("import subprocess\nsubprocess.Popen(['x'])\n", "line 2: calls subprocess.Popen"),
        ("import os\nos.system('x')\n", "line 2: calls os.system"),
        (
            "from concurrent import futures\nfutures.ProcessPoolExecutor()\n",
            "line 2: calls concurrent.futures.ProcessPoolExecutor",
        ),
        ("def f(server):\n    server.LlamaServer(1)\n", "line 2: calls server.LlamaServer"),
    ],
)
def test_the_scanner_flags_each_way_in(source: str, finding: str) -> None:
    assert impurities(source) == [finding]


def test_the_scanner_allows_completed_process_fakes() -> None:
    source = (
        "import subprocess\nfrom http import HTTPStatus\n\n"
        "def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:\n"
        "    if not argv:\n        raise subprocess.TimeoutExpired(argv, 5)\n"
        "    return subprocess.CompletedProcess(argv, 0, stdout='ok', stderr='')\n"
    )
    assert impurities(source) == []
