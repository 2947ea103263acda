"""Fake Ollama / LM Studio servers and a fake `lms` CLI for tests (loopback only).

No binary of Ollama or LM Studio can be installed here, so their adapters are
tested against these fakes. They serve payloads shaped exactly like
`tests/fixtures/ollama/` (ollama/ollama v0.32.15 `api/types.go`) and
`tests/fixtures/lmstudio/` (LM Studio 0.4.x REST v1 + v0 per lmstudio-ai/docs,
`lms` per lmstudio-ai/lms) and change over time under the test's control:
models load and unload, a context grows and `size_vram` shrinks.
"""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import fake_http
from tests.support.fake_http import FakeServer
from tests.support.paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR


def fixture_json(relative: str) -> Any:
    return json.loads((FIXTURES / relative).read_text(encoding="utf-8"))


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Call `predicate` until it returns something truthy; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


Reply = tuple[int, Any]  # (HTTP status, JSON-able body, or a str sent as text/plain)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class FakeHttpServer(FakeServer):
    """A `FakeServer` that starts at once and speaks HTTP/1.1. Subclasses implement `route`.

    `overrides` (path -> canned reply, for errors and garbage) win over `route`;
    `delays_s` (path -> seconds) stall an answer. Stop it with `close` or a `with` block.
    """

    protocol_version = "HTTP/1.1"

    def __init__(self) -> None:
        self.overrides: dict[str, Reply] = {}
        self.delays_s: dict[str, float] = {}
        super().__init__()
        self.start()

    def respond(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> fake_http.Reply | fake_http.Handler:
        status, payload = self.overrides.get(path) or self.route(method, path, _json_body(body), headers)
        if isinstance(payload, str):
            reply = fake_http.text_reply(payload, status)
        else:
            reply = fake_http.json_reply(payload, status)
        delay_s = self.delays_s.get(path, 0.0)
        return fake_http.delayed(reply, delay_s) if delay_s else reply

    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        return 404, {"error": "not found"}

    def close(self) -> None:
        self.stop()


class FakeLlamaSlots(FakeHttpServer):
    """Only `GET /slots` of a llama-server child (shape: captured b11434 `/slots`)."""

    def __init__(self, slots: list[dict[str, Any]]) -> None:
        self.slots = copy.deepcopy(slots)
        super().__init__()

    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if method == "GET" and path == "/slots":
            return 200, self.slots
        return 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}


class FakeOllama(FakeHttpServer):
    """Ollama v0.32.15: `/api/version`, `/api/ps`, `/api/tags`, `POST /api/show`.

    `loaded` holds `/api/ps` entries (`ProcessModelResponse`), `installed` the
    `/api/tags` entries and `shows` the `/api/show` bodies, all keyed by name.
    Starts with the fixture library installed and nothing loaded.
    """

    version = "0.32.15"

    def __init__(self) -> None:
        self.loaded: dict[str, dict[str, Any]] = {}
        self.installed = {m["name"]: m for m in fixture_json("ollama/api_tags.json")["models"]}
        self.shows = {
            "llama3.1:8b": fixture_json("ollama/api_show.json"),
            "qwen3:30b": fixture_json("ollama/api_show_moe.json"),
        }
        self._ps_templates = {m["name"]: m for m in fixture_json("ollama/api_ps.json")["models"]}
        super().__init__()

    def load(self, name: str, **fields: Any) -> dict[str, Any]:
        """Load a fixture model (`llama3.1:8b`, `qwen3:30b`) or any model given all its fields."""
        entry = copy.deepcopy(self._ps_templates.get(name, {"name": name, "model": name}))
        entry.update(fields)
        with self.lock:
            self.loaded[name] = entry
        return entry

    def unload(self, name: str) -> None:
        with self.lock:
            self.loaded.pop(name, None)

    def set_context(self, name: str, context_length: int, *, size: int, size_vram: int) -> None:
        """A reload with a larger `num_ctx`: KV grows, so `size` grows and fewer layers fit on the GPU."""
        with self.lock:
            self.loaded[name].update(context_length=context_length, size=size, size_vram=size_vram)

    def set_sizes(self, name: str, *, size: int, size_vram: int) -> None:
        """Sizes as `/api/ps` reports them, odd ones included: `size == 0` (which `ollama ps` shows as
        unknown placement) or `size_vram > size` (no valid GPU share either)."""
        with self.lock:
            self.loaded[name].update(size=size, size_vram=size_vram)

    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if method == "GET" and path == "/":
            return 200, "Ollama is running"
        if method == "GET" and path == "/api/version":
            return 200, {"version": self.version}
        if method == "GET" and path == "/api/ps":
            # Sorted like PsHandler: longest time remaining first.
            models = sorted(self.loaded.values(), key=lambda m: m.get("expires_at", ""), reverse=True)
            return 200, {"models": copy.deepcopy(models)}
        if method == "GET" and path == "/api/tags":
            return 200, {"models": copy.deepcopy(list(self.installed.values()))}
        if method == "POST" and path == "/api/show":
            name = (body or {}).get("model") if isinstance(body, dict) else None
            if name in self.shows:
                return 200, copy.deepcopy(self.shows[name])
            return 404, {"error": f"model '{name}' not found"}
        return 404, "404 page not found"


def v0_id(key: str) -> str:
    """REST v0's model id for a v1 `key` (= `lms` modelKey): the key without its `publisher/` prefix."""
    return key.rsplit("/", 1)[-1]


