"""Tests share code through tests/support/ and conftest.py only (#19).

Every Python file under tests/ is read as an AST. None may import a test module (a file named
`test_*.py`), import a file of tests/ by a bare name (`from qt_snapshots import …`, which works only
because pytest put that folder on sys.path), or change sys.path. Child-process scripts written as
string literals (`python -c "…"`) are read the same way.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from pathlib import Path

import pytest

from tests.support.paths import TESTS_DIR

REPO = TESTS_DIR.parent

SYS_PATH_CHANGES = frozenset({"insert", "append", "extend", "remove", "pop", "clear"})
# A string literal that holds Python code: a statement, or several, not a plain word or path.
CODE_HINT = re.compile(r"\bimport\b|\bsys\.path\b")
PERCENT_HOLE = re.compile(r"%[rsd]")


def _bare_names(paths: list[Path]) -> frozenset[str]:
    """Names importable only through a sys.path shim: each module and folder of code inside tests/."""
    inside = {part for path in paths for part in path.relative_to(TESTS_DIR).with_suffix("").parts}
    return frozenset(inside - {"__init__"})


def _is_sys_path(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _is_test_module(dotted: str) -> bool:
    """`dotted` names only modules and packages (an `import` statement's or a `from`'s module)."""
    return any(part.startswith("test_") for part in dotted.split("."))


def _is_test_module_member(module: str, name: str) -> bool:
    """`from module import name` takes a test module: `name` is a test_*.py file of package `module`."""
    return name.startswith("test_") and REPO.joinpath(*module.split("."), f"{name}.py").is_file()


def _code_of(node: ast.expr) -> str | None:
    """The text of a string literal when it looks like Python code; the holes of an f-string or a
    %-template (`%r`, `%s`, `%d`) become `_`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = PERCENT_HOLE.sub("_", node.value)
    elif isinstance(node, ast.JoinedStr):
        text = "".join(str(v.value) if isinstance(v, ast.Constant) else "_" for v in node.values)
    else:
        return None
    return text if CODE_HINT.search(text) else None


def offences(source: str, bare_names: frozenset[str]) -> list[str]:
    """Each import of a test module or a bare tests/ file, and each change to sys.path, by line."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            whole = _is_test_module(node.module) or node.module.split(".")[0] in bare_names
            modules = [f"{node.module}.{a.name}" for a in node.names]
            tests = [m for m in modules if _is_test_module_member(*m.rsplit(".", 1))]
            imported = [node.module] if whole else tests  # `from tests.unit import test_bar`
        for name in imported:
            if _is_test_module(name):
                found.append(f"line {line}: imports test module {name}")
            elif name.split(".")[0] in bare_names:
                found.append(f"line {line}: imports {name} through sys.path")
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Attribute) and call.attr in SYS_PATH_CHANGES and _is_sys_path(call.value):
            found.append(f"line {line}: sys.path.{call.attr}()")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if _is_sys_path(target) or (isinstance(target, ast.Subscript) and _is_sys_path(target.value)):
                found.append(f"line {line}: assigns sys.path")
        code = _code_of(node) if isinstance(node, ast.expr) else None
        if code is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # invalid escapes in text that is not code
                    inner = offences(textwrap.dedent(code), bare_names)
            except (SyntaxError, ValueError):
                inner = []
            found.extend(f"line {line}, in a script: {hit.partition(': ')[2]}" for hit in inner)
    return found


def test_no_test_file_imports_a_test_module_or_changes_sys_path() -> None:
    paths = sorted(p for p in TESTS_DIR.rglob("*.py") if "fixtures" not in p.relative_to(TESTS_DIR).parts)
    checked = [p for p in paths if p != Path(__file__).resolve()]  # this file's examples offend on purpose
    bare_names = _bare_names(paths)
    assert len(paths) > 100  # the whole suite, not an empty glob
    hits = [
        f"{path.relative_to(TESTS_DIR)} {hit}"
        for path in checked
        for hit in offences(path.read_text(encoding="utf-8"), bare_names)
    ]
    assert not hits, "\n".join(hits)


BARE = frozenset({"qt_snapshots", "test_app", "support"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.unit.test_bar import check_waybar\n",
         ["line 1: imports test module tests.unit.test_bar"]),
        ("import tests.integration.test_snapshot_server as s\n",
         ["line 1: imports test module tests.integration.test_snapshot_server"]),
        ("from tests.unit import test_bar\n", ["line 1: imports test module tests.unit.test_bar"]),
        ("\n\nfrom test_app import FakeMonitor\n", ["line 3: imports test module test_app"]),
        ("from qt_snapshots import snap\n", ["line 1: imports qt_snapshots through sys.path"]),
        ("import support.snapshots\n", ["line 1: imports support.snapshots through sys.path"]),
        ("import sys\nsys.path.insert(0, 'tests/qt')\n", ["line 2: sys.path.insert()"]),
        ("import sys\nsys.path.append('x')\n", ["line 2: sys.path.append()"]),
        ("import sys\nsys.path = ['x']\n", ["line 2: assigns sys.path"]),
        ("import sys\nsys.path[0:0] = ['x']\n", ["line 2: assigns sys.path"]),
        ("import sys\nsys.path += ['x']\n", ["line 2: assigns sys.path"]),
        ('code = "import sys; from test_app import FakeMonitor"\n',
         ["line 1, in a script: imports test module test_app"]),
        ('code = f"""\nimport sys\nsys.path.insert(0, {repo!r})\n"""\n',
         ["line 1, in a script: sys.path.insert()"]),
        ('CHILD = """\nfrom qt_snapshots import snap\nHEAVY = %r\n"""\n',
         ["line 1, in a script: imports qt_snapshots through sys.path"]),
    ],
)  # fmt: skip
def test_the_check_finds_each_kind_of_offence(source: str, expected: list[str]) -> None:
    assert offences(source, BARE) == expected


@pytest.mark.parametrize(
    "source",
    [
        "from tests.support.snapshots import snap\nfrom tests.support import snapshots as s\n",
        "from tests.support.llama import test_model_path\n",  # a function, not a test module
        "import sys\nfrom unittest import mock\nmonkeypatch.setattr(sys, 'path', list(sys.path))\n",
        "print(sys.path[0])\nname = 'test_app'\nwords = 'support for import of a model'\n",
        "from trayapp.core.model import Snapshot\nimport pytest\n",
    ],
)
def test_the_check_passes_shared_code_from_tests_support(source: str) -> None:
    assert offences(source, BARE) == []
