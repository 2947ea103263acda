"""The external-library bans checked by running the real tools: ruff on small bad and good modules, as
if they were files of each layer (tests/support/layering.py), and every headless layer imported in a
fresh interpreter with Qt blocked. (The trayapp layers themselves: tests/integration/test_layers.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.layering import BAD_MODULES, GOOD_MODULES, PACKAGE, ROOT, case_id, module_name

HEADLESS = ("core", "config", "sources", "sinks", "services", "cli")


def test_every_headless_layer_imports_with_qt_blocked() -> None:
    """Import every module of the layers that run without a GUI in a fresh interpreter where PySide6
    cannot load (the agent, the proxy and every command run so)."""
    modules = [
        module_name(p)
        for layer in HEADLESS
        for p in (PACKAGE / layer).rglob("*.py")
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
        "print('ok', len(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


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


@pytest.mark.parametrize(("layer", "source", "ban"), BAD_MODULES, ids=case_id)
def test_ruff_flags_the_same_bad_module(layer: str, source: str, ban: str) -> None:
    assert _ruff_bans(layer, source) == [ban]


@pytest.mark.parametrize(("layer", "source"), GOOD_MODULES, ids=case_id)
def test_ruff_allows_the_same_good_module(layer: str, source: str) -> None:
    assert _ruff_bans(layer, source) == []


def test_ruff_flags_clock_reads_in_core() -> None:
    source = "from datetime import date, datetime\nx = datetime.now()\ny = date.today()\n"
    assert _ruff_bans("core", source) == ["datetime.datetime.now", "datetime.date.today"]
