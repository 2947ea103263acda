"""A real llama-server started the way Ollama ≥ 0.30 starts its per-model child.

A tiny launcher renames itself `ollama` (prctl PR_SET_NAME, so psutil sees the
name a real Ollama process has) and starts the real `llama-server` with
Ollama's flags (`--model <blob> --port N --no-webui --offline -c … -np 1`, no
`--metrics`; reference/backends.md §1.1). The model file is reached through
an Ollama-style blob path (`blobs/sha256-<hex>`). A fake Ollama v0.32.15 API
lists that model; its `/api/show` `modelfile` names the blob, as Ollama's does.
While a separate client generates on the child's port, OllamaProbe must find
the child with psutil and report its live slots for that model.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.llama import free_port, generate_in_background
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.processes import find_ollama_children
from trayapp.sources.servers.ollama import OllamaProbe

pytestmark = pytest.mark.llamacpp

LAUNCHER = textwrap.dedent(
    """
    import ctypes, signal, subprocess, sys

    libc = ctypes.CDLL(None)
    libc.prctl(15, b"ollama", 0, 0, 0)  # PR_SET_NAME: the process is now named "ollama"
    child = subprocess.Popen(
        sys.argv[1:],
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: libc.prctl(1, signal.SIGTERM, 0, 0, 0),  # PR_SET_PDEATHSIG: die with us
    )
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    sys.exit(child.wait())
    """
)


class FakeOllamaParent:
    """The launcher process ("ollama") and its llama-server child."""

    def __init__(self, binary: Path, blob: Path, port: int, log: Path) -> None:
        script = log.parent / "ollama_launcher.py"
        script.write_text(LAUNCHER)
        args = [str(binary), "--model", str(blob), "--port", str(port), "--host", "127.0.0.1"]
        args += ["--no-webui", "--offline", "-c", "4096", "-np", "1", "-t", "1"]
        self.port = port
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=self._log, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            children = []
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for child in children:  # never leave a llama-server behind
            if child.is_running():
                child.kill()
        self._log.close()


@pytest.fixture
def ollama_child(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> Iterator[tuple[FakeOllamaParent, Path]]:
    blobs = tmp_path / "models" / "blobs"
    blobs.mkdir(parents=True)
    # Ollama names blobs by their content digest; a digest of the path stands in for it here.
    blob = blobs / ("sha256-" + hashlib.sha256(str(model_path).encode()).hexdigest())
    blob.symlink_to(model_path)
    parent = FakeOllamaParent(llama_binary, blob, free_port(), tmp_path / "child.log")
    try:
        with httpx.Client(trust_env=False, timeout=2.0) as client:

            def ready() -> bool:
                assert parent.proc.poll() is None, (tmp_path / "child.log").read_text(errors="replace")[
                    -3000:
                ]
                try:
                    return client.get(f"http://127.0.0.1:{parent.port}/health").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, timeout_s=90, interval_s=0.2)
        yield parent, blob
    finally:
        parent.stop()


def test_probe_reads_the_ollama_child_slots(ollama_child: tuple[FakeOllamaParent, Path]) -> None:
    parent, blob = ollama_child
    assert psutil.Process(parent.proc.pid).name() == "ollama"
    [child] = [c for c in find_ollama_children() if c.parent_pid == parent.proc.pid]
    assert child.port == parent.port
    assert child.model_path == str(blob)

    with FakeOllama() as ollama:
        ollama.load(
            "gemma3:270m",
            size=560_000_000,
            size_vram=0,  # CPU only
            digest="e7d3a1f0" * 8,  # the manifest digest: not the blob's
            details={
                "parent_model": "",
                "format": "gguf",
                "family": "gemma3",
                "families": ["gemma3"],
                "parameter_size": "268.10M",
                "quantization_level": "Q4_K_M",
            },
            expires_at="2026-09-30T14:42:07.118240113+02:00",
            context_length=4096,
        )
        ollama.shows["gemma3:270m"] = {
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {blob}\n',
            "details": {"family": "gemma3", "parameter_size": "268.10M", "quantization_level": "Q4_K_M"},
            "model_info": {
                "general.architecture": "gemma3",
                "general.parameter_count": 268098176,
                "gemma3.block_count": 18,
                "gemma3.attention.head_count": 4,
                "gemma3.attention.head_count_kv": 1,
                "gemma3.attention.key_length": 256,
                "gemma3.attention.value_length": 256,
                "gemma3.context_length": 32768,
                "gemma3.embedding_length": 640,
            },
        }
        probe = OllamaProbe(ollama.url, facts_loader=ModelFactsLoader())
        try:
            idle = probe.poll(0.0)
            [model] = idle.models
            assert model.server_pid == child.pid
            assert model.live_rate_reason is None
            assert idle.pid == parent.proc.pid
            [slot] = model.slots
            assert slot.n_ctx == 4096 and not slot.is_processing

            result = generate_in_background(
                f"http://127.0.0.1:{parent.port}", "Once upon a time", 256, ignore_eos=True
            )
            seen: list[int] = []
            clock = [1.0]

            def decoding_progresses() -> bool:
                clock[0] += 1
                [m] = probe.poll(clock[0]).models
                [s] = m.slots
                if s.is_processing and s.n_decoded:
                    seen.append(s.n_decoded)
                return len(seen) >= 2 and seen[-1] > seen[0]

            wait_until(decoding_progresses, timeout_s=120, interval_s=0.1)
            assert result.result(timeout=180)["tokens_predicted"] == 256

            def finished() -> bool:
                clock[0] += 1
                [m] = probe.poll(clock[0]).models
                [s] = m.slots
                # After a task, n_decoded resets; the KV cache holds prompt + the 256 generated tokens.
                return not s.is_processing and (s.context_tokens or 0) > 256

            wait_until(finished, timeout_s=30)

            # The exact facts, read from the child's model file in the background, replace the estimate.
            def exact() -> bool:
                clock[0] += 1
                [m] = probe.poll(clock[0]).models
                return m.facts is not None and m.facts.exact

            wait_until(exact, timeout_s=60, interval_s=0.2)
            [model] = probe.poll(clock[0] + 1).models
            assert model.facts is not None and model.facts.weights_bytes == 246_587_904
        finally:
            probe.close()
