"""The layering rules, enforced twice: an AST check here and ruff's TID251 in lint.

core is pure (no Qt, no upper layer, no I/O, no clock); adapters and commands never touch Qt;
ui never imports adapters. The same ban lists live in trayapp/<layer>/ruff.toml; the tests below
check that the two stay equal. The rules and the checker are in tests/support/layering.py; the
tests that run processes (the real ruff on the same bad modules, an import with Qt blocked) are in
tests/integration/test_layering_tools.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.layering import (
    BAD_MODULES,
    CORE_MEMBER_BANS,
    GOOD_MODULES,
    LAYER_BANS,
    PACKAGE,
    ROOT,
    case_id,
    forbidden_calls,
    forbidden_imports,
    imported_names,
    layer_files,
    violations_in,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Violations in today's tree, allowed until their owners remove them. Each file listed here also has
# a TID251 per-file ignore in its layer's ruff.toml.
KNOWN_VIOLATIONS: dict[str, set[str]] = {}  # none left; a new entry needs a reason and an issue


# --------------------------------------------------------------------------- the real tree


@pytest.mark.parametrize(
    ("layer", "path"), layer_files(), ids=[p.relative_to(PACKAGE).as_posix() for _, p in layer_files()]
)
def test_every_module_imports_only_what_its_layer_allows(layer: str, path: Path) -> None:
    rel = path.relative_to(PACKAGE).as_posix()
    bad = violations_in(layer, path) - KNOWN_VIOLATIONS.get(rel, set())
    assert not bad, f"trayapp/{rel} imports {sorted(bad)}: forbidden in {layer} (see ARCHITECTURE.md)"


def test_known_violations_are_still_there() -> None:
    """An entry whose import is gone must be deleted, so the allow-list only ever shrinks."""
    stale = []
    for rel, names in KNOWN_VIOLATIONS.items():
        path = PACKAGE / rel
        gone = names if not path.exists() else names - violations_in(rel.split("/")[0], path)
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


# --------------------------------------------------------------------------- the checker itself


@pytest.mark.parametrize(("layer", "source", "ban"), BAD_MODULES, ids=case_id)
def test_checker_reports_each_forbidden_import(layer: str, source: str, ban: str) -> None:
    found = forbidden_imports(layer, source)
    assert [v.ban for v in found] == [ban], found


@pytest.mark.parametrize(("layer", "source"), GOOD_MODULES, ids=case_id)
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
