"""The layering rules as the tools hold them: each folder's ruff.toml bans the external libraries its
layer may not use (equal to LAYER_BANS in tests/support/layering.py), and core makes no call that reads
files, the terminal or the clock (an AST check: no tool says this). Which trayapp layers import which is
import-linter's contract in pyproject.toml, run with bad modules in tests/integration/test_layers.py; the
real ruff judges the bad and good modules in tests/integration/test_layering_tools.py.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.support.layering import (
    CORE_MEMBER_BANS,
    LAYER_BANS,
    PACKAGE,
    ROOT,
    forbidden_calls,
    imported_names,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_core_reads_no_files_terminal_or_clock() -> None:
    offenders = [
        f"{path.name} {hit}"
        for path in sorted((PACKAGE / "core").rglob("*.py"))
        for hit in forbidden_calls(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders


def test_call_check_reports_files_terminal_clock_and_dynamic_imports() -> None:
    source = (
        "def f(p, datetime):\n    open('x')\n    print(1)\n    p.read_text()\n    datetime.now()\n"
        "    __import__('os')\n"
    )
    assert forbidden_calls(source) == [
        "line 2: open()",
        "line 3: print()",
        "line 4: .read_text()",
        "line 5: .now()",
        "line 6: __import__()",
    ]


def test_the_import_reader_resolves_relative_and_dynamic_imports() -> None:
    source = "from . import secrets\nfrom ..sources.gpu import NvmlProbe\n"
    assert imported_names(source, "trayapp.core.text") == [
        (1, "trayapp.core"),
        (1, "trayapp.core.secrets"),
        (2, "trayapp.sources.gpu"),
        (2, "trayapp.sources.gpu.NvmlProbe"),
    ]
    # In a package's __init__, "." is the package itself.
    assert imported_names("from .sinks import x\n", "trayapp", is_package=True) == [
        (1, "trayapp.sinks"),
        (1, "trayapp.sinks.x"),
    ]
    dynamic = "import importlib\nm = importlib.import_module('sqlite3')\nn = __import__('os')\n"
    assert [name for _, name in imported_names(dynamic, "trayapp.core.x")] == ["importlib", "sqlite3", "os"]


# --------------------------------------------------------------------------- each folder's ruff.toml


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


def test_every_ruff_toml_is_a_layer_of_this_test() -> None:
    folders = {path.parent.name for path in PACKAGE.rglob("ruff.toml")}
    assert folders == set(LAYER_BANS)
    assert all((PACKAGE / layer / "ruff.toml").parent.parent == PACKAGE for layer in LAYER_BANS)


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
    assert not any(name.startswith("trayapp") for name in _banned_api(config)), (
        "which trayapp layers a layer imports is import-linter's contract (pyproject.toml), not ruff's"
    )


@pytest.mark.parametrize("layer", sorted(LAYER_BANS))
def test_no_file_is_excused_from_its_layers_bans(layer: str) -> None:
    lint = _ruff_config(layer)["lint"]
    ignored = {name for name, codes in lint.get("extend-per-file-ignores", {}).items() if "TID251" in codes}
    assert ignored == set()
