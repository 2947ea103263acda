"""Fake Ollama / LM Studio servers and a fake `lms` CLI for tests (loopback only).

No binary of Ollama or LM Studio can be installed here, so their adapters are
tested against these fakes. They serve payloads shaped exactly like
`tests/fixtures/ollama/` (ollama/ollama v0.32.15 `api/types.go`) and
`tests/fixtures/lmstudio/` (LM Studio 0.4.x REST v1 + v0 per lmstudio-ai/docs,
`lms` per lmstudio-ai/lms) and change over time under the test's control:
models load and unload, a context grows and `size_vram` shrinks. The fake Ollama also
generates, and cuts a too-long prompt and logs it as Ollama does (`FakeOllama`).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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


OLLAMA_TRUNCATION_SOURCE = "llama_server.go:317"  # the slog.Warn's file:line at ollama/ollama fb30760
OLLAMA_NO_SHIFT_ERROR = (  # llm/llama_server.go:295-300 (context shift off: deepseek2, or "shift": false)
    "the prompt is longer than the context length currently available to the model; shorten the prompt, "
    "adjust the context length in settings, or use a model with a longer context length"
)
OLLAMA_GENERATION_PATHS = ("/api/chat", "/api/generate", "/v1/chat/completions")


def ollama_words(text: object) -> int:
    """The fake's tokenizer: one token per whitespace-separated word (a list of OpenAI content parts:
    their text parts). Real Ollama counts with the model's own tokenizer; the rules are the same."""
    if isinstance(text, list):
        return sum(
            ollama_words(p.get("text")) for p in text if isinstance(p, dict) and p.get("type") == "text"
        )
    return len(text.split()) if isinstance(text, str) else 0


