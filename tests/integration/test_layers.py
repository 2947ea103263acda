"""The trayapp layers, as import-linter holds them (pyproject.toml [tool.importlinter]): the real tree
keeps both contracts, and a copy of the tree with one bad module added breaks the contract it must —
an import up the layers (directly or through a module that is allowed), between siblings, from ui to what
reads the world, and a module outside every layer (`exhaustive`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.layering import PACKAGE, ROOT

LINT_IMPORTS = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
]
LAYERS = "trayapp's layers: each imports only those below it"
UI_RULE = "ui never reaches what reads or records the world (the sampler thread does)"
BOTH = f"{LAYERS} + {UI_RULE}"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the repository's contracts, on the `trayapp` package under `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [*LINT_IMPORTS, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def broken(result: subprocess.CompletedProcess[str]) -> set[str]:
    return {name for name in (LAYERS, UI_RULE) if f"{name} BROKEN" in result.stdout}


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout and f"{UI_RULE} KEPT" in result.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(PACKAGE, root / "trayapp", ignore=shutil.ignore_patterns("__pycache__", "data"))
    return root


# (file to add under trayapp/, its source, the contract it breaks, a line the report must hold)
BAD = [
    ("core/_bad.py", "import trayapp.sinks.store\n", LAYERS, "trayapp.core._bad -> trayapp.sinks.store"),
    ("core/_bad.py", "from trayapp.app import events\n", LAYERS, "trayapp.core._bad -> trayapp.app.events"),
    (
        "core/_bad.py",
        "def later():\n    from trayapp.ui import tray\n",
        LAYERS,
        "trayapp.core._bad -> trayapp.ui",
    ),
    (
        "config/_bad.py",
        "from trayapp.sources import http\n",
        LAYERS,
        "trayapp.config._bad -> trayapp.sources",
    ),
    ("sources/_bad.py", "from trayapp.sinks import store\n", LAYERS, "trayapp.sources._bad -> trayapp.sinks"),
    ("sinks/_bad.py", "import trayapp.services.monitor\n", LAYERS, "trayapp.sinks._bad -> trayapp.services"),
    ("services/_bad.py", "from trayapp.ui import icons\n", LAYERS, "trayapp.services._bad -> trayapp.ui"),
    # The house review's case: ui reaching the adapters through the monitor (both contracts say so).
    (
        "ui/_bad.py",
        "import trayapp.services.monitor\n",
        BOTH,
        "trayapp.ui._bad -> trayapp.services.monitor",
    ),
    (
        "ui/_bad.py",
        "def later():\n    import trayapp.sources.secrets\n",
        UI_RULE,
        "trayapp.ui._bad -> trayapp.sources",
    ),
    (
        "ui/_bad.py",
        "from trayapp.sinks.store import Store\n",
        UI_RULE,
        "trayapp.ui._bad -> trayapp.sinks.store",
    ),
    ("app/_bad.py", "from trayapp.cli import main\n", LAYERS, "trayapp.app._bad -> trayapp.cli.main"),
    ("stray.py", '"""A module outside every layer."""\n', LAYERS, "trayapp.stray"),
    ("newlayer/__init__.py", '"""A package outside every layer."""\n', LAYERS, "trayapp.newlayer"),
]
# An indirect climb: core → a module it may import → one it may not. The report names the chain.
INDIRECT = (
    ("core/_via.py", "from trayapp.core import _bad_up\n"),
    ("core/_bad_up.py", "import trayapp.ui.icons\n"),
)


@pytest.mark.parametrize(
    ("path", "source", "contract", "shown"), BAD, ids=[f"{p}: {s.strip()}" for p, s, _, _ in BAD]
)
def test_a_bad_module_breaks_its_contract(
    tree_copy: Path, path: str, source: str, contract: str, shown: str
) -> None:
    added = tree_copy / "trayapp" / path
    added.parent.mkdir(exist_ok=True)
    added.write_text(source, encoding="utf-8")
    try:
        result = lint_imports(tree_copy)
    finally:
        shutil.rmtree(added.parent) if path.startswith("newlayer/") else added.unlink()
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken(result) == set(contract.split(" + ")), result.stdout
    assert shown in result.stdout, result.stdout


def test_an_indirect_climb_is_caught_and_named(tree_copy: Path) -> None:
    for path, source in INDIRECT:
        (tree_copy / "trayapp" / path).write_text(source, encoding="utf-8")
    try:
        result = lint_imports(tree_copy)
    finally:
        for path, _ in INDIRECT:
            (tree_copy / "trayapp" / path).unlink()
    assert broken(result) == {LAYERS}, result.stdout
    assert "trayapp.core._bad_up -> trayapp.ui.icons" in result.stdout


def test_the_copy_alone_keeps_every_contract(tree_copy: Path) -> None:
    """The bad-module tests fail for the module they add, not for the copy."""
    result = lint_imports(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
