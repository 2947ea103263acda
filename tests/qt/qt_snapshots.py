"""Synthetic snapshots for the Qt tests: the shared builders of tests/support/snapshots.py."""

from __future__ import annotations

from tests.support.snapshots import LLAMA, OLLAMA, T0, alert, model, request, server, snap

__all__ = ["LLAMA", "OLLAMA", "T0", "alert", "model", "request", "server", "snap"]
