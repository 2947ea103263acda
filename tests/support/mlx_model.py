"""A real MLX-LM `mlx_lm.server` for tests, on a tiny model built here (no download).

`build_model` makes a Llama-architecture model with random weights in MLX's format and a byte-level
BPE tokenizer trained on a few sentences (`tokenizers`), once per recipe, into a folder under the
system's temp dir (~2 s; later sessions reuse it). The build runs in a child Python so the test
process never imports MLX. Its vocabulary holds only ASCII characters, so every generated token is
text of its own and the server streams one chunk per token. `MlxServer` starts
`python -m mlx_lm.server --model DIR` on a free loopback port, waits until `/health` says ok, keeps
its log in a file, and stops it by pid. `chat` is a separate client (streamed, with usage).

Checked with mlx 0.32.4 / mlx-lm 0.32.2 (TESTING.md §11). `mlx_available()` says whether they are
installed (Linux x86_64/aarch64 with `mlx[cpu]`, or macOS on Apple silicon).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.llama import free_port

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
BUILD_TIMEOUT_S = 300.0

# The recipe: a change here is a new model folder (its hash names it).
HIDDEN_SIZE = 256
LAYERS = 2
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A local model answers questions about code, tests and servers.",
    "user assistant system: hello world, how fast is this model today?",
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")
EOS_TOKEN_ID = 1  # "</s>": requests bias it away, so an answer runs to its max_tokens
NO_EOS = {str(EOS_TOKEN_ID): -100.0}  # the `logit_bias` that does it


def mlx_available() -> bool:
    """Whether `mlx` and `mlx_lm` are installed in this Python."""
    return all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm", "tokenizers"))


def _recipe_key() -> str:
    recipe = json.dumps([HIDDEN_SIZE, LAYERS, SENTENCES, CHAT_TEMPLATE, SPECIAL_TOKENS, 1])
    return hashlib.sha1(recipe.encode()).hexdigest()[:12]


def model_dir() -> Path:
    """Where the tiny model of this recipe lives (built or not)."""
    return Path(tempfile.gettempdir()) / f"llm-tray-mlx-model-{_recipe_key()}"


def build_model() -> Path:
    """The tiny model's folder, built first if it is not there (atomically: a temp folder renamed)."""
    target = model_dir()
    if (target / "model.safetensors").is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        subprocess.run(
            [sys.executable, "-m", "tests.support.mlx_model", str(staging)],
            check=True,
            capture_output=True,
            timeout=BUILD_TIMEOUT_S,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            staging.rename(target)
        except OSError:  # another session built it meanwhile
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_into(out: Path) -> None:  # runs in the child process (imports MLX)
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # No initial alphabet: only the characters of the sentences, all ASCII, so no token is part
    # of a multi-byte character (the server would hold such a token back and stream it later).
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(list(SENTENCES) * 20, trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 8192,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    args = {
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": LAYERS,
        "intermediate_size": 2 * HIDDEN_SIZE,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": tokenizer.get_vocab_size(),
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(args))
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(args))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))


def _client(timeout_s: float) -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=timeout_s)


class MlxServer:
    """One real `mlx_lm.server` on 127.0.0.1. `hf_cache`: the `HF_HUB_CACHE` it sees — a folder that
    does not exist (a fresh machine: `/v1/models` answers an empty body) unless one is given."""

    def __init__(self, model: Path, log_dir: Path, *, hf_cache: Path | None = None) -> None:
        self.model = model
        self.port = free_port()
        self.log_path = log_dir / f"mlx-server-{self.port}.log"
        self.hf_cache = hf_cache if hf_cache is not None else log_dir / "no-hf-cache"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model), *where]

    def start(self) -> MlxServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
        env.update(HF_HUB_CACHE=str(self.hf_cache), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        with _client(2.0) as client:
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    if client.get(self.url + "/health").json().get("status") == "ok":
                        return self
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"mlx_lm.server did not become ready within {READY_TIMEOUT_S:g} s:\n{tail}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"

    def __enter__(self) -> MlxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class StreamedChat:
    """What a client saw of one streamed chat: each content chunk's arrival, the final objects."""

    chunk_times_mono_s: list[float] = field(default_factory=list)
    usage_chunk: dict[str, Any] | None = None  # the last data object (`usage`, no choices)
    finish_chunk: dict[str, Any] | None = None  # the one with `finish_reason`
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = False  # `data: [DONE]` came
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> tuple[int, float | None, float | None]:
        """(content chunks so far, first one's time, last one's time)."""
        with self.lock:
            times = list(self.chunk_times_mono_s)
        return len(times), (times[0] if times else None), (times[-1] if times else None)


def chat(
    url: str,
    max_tokens: int,
    *,
    content: str = "hello world",
    timeout_s: float = 300.0,
    into: StreamedChat | None = None,
    extra: Mapping[str, Any] | None = None,
) -> StreamedChat:
    """One streamed `/v1/chat/completions` with usage, EOS biased away (it runs to `max_tokens`)."""
    seen = into if into is not None else StreamedChat()
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": NO_EOS,
        "temperature": 0.0,
        **(extra or {}),
    }
    with _client(timeout_s) as client, client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        seen.status = r.status_code
        seen.headers = dict(r.headers)
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line[6:].strip() == "[DONE]":
                seen.done = True
                continue
            doc = json.loads(line[6:])
            choices = doc.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                with seen.lock:
                    seen.chunk_times_mono_s.append(time.monotonic())
            if choices and choices[0].get("finish_reason"):
                seen.finish_chunk = doc
            if "usage" in doc:
                seen.usage_chunk = doc
    return seen


def raw_get(url: str, path: str, timeout_s: float = 30.0) -> bytes:
    """The server's whole answer to `GET path`, head and body as sent (it closes: HTTP/1.0)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def capture(out: Path, log_dir: Path) -> None:
    """Write tests/fixtures/mlx/ from the real server (`python -m tests.support.mlx_model capture`)."""
    out.mkdir(parents=True, exist_ok=True)
    model = build_model()
    cache = log_dir / "hf-cache"
    cache.mkdir(parents=True, exist_ok=True)
    with MlxServer(model, log_dir) as server:
        (out / "v1_models_no_hf_cache.http").write_bytes(raw_get(server.url, "/v1/models"))
        (out / "health.http").write_bytes(raw_get(server.url, "/health"))
        (out / "props_404.http").write_bytes(raw_get(server.url, "/props"))
        seen = chat(server.url, 8)
        lines = {"finish": seen.finish_chunk, "usage": seen.usage_chunk, "headers": seen.headers}
        (out / "chat_stream_end.json").write_text(json.dumps(lines, indent=1) + "\n")
        again = chat(server.url, 8)  # the same prompt again: its cached tokens
        (out / "chat_stream_usage_cached.json").write_text(json.dumps(again.usage_chunk, indent=1) + "\n")
    with MlxServer(model, log_dir, hf_cache=cache) as server:
        (out / "v1_models_hf_cache.http").write_bytes(raw_get(server.url, "/v1/models"))


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture(Path(sys.argv[2]), Path(tempfile.mkdtemp(prefix="mlx-capture-")))
    else:
        _build_into(Path(sys.argv[1]))
