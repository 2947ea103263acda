"""The layering rules, enforced: core is pure, adapters never touch Qt."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "trayapp"
QT_MODULES = {"PySide6", "pyqtgraph", "shiboken6"}
IO_MODULES = {
    "httpx",
    "psutil",
    "pynvml",
    "gguf",
    "sqlite3",
    "prometheus_client",
    "keyring",
    "platformdirs",
    "socket",
    "subprocess",
    "urllib.request",
    "http.client",
    "requests",
    "threading",
    "concurrent",
    "asyncio",
    "shutil",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_prefixes(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(_prefixes(node.module))
    return found


def _prefixes(module: str) -> set[str]:
    """ "a.b.c" → {"a", "a.b", "a.b.c"}, so both packages and submodules can be banned."""
    parts = module.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def _modules(subdir: str) -> list[Path]:
    return sorted((PACKAGE / subdir).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("core"), ids=lambda p: p.name)
def test_core_imports_no_qt_and_no_io(path: Path) -> None:
    bad = _imports(path) & (QT_MODULES | IO_MODULES)
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}: core must stay pure"


@pytest.mark.parametrize("path", [*_modules("adapters"), *_modules("commands")], ids=lambda p: p.name)
def test_adapters_never_import_qt(path: Path) -> None:
    bad = _imports(path) & QT_MODULES
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}: Qt belongs in trayapp/ui"


def test_core_does_no_file_io() -> None:
    offenders = []
    for path in _modules("core"):
        text = path.read_text(encoding="utf-8")
        for needle in ("open(", "time.time(", "time.monotonic(", ".read_text(", ".write_text("):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert not offenders, offenders


def test_core_and_adapters_import_with_qt_blocked() -> None:
    """Import every core and adapter module in a fresh interpreter where PySide6 cannot load."""
    modules = [
        "trayapp." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in [*_modules("core"), *_modules("adapters")]
        if p.name != "__init__.py"
    ]
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'PySide6', 'pyqtgraph', 'shiboken6'}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
        "import trayapp.monitor, trayapp.cli\n"
        "print('ok', len(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
