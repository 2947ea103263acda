"""Workarounds for Qt binding bugs that would crash a long-running tray app.

WORKAROUND: PySide6 6.12.0 on CPython < 3.12 drops one reference to `None` on
every call of a void C++ method (and to True/False through Python-overridden
virtuals, e.g. in pyqtgraph). Python 3.12+ makes these objects immortal, so the
bug only shows on 3.11: after ~16 000 calls (minutes for a tray app) the
interpreter aborts with "Fatal Python error: none_dealloc". PySide6 6.11.3 is
not affected. When the leak is detected, we give these singletons a huge
reference count, which is what 3.12 does for them anyway. Pinning
`PySide6-Essentials<6.12` (or Python ≥ 3.12) is the real fix.

WORKAROUND: once PySide6 is imported, shiboken's import hook asks of every module imported after it
whether its source mentions "PySide6" (for `from __feature__ import ...`), with `inspect.getsource`:
that reads the whole file into `linecache`, which keeps it for good. In the tray app that held the
text of ~600 modules, 15.7 MiB of a 110 MiB process (tracemalloc, PySide6 6.11.3).
`stop_source_caching` answers the same question without keeping the text.
"""

from __future__ import annotations

import ctypes
import linecache
import logging
import sys
from types import ModuleType

from PySide6.QtCore import QObject

log = logging.getLogger(__name__)

_applied = False
_BOOST = 1 << 40  # references; a leak of 1000 per second takes 35 years to spend them


def leaks_none_refs(calls: int = 64) -> bool:
    """True when a void PySide6 call loses a reference to None (the 6.12.0-on-3.11 bug)."""
    if sys.version_info >= (3, 12):
        return False  # None is immortal there
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(calls):
        probe.setObjectName("llm-tray-probe")
    return sys.getrefcount(None) <= before - calls // 2


def apply_workarounds() -> bool:
    """Apply the singleton-refcount workaround once, if this binding needs it; True if applied."""
    global _applied
    if _applied:
        return True
    if not leaks_none_refs():
        return False
    for singleton in (None, True, False, *range(-5, 257)):
        ctypes.c_ssize_t.from_address(id(singleton)).value += _BOOST
    _applied = True
    log.warning(
        "PySide6 %s on Python %d.%d leaks references to None; applied a workaround "
        "(install PySide6-Essentials<6.12 or use Python 3.12+ to avoid it)",
        _pyside_version(),
        *sys.version_info[:2],
    )
    return True


def _pyside_version() -> str:
    import PySide6

    return str(getattr(PySide6, "__version__", "?"))


def _mentions_pyside(module: ModuleType) -> bool:
    """shiboken's question about an imported module, answered from its file without caching it."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return False  # built in, compiled or source-less: shiboken's own check says False too
    try:
        with open(path, "rb") as source:
            return b"PySide6" in source.read()
    except OSError:
        return False


def stop_source_caching() -> bool:
    """Stop PySide6 keeping the source of every module imported after it, and drop what it kept.

    True when shiboken's feature module was found and patched (PySide6 6.x); False leaves it as it is.
    """
    feature = sys.modules.get("PySide6.support.feature")
    if feature is None or not callable(getattr(feature, "_mod_uses_pyside", None)):
        return False
    feature._mod_uses_pyside = _mentions_pyside  # type: ignore[attr-defined]  # looked up on each import
    linecache.clearcache()  # the text kept so far; a traceback reads its lines again when needed
    return True