class FakeLmStudio(FakeHttpServer):
    """LM Studio 0.4.x: `GET /api/v1/models` (+ legacy `/api/v0/models`), optional Bearer token.

    `models` holds v1 entries (fixture `api_v1_models.json`); the v0 list is derived
    from them, with v0's ids (no publisher prefix: v1 `qwen/qwen3-30b-a3b` is v0
    `qwen3-30b-a3b`, as in `api_v0_models.json`). With `v1=False` it behaves like a
    pre-0.4 build (404 on `/api/v1/*`).
    """

    def __init__(self, *, v1: bool = True, api_key: str | None = None) -> None:
        self.v1 = v1
        self.api_key = api_key
        self.models = {m["key"]: m for m in fixture_json("lmstudio/api_v1_models.json")["models"]}
        super().__init__()

    def load(
        self, key: str, *, context_length: int, instance_id: str | None = None, parallel: int = 4
    ) -> None:
        instance = {
            "id": instance_id or key,
            "config": {
                "context_length": context_length,
                "eval_batch_size": 512,
                "parallel": parallel,
                "flash_attention": True,
                "offload_kv_cache_to_gpu": True,
            },
        }
        with self.lock:
            self.models[key]["loaded_instances"] = [
                i for i in self.models[key]["loaded_instances"] if i["id"] != instance["id"]
            ] + [instance]

    def unload(self, key: str) -> None:
        with self.lock:
            self.models[key]["loaded_instances"] = []

    def _v0(self) -> dict[str, Any]:
        data = []
        for m in self.models.values():
            entry = {
                "id": v0_id(m["key"]),
                "object": "model",
                "type": "embeddings" if m["type"] == "embedding" else m["type"],
                "publisher": m["publisher"],
                "arch": m.get("architecture", "unknown"),
                "compatibility_type": m["format"],
                "quantization": m["quantization"]["name"],
                "state": "loaded" if m["loaded_instances"] else "not-loaded",
                "max_context_length": m["max_context_length"],
            }
            if m["loaded_instances"]:
                entry["loaded_context_length"] = m["loaded_instances"][0]["config"]["context_length"]
            data.append(entry)
        return {"object": "list", "data": data}

    def route(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if self.api_key and headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {
                "error": {"message": "Invalid or missing API token", "type": "invalid_request_error"}
            }
        if method == "GET" and path == "/api/v1/models" and self.v1:
            return 200, {"models": copy.deepcopy(list(self.models.values()))}
        if method == "GET" and path == "/api/v0/models":
            return 200, self._v0()
        return 404, {"error": f"Unexpected endpoint or method. ({method} {path})"}


_FAKE_LMS = r'''#!{python}
"""Fake `lms` (see tests/support/fake_servers.py). Control files live in {control!r}."""
import json, os, sys, time

CONTROL = {control!r}
args = sys.argv[1:]
with open(os.path.join(CONTROL, "calls.ndjson"), "a") as f:
    f.write(json.dumps({{"pid": os.getpid(), "args": args}}) + "\n")

if args[:2] == ["ps", "--json"]:
    with open(os.path.join(CONTROL, "ps.json")) as f:
        sys.stdout.write(f.read())
    sys.exit(0)

if args[:2] == ["log", "stream"]:
    spool = os.path.join(CONTROL, "log.ndjson")
    offset_file = os.path.join(CONTROL, "log.offset")
    deadline = time.monotonic() + 120  # never outlive a test run
    while time.monotonic() < deadline and os.getppid() != 1:
        offset = int(open(offset_file).read() or 0) if os.path.exists(offset_file) else 0
        with open(spool, "rb") as f:
            f.seek(offset)
            data = f.read()
        while b"\n" in data:
            line, data = data.split(b"\n", 1)
            offset += len(line) + 1
            with open(offset_file, "w") as f:
                f.write(str(offset))
            if line.strip() == b"EXIT":
                sys.exit(3)
            sys.stdout.buffer.write(line + b"\n")
            sys.stdout.flush()
        time.sleep(0.02)
    sys.exit(0)

sys.stderr.write("fake lms: unsupported arguments %r\n" % (args,))
sys.exit(2)
'''


class FakeLms:
    """A fake `lms` executable in `bin_dir` (put it first on PATH).

    `lms log stream ... --json` prints the lines given to `emit` as they come
    (a line `EXIT` makes it exit, to test restarts); `lms ps --json` prints
    whatever `set_ps` stored. Every call is logged with its pid and arguments.
    """

    def __init__(self, root: Path) -> None:
        self.bin_dir = root / "bin"
        self.control = root / "lms-control"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        self.control.mkdir(parents=True, exist_ok=True)
        (self.control / "log.ndjson").write_bytes(b"")
        self.set_ps([])
        self.path = self.bin_dir / "lms"
        self.path.write_text(_FAKE_LMS.format(python=sys.executable, control=str(self.control)))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def emit(self, *lines: str) -> None:
        with open(self.control / "log.ndjson", "a", encoding="utf-8") as f:
            for line in lines:
                f.write(line.rstrip("\n") + "\n")

    def exit_stream(self) -> None:
        self.emit("EXIT")

    def set_ps(self, data: Any) -> None:
        tmp = self.control / "ps.json.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.control / "ps.json")

    def calls(self) -> list[dict[str, Any]]:
        path = self.control / "calls.ndjson"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stream_calls(self) -> list[dict[str, Any]]:
        return [c for c in self.calls() if c["args"][:2] == ["log", "stream"]]
