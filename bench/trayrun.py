"""Helpers for the bench scripts that run the real tray app on a real X display.

The app itself runs through `tests.support.trayapp_process.TrayAppProcess` (shared with the
e2e test); this module adds what only the benches need: a filler prompt of a given length and
a client that keeps the server generating. Importing it puts the repository root on sys.path.
Not a benchmark itself; imported by `bench/screenshots.py` and `bench/app_cost.py`.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.llama import generate  # noqa: E402


def filler_prompt(tokens: int) -> str:
    """A neutral prompt of roughly `tokens` tokens (about ten tokens per sentence)."""
    sentence = "The quick brown fox jumps over the lazy dog near the river bank. "
    return sentence * max(tokens // 12, 1) + "Now write a long story about a lighthouse keeper."


class BusyClient:
    """A separate client keeping the server generating: back-to-back requests until stopped."""

    def __init__(self, url: str, n_predict: int = 200, prompt: str = "Write about the ocean.") -> None:
        self.url = url
        self.n_predict = n_predict
        self.prompt = prompt
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-busy-client", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            generate(self.url, self.prompt, self.n_predict, ignore_eos=True, timeout_s=300.0)
            self.requests += 1

    def start(self) -> BusyClient:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop after the request in flight (bounded by its n_predict)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
