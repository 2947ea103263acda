"""Exact model-file facts for the server probes, read off the sampler thread and cached.

One `ModelFactsLoader` is shared by every probe that can see a model file on
this machine (llama.cpp's `model_path`, Ollama's llama-server child, LM
Studio's `lms ps` path). Reading a GGUF header can take a while on a cold disk,
so the read runs in a background thread and a probe gets None until it is done:
a poll never waits for it.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass

from trayapp.core.model import ModelFacts
from trayapp.sources.modelfile import ModelFileError, read_model_facts

log = logging.getLogger(__name__)

STILL_READING = "still reading the model file"

FactsReader = Callable[[str], ModelFacts]  # a local model file -> its exact facts (may be slow)
FactsLookup = tuple[ModelFacts | None, str | None]  # (facts, why there are none)


@dataclass
class _Entry:
    version: tuple[int, int]  # (size in bytes, mtime in ns) of the file that was read
    result: FactsLookup = (None, STILL_READING)  # replaced once, by the reading thread


class ModelFactsLoader:
    """Reads each model file once per version (path, size, mtime) in a daemon thread.

    `lookup(path)` never blocks: on first sight of a file version it starts the
    read and answers `(None, "still reading the model file")`; later calls give
    the facts, or None and why. A file that changes on disk is read again.
    Thread-safe: probes poll on several threads at once.
    """

    def __init__(self, read: FactsReader = read_model_facts) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # one per path: the latest version seen

    def get(self, path: str) -> ModelFacts | None:
        """The facts of the model file at `path` once they have been read, else None."""
        return self.lookup(path)[0]

    def lookup(self, path: str) -> FactsLookup:
        """`(facts, None)` when read, else `(None, why)`."""
        try:
            info = os.stat(path)
        except OSError:
            return None, f"model file not readable here: {path}"
        if not stat.S_ISREG(info.st_mode):
            return None, f"model file not readable here: {path}"
        version = (info.st_size, info.st_mtime_ns)
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and entry.version == version:
                return entry.result  # this version was readable: not asked again each poll (#26)
        if not os.access(path, os.R_OK):
            return None, f"model file not readable here: {path}"
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and entry.version == version:  # another thread started it meanwhile
                return entry.result
            entry = self._entries[path] = _Entry(version)
        threading.Thread(target=self._load, args=(path, entry), name="model-facts", daemon=True).start()
        return None, STILL_READING

    def _load(self, path: str, entry: _Entry) -> None:
        try:
            entry.result = (self._read(path), None)
        except (ModelFileError, OSError, ValueError) as exc:  # a file that is not a readable model
            log.warning("model facts: cannot read %s: %s", path, exc)
            entry.result = (None, f"could not read model facts: {type(exc).__name__}: {exc}")
        except Exception as exc:  # this thread's boundary: a bug in the reader, logged with its traceback
            log.exception("model facts: reading %s failed", path)
            entry.result = (None, f"could not read model facts: internal error: {type(exc).__name__}: {exc}")