def slog_time(moment: datetime) -> str:
    """Go slog's text `time=` value: RFC 3339, milliseconds, the local offset (`Z` at UTC)."""
    text = moment.isoformat(timespec="milliseconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


@dataclass(frozen=True)
class OllamaGeneration:
    """What the fake did with one generation request (counts only)."""

    path: str
    model: str
    num_ctx: int  # the runner's context for it (after any reload)
    prompt_tokens: int  # the prompt the runner tokenized (after /api/chat dropped old messages), BOS included
    prompt_eval_count: int  # what the runner read, as reported
    messages_dropped: int = 0  # whole older messages /api/chat left out to fit (chatPrompt)
    status: int = 200


class FakeOllama(FakeHttpServer):
    """Ollama v0.32.15: `/api/version`, `/api/ps`, `/api/tags`, `POST /api/show`, and generation with
    Ollama's silent prompt truncation: `POST /api/chat`, `/api/generate`, `/v1/chat/completions`.

    `loaded` holds `/api/ps` entries (`ProcessModelResponse`), `installed` the
    `/api/tags` entries and `shows` the `/api/show` bodies, all keyed by name.
    Starts with the fixture library installed and nothing loaded.

    Generation follows ollama/ollama at fb30760 (v0.33.0-rc2; the rules of v0.30.11 and later):

    * The runner's context: a native request's `options.num_ctx`, else `default_num_ctx` (Ollama's
      default: OLLAMA_CONTEXT_LENGTH, or 4096/32768/262144 by VRAM, server/routes.go:2048-2057),
      capped at the model's trained context (`<arch>.context_length` in `/api/show`,
      server/sched.go:161 `effectiveContext`). `/v1/chat/completions` has no way to ask for one
      (openai/openai.go `ChatCompletionRequest` has no options; `FromChatRequest` sets none), so it
      always asks for the default. A model loaded at another context is reloaded at the asked one,
      unless both it and the request use the default (server/sched.go:1396-1401 `needsReload`); its
      `/api/ps` `context_length` follows. A model not loaded is loaded (the fixture's entry).
    * `/api/chat` and `/v1/chat/completions` first leave out whole older messages, keeping the system
      ones and always the last, until the rest is at most `num_ctx` tokens (server/prompt.go:23-91
      `chatPrompt`; logged at DEBUG only, so not here).
    * The runner tokenizes the prompt (+1 BOS token when `/api/show` says
      `tokenizer.ggml.add_bos_token`); longer than `num_ctx`-1 tokens, it keeps `keep` = `num_keep`
      (`options.num_keep`, default 4; +1 with BOS; at most `num_ctx`-1) and the tail, to
      `limit` = `num_ctx` - max((`num_ctx` - `keep`) // 2, 1) tokens, and appends Ollama's WARN line to
      `log_path` (llm/llama_server.go:279-331). With `"shift": false`, or a deepseek2 model, HTTP 400
      instead (llm/llama_server.go:295-300). `"truncate": false` is not modelled (501).
    * `prompt_eval_count` (and `/v1`'s `usage.prompt_tokens`) = the tokens the runner read
      (llama-server `cache_n + prompt_n`, llm/llama_server.go:1511); `eval_count` = `answer_tokens`, or
      `num_predict` / `max_tokens` when smaller, which ends it with `done_reason` "length" (else "stop").
      Native requests stream NDJSON unless `"stream": false`; `/v1` streams SSE only with `"stream": true`.
    * Each request appends a `[GIN]` line to `log_path`, as gin's logger does. Prompt text is never kept.
    """

    version = "0.32.15"
    default_num_ctx = 4096  # OLLAMA_CONTEXT_LENGTH unset, under 23 GiB of VRAM
    default_num_keep = 4  # api/types.go:1102
    answer_tokens = 8

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.generations: list[OllamaGeneration] = []
        self._ctx_auto: dict[str, bool] = {}  # loaded model -> its context is the default (no num_ctx asked)
        self._seq = 0
        self.loaded: dict[str, dict[str, Any]] = {}
        self.installed = {m["name"]: m for m in fixture_json("ollama/api_tags.json")["models"]}
        self.shows = {
            "llama3.1:8b": fixture_json("ollama/api_show.json"),
            "qwen3:30b": fixture_json("ollama/api_show_moe.json"),
        }
        self._ps_templates = {m["name"]: m for m in fixture_json("ollama/api_ps.json")["models"]}
        super().__init__()

    def load(self, name: str, *, num_ctx_auto: bool = False, **fields: Any) -> dict[str, Any]:
        """Load a fixture model (`llama3.1:8b`, `qwen3:30b`) or any model given all its fields.

        `num_ctx_auto`: it was loaded at the default context (no `num_ctx` asked), so a request that
        asks for none keeps it as it is."""
        entry = copy.deepcopy(self._ps_templates.get(name, {"name": name, "model": name}))
        entry.update(fields)
        with self.lock:
            self.loaded[name] = entry
            self._ctx_auto[name] = num_ctx_auto
        return entry

    def unload(self, name: str) -> None:
        with self.lock:
            self.loaded.pop(name, None)
            self._ctx_auto.pop(name, None)

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

    # -- generation (called holding `lock`)

    def respond(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> fake_http.Reply | fake_http.Handler:
        if method == "POST" and path in OLLAMA_GENERATION_PATHS and path not in self.overrides:
            request = _json_body(body)
            if not isinstance(request, dict):
                return fake_http.json_reply({"error": "invalid request body"}, 400)
            reply, status = self._generate(path, request)
            self._log(
                f"[GIN] {time.strftime('%Y/%m/%d - %H:%M:%S')} | {status} |      1.234567ms |"
                f'       127.0.0.1 | POST     "{path}"'
            )
            return reply
        return super().respond(method, path, body, headers)

    def _log(self, line: str) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")  # one write per record, as slog and gin do

    def _runner_ctx(self, name: str, asked: int | None) -> int:
        """The context the model runs at for this request, reloading it when that changes."""
        show = self.shows.get(name, {})
        info = show.get("model_info", {}) if isinstance(show, dict) else {}
        trained = info.get(f"{info.get('general.architecture')}.context_length")
        want = asked if asked is not None else self.default_num_ctx
        if isinstance(trained, int) and trained > 0 and want > trained:
            want = trained
        entry = self.loaded.get(name)
        if entry is None:
            entry = copy.deepcopy(self._ps_templates.get(name, {"name": name, "model": name}))
            self.loaded[name] = entry
        elif self._ctx_auto.get(name) and asked is None:
            return int(entry["context_length"])
        entry["context_length"] = want
        self._ctx_auto[name] = asked is None
        return want

    def _adds_bos(self, name: str) -> bool:
        info = self.shows.get(name, {}).get("model_info", {})
        return info.get("tokenizer.ggml.add_bos_token") is True

    def _generate(self, path: str, request: dict[str, Any]) -> tuple[fake_http.Reply, int]:
        native = path.startswith("/api/")
        name = request.get("model")
        if not isinstance(name, str) or (name not in self.installed and name not in self.loaded):
            return fake_http.json_reply({"error": f"model '{name}' not found"}, 404), 404
        options = request.get("options") if native and isinstance(request.get("options"), dict) else {}
        asked = options.get("num_ctx") if isinstance(options.get("num_ctx"), int) else None
        num_ctx = self._runner_ctx(name, asked)

        dropped = 0
        if path == "/api/generate":
            words = ollama_words(request.get("system")) + ollama_words(request.get("prompt"))
        else:  # chatPrompt: leave out older messages (never system ones, never the last) until it fits
            messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
            counts = [ollama_words(m.get("content")) for m in messages]
            words = sum(counts)
            for i in range(len(messages)):
                kept = sum(c for j, c in enumerate(counts[:i]) if messages[j].get("role") == "system")
                kept += sum(counts[i:])
                if kept <= num_ctx or i == len(messages) - 1:
                    words, dropped = kept, i - sum(1 for m in messages[:i] if m.get("role") == "system")
                    break
        tokens = words + (1 if self._adds_bos(name) else 0)

        read = tokens
        if tokens > num_ctx - 1:
            if native and request.get("truncate") is False:
                return fake_http.json_reply(
                    {"error": "fake Ollama: truncate=false is not modelled"}, 501
                ), 501
            family = self.loaded[name].get("details", {}).get("family")
            if (native and request.get("shift") is False) or family == "deepseek2":
                self.generations.append(OllamaGeneration(path, name, num_ctx, tokens, 0, dropped, 400))
                return fake_http.json_reply({"error": OLLAMA_NO_SHIFT_ERROR}, 400), 400
            num_keep = options.get("num_keep", self.default_num_keep)
            keep = tokens if num_keep < 0 else num_keep
            keep = min(keep + (1 if self._adds_bos(name) else 0), num_ctx - 1)
            read = num_ctx - max((num_ctx - keep) // 2, 1)
            self._log(
                f"time={slog_time(datetime.now().astimezone())} level=WARN source={OLLAMA_TRUNCATION_SOURCE} "
                f'msg="truncating input prompt" limit={read} prompt={tokens} keep={keep} new={read}'
            )
        self.generations.append(OllamaGeneration(path, name, num_ctx, tokens, read, dropped))

        limit = options.get("num_predict") if native else request.get("max_tokens")
        answer = (
            self.answer_tokens if not isinstance(limit, int) or limit < 0 else min(limit, self.answer_tokens)
        )
        reason = "length" if answer < self.answer_tokens else "stop"
        pieces = [("" if i == 0 else " ") + "word" for i in range(answer)]
        if native:
            return self._native_reply(path, request, name, pieces, reason, read), 200
        return self._openai_reply(request, name, pieces, reason, read), 200

    def _native_reply(
        self, path: str, request: dict[str, Any], name: str, pieces: list[str], reason: str, read: int
    ) -> fake_http.Reply:
        def obj(text: str, done: bool) -> dict[str, Any]:
            key = "message" if path == "/api/chat" else "response"
            value: Any = {"role": "assistant", "content": text} if key == "message" else text
            out: dict[str, Any] = {
                "model": name,
                "created_at": slog_time(datetime.now().astimezone()),
                key: value,
                "done": done,
            }
            if done:
                out |= {
                    "done_reason": reason,
                    "total_duration": 1_500_000_000,
                    "load_duration": 1_000_000,
                    "prompt_eval_count": read,
                    "prompt_eval_duration": 1_000_000_000,
                    "eval_count": len(pieces),
                    "eval_duration": 499_000_000,
                }
            return out

        if request.get("stream") is False:
            return fake_http.json_reply(obj("".join(pieces), True))
        lines = [obj(p, False) for p in pieces] + [obj("", True)]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        return fake_http.Reply(200, body, "application/x-ndjson")

    def _openai_reply(
        self, request: dict[str, Any], name: str, pieces: list[str], reason: str, read: int
    ) -> fake_http.Reply:
        self._seq += 1
        usage = {"prompt_tokens": read, "completion_tokens": len(pieces), "total_tokens": read + len(pieces)}
        base = {
            "id": f"chatcmpl-{self._seq}",
            "created": int(time.time()),
            "model": name,
            "system_fingerprint": "fp_ollama",
        }
        if request.get("stream") is not True:
            message = {"role": "assistant", "content": "".join(pieces)}
            choice = {"index": 0, "message": message, "finish_reason": reason}
            return fake_http.json_reply(
                base | {"object": "chat.completion", "choices": [choice], "usage": usage}
            )
        chunk = base | {"object": "chat.completion.chunk"}
        events = [
            chunk
            | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": p}, "finish_reason": None}]}
            for p in pieces
        ]
        events.append(
            chunk
            | {
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": reason}
                ]
            }
        )
        if (request.get("stream_options") or {}).get("include_usage"):
            events.append(chunk | {"choices": [], "usage": usage})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return fake_http.Reply(200, body.encode(), "text/event-stream")


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

if args[:2] == ["runtime", "ls"]:
    path = os.path.join(CONTROL, "runtime.txt")
    if not os.path.exists(path):
        sys.exit(2)
    with open(path, encoding="utf-8") as f:
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

    def set_runtime(self, text: str) -> None:
        """What `lms runtime ls` prints (without it, the command fails as an older `lms` would)."""
        tmp = self.control / "runtime.txt.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.control / "runtime.txt")

    def calls(self) -> list[dict[str, Any]]:
        path = self.control / "calls.ndjson"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stream_calls(self) -> list[dict[str, Any]]:
        return [c for c in self.calls() if c["args"][:2] == ["log", "stream"]]
