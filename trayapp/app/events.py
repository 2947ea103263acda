"""The tray app's test events: JSON lines that e2e tests read to see what the app shows."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TestEvents:
    """Appends JSON lines to `path` (LLM_TRAY_TEST_EVENTS) so e2e tests can see what the app shows."""

    __test__ = False  # not a pytest class

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def emit(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str)
        with self._lock:
            try:
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
            except OSError as exc:
                log.warning("test events: cannot write %s: %s", self.path, exc)
