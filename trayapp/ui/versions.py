"""The versions the tray's diagnostics name (Qt's own among them: ui is where Qt lives)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

import PySide6
from PySide6.QtCore import qVersion


def collect_versions() -> dict[str, str]:
    """Python, PySide6, Qt, pyqtgraph (from its metadata: importing it costs ~50 MiB) and the OS."""
    try:
        pyqtgraph_version = version("pyqtgraph")
    except PackageNotFoundError:
        pyqtgraph_version = "?"

    return {
        "Python": platform.python_version(),
        "PySide6": str(getattr(PySide6, "__version__", "?")),
        "Qt": qVersion(),
        "pyqtgraph": pyqtgraph_version,
        "OS": platform.platform(terse=True),
    }
