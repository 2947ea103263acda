"""ModelFactsLoader reads each model file once per version; whether it may read the file is asked
once per version too, not at every poll (issue #26)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trayapp.core.model import ModelFacts
from trayapp.sources import facts_loader
from trayapp.sources.facts_loader import STILL_READING, ModelFactsLoader

FACTS = ModelFacts(weights_bytes=1000, bytes_per_token=900, exact=True, source="gguf")


def settled(loader: ModelFactsLoader, path: str) -> tuple[ModelFacts | None, str | None]:
    for _ in range(500):
        found = loader.lookup(path)
        if found != (None, STILL_READING):
            return found
        time.sleep(0.01)
    raise AssertionError("the facts were never read")


def test_one_read_and_one_access_check_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 12)
    reads: list[str] = []
    checks: list[str] = []
    real_access = os.access

    def access(path: str, mode: int) -> bool:
        checks.append(path)
        return real_access(path, mode)

    def read(path: str) -> ModelFacts:
        reads.append(path)
        return FACTS

    monkeypatch.setattr(facts_loader.os, "access", access)
    loader = ModelFactsLoader(read)
    assert loader.lookup(str(model)) == (None, STILL_READING)
    assert settled(loader, str(model)) == (FACTS, None)
    for _ in range(3):
        assert loader.lookup(str(model)) == (FACTS, None)
    assert reads == [str(model)] and checks == [str(model)]
    model.write_bytes(b"GGUF" + b"\0" * 20)  # another version (another size): checked and read again
    assert loader.lookup(str(model)) == (None, STILL_READING)
    assert settled(loader, str(model)) == (FACTS, None)
    assert reads == [str(model)] * 2 and checks == [str(model)] * 2


def test_a_missing_or_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = ModelFactsLoader(lambda path: FACTS)
    missing = str(tmp_path / "gone.gguf")
    assert loader.lookup(missing) == (None, f"model file not readable here: {missing}")
    assert loader.lookup(str(tmp_path)) == (None, f"model file not readable here: {tmp_path}")  # a folder
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(facts_loader.os, "access", lambda path, mode: False)
    assert loader.lookup(str(model)) == (None, f"model file not readable here: {model}")
