"""Where the tests' own data lives: everything a test reads is inside the repository."""

from __future__ import annotations

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
FIXTURES_DIR = TESTS_DIR / "fixtures"  # payloads from each server kind; tests/fixtures/README.md says whence
