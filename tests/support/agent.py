"""A real `llm-tray agent` process for the tests: its own LLM_TRAY_HOME, output in files (never an
unread pipe). Used by the snapshot server, bar, sampler owner and remote machine tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.cli import run_cli
from tests.support.fake_servers import wait_until

READY_S = 20.0


class Agent:
    """`python -m trayapp agent` against `upstream`, its own LLM_TRAY_HOME, output in files.

    With `new_token`, `llm-tray agent --new-token` runs first (its output in `new_token_output`) and
    the agent then requires that token (`token`, kept in `token_file`)."""

    def __init__(
        self,
        root: Path,
        upstream: str,
        *extra: str,
        kind: str = "ollama",
        poll_s: float = 0.3,
        config: str = "",
        env: dict[str, str] | None = None,
        gpu: str | None = "RTX 4090",  # for the fake's placement; None: this machine's own hardware
        new_token: bool = False,
    ) -> None:
        self.home = root / "home"
        (self.home / "config").mkdir(parents=True, exist_ok=True)
        monitor = f"[monitor]\npoll_idle_s = {poll_s}\npoll_active_s = {poll_s}\n"  # 0.3: 3 ticks a second
        (self.home / "config" / "config.toml").write_text(monitor + config)
        self.env = {k: v for k, v in os.environ.items() if k != "LLM_TRAY_TOKEN"}
        self.env.update({"LLM_TRAY_HOME": str(self.home), **(env or {})})
        self.token_file = self.home / "config" / "agent-token"
        self.new_token_output = ""
        if new_token:
            made = subprocess.run(
                [sys.executable, "-m", "trayapp", "agent", "--new-token"],
                env=self.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert made.returncode == 0, made.stderr
            self.new_token_output = made.stdout
        self.token = self.token_file.read_text().strip() if new_token else self.env.get("LLM_TRAY_TOKEN")
        self.headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.out = (root / "agent.out").open("wb")
        self.err_path = root / "agent.err"
        self.err = self.err_path.open("wb")
        endpoint = ["--endpoint", f"{kind}={upstream}"] if upstream else []  # else: the config's
        hardware = ["--gpu", gpu] if gpu else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trayapp", "agent", *endpoint, "--no-discover", *hardware,
             "--ram-bandwidth-gbps", "50", "--metrics-port", "0", *extra],
            env=self.env, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
        )  # fmt: skip
        self.file = self.home / "data" / "sampler.json"

    def wait_ready(self, timeout_s: float = READY_S) -> dict[str, Any]:
        """The sampler file's contents, once the agent answers `/v1/glance` (with its token)."""

        def ready() -> dict[str, Any] | None:
            assert self.process.poll() is None, self.err_path.read_text()
            if not self.file.exists():
                return None
            info: dict[str, Any] = json.loads(self.file.read_text())
            try:
                response = httpx.get(info["url"] + "/v1/glance", headers=self.headers, timeout=1)
                return info if response.status_code == 200 else None
            except httpx.HTTPError:
                return None

        return wait_until(ready, timeout_s, 0.1)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, timeout_s=60)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=10)
        self.out.close()
        self.err.close()
        return code
