"""The tray app's log file and its hook for uncaught exceptions."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path
from types import TracebackType

from trayapp.config import paths

log = logging.getLogger(__name__)


def setup_logging(log_path: Path | None = None) -> Path:
    """A rotating log file in the data dir for the `trayapp` loggers (transitions and errors, INFO+).

    The console (stderr) still gets warnings and errors only.
    """
    path = log_path or paths.log_file()
    logger = logging.getLogger("trayapp")
    for handler in logger.handlers:
        if isinstance(handler, logging.handlers.RotatingFileHandler) and Path(handler.baseFilename) == path:
            return path
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("llm-tray: %(message)s"))
    logger.addHandler(console)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root logger's console handler would print INFO lines too
    return path


def install_excepthook() -> None:
    """Log uncaught exceptions (with their traceback) before the previous hook prints them."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        log.error("uncaught exception", exc_info=(kind, value, tb))
        previous(kind, value, tb)

    sys.excepthook = hook
