"""A real llama-server with --api-key: unauthorized until the config names where the key is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.llama import LlamaServer
from trayapp.config import paths

pytestmark = pytest.mark.llamacpp


def _status(*args: str, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "status", "--json", "--no-discover", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_key_from_a_named_environment_variable(llama_binary: Path, model_path: Path, tmp_path: Path) -> None:
    with LlamaServer(model_path, binary=llama_binary, api_key="sk-test-42", log_dir=tmp_path) as server:
        env = dict(os.environ)
        without = _status("--endpoint", f"llamacpp={server.url}", env=env)
        assert without["servers"][0]["status"] == "unauthorized"
        assert "API key" in without["servers"][0]["reason"]

        config = paths.config_file()
        config.write_text(
            f'[[endpoints]]\nurl = "{server.url}"\nkind = "llamacpp"\napi_key_env = "LLM_TRAY_TEST_KEY"\n'
        )
        env["LLM_TRAY_TEST_KEY"] = "sk-test-42"
        with_key = _status(env=env)
        server_json = with_key["servers"][0]
        assert server_json["status"] == "ok", server_json
        assert server_json["models"][0]["context_length"] == 8192
        assert "sk-test-42" not in json.dumps(with_key)  # the key never shows up in output
        assert "sk-test-42" not in config.read_text()
