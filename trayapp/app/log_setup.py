"""The tray app's log file and its hook for uncaught exceptions."""

from __future__ import annotations

import io
import logging
import logging.handlers
import sys
from pathlib import Path
from types import TracebackType

from trayapp.config import paths
from trayapp.config.files import create_private_file
from trayapp.config.log_format import RedactingFormatter

log = logging.getLogger(__name__)


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log whose every file (the first, and each one after a rotation) is 0600."""

    def _open(self) -> io.TextIOWrapper:
        create_private_file(Path(self.baseFilename))
        return super()._open()


def setup_logging(log_path: Path | None = None) -> Path:
    """A rotating log file in the data dir for the `trayapp` loggers (transitions and errors, INFO+),
    readable by this user only. In a read-only home there is no log file (a warning says so).

    The console (stderr) still gets warnings and errors only.
    """
    path = log_path or paths.log_file()
    logger = logging.getLogger("trayapp")
    for handler in logger.handlers:
        if isinstance(handler, logging.handlers.RotatingFileHandler) and Path(handler.baseFilename) == path:
            return path
    file_error: OSError | None = None
    try:
        handler = PrivateRotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    except OSError as exc:
        file_error = exc
    else:
        handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    console.setFormatter(RedactingFormatter("llm-tray: %(message)s"))
    logger.addHandler(console)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root logger's console handler would print INFO lines too
    if file_error is not None:
        log.warning("read-only mode: no log file (%s: %s)", path, file_error.strerror or file_error)
    return path


def install_excepthook() -> None:
    """Log uncaught exceptions (with their traceback) before the previous hook prints them."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        log.error("uncaught exception", exc_info=(kind, value, tb))
        previous(kind, value, tb)

    sys.excepthook = hook
