"""A real llama-server in router mode for tests: `Router` (two names for one GGUF, `--models-max 1`)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx

from tests.support.llama import STOP_TIMEOUT_S, free_port

READY_TIMEOUT_S = 60.0


class Router:
    """One real `llama-server --models-dir DIR` on 127.0.0.1, stopped by pid (its children exit with it)."""

    def __init__(self, binary: Path, model: Path, tmp_path: Path, names: tuple[str, ...] = ("alpha", "beta")):
        self.models_dir = tmp_path / "models"
        self.models_dir.mkdir()
        for name in names:
            (self.models_dir / f"{name}.gguf").symlink_to(model)
        self.port = free_port()
        self.log_path = tmp_path / "router.log"
        self.command = [str(binary), "--models-dir", str(self.models_dir), "--models-max", "1"]
        self.command += ["--host", "127.0.0.1", "--port", str(self.port), "-t", "1", "-np", "1", "-c", "2048"]
        self.command += ["--metrics"]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Router:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        pace = threading.Event()
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            pace.wait(0.1)
        self.stop()
        raise RuntimeError(f"router did not become ready:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S * 2)  # it stops its children first
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def states(self) -> dict[str, str]:
        """What the router itself says: model name → `status.value`."""
        data = httpx.get(self.url + "/models", timeout=10.0).json()
        return {entry["id"]: entry["status"]["value"] for entry in data["data"]}
