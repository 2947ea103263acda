"""LlamaCppProbe against a real llama-server serving the real Gemma 3 270M Q4_K_M model."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_servers import wait_until
from tests.support.llama import LlamaServer, generate, generate_in_background
from trayapp.core.model import ModelFacts, ModelReading, ServerReading, SlotReading
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.servers.llamacpp import API_KEY_REJECTED, API_KEY_REQUIRED, LlamaCppProbe

pytestmark = pytest.mark.llamacpp

FACTS = ModelFacts(weights_bytes=246587904, bytes_per_token=180_000_000, exact=True, source="test")


def poll_until(probe: LlamaCppProbe, status: str, timeout_s: float = 30.0) -> ServerReading:
    deadline = time.monotonic() + timeout_s
    reading = probe.poll(time.monotonic())
    while reading.status != status and time.monotonic() < deadline:
        time.sleep(0.2)
        reading = probe.poll(time.monotonic())
    assert reading.status == status, f"still {reading.status}: {reading.reason}"
    return reading


def test_reads_the_real_server(llama_server: LlamaServer, model_path: Path) -> None:
    calls: list[str] = []

    def loader(path: str) -> ModelFacts:
        calls.append(path)
        return FACTS

    probe = LlamaCppProbe(llama_server.url, facts_loader=ModelFactsLoader(loader), metrics_interval_s=0.0)
    try:
        readings: list[ServerReading] = []

        def facts_arrived() -> bool:  # the model file is read off the poll thread
            readings.append(probe.poll(float(len(readings))))
            return readings[-1].models[0].facts is not None

        wait_until(facts_arrived, timeout_s=30.0)
        readings += [probe.poll(float(len(readings) + t)) for t in range(3)]
    finally:
        probe.close()
    reading = readings[-1]
    assert reading.status == "ok", reading.reason
    assert reading.reason is None and reading.version  # build_info, e.g. "b0-unknown"
    (model,) = reading.models
    assert model.name == model_path.name == "gemma-3-270m-q4_k_m.gguf"
    assert model.model_path == str(model_path)
    assert model.context_length == 8192
    assert model.quantization == "Q4_K_M"
    assert model.weights_bytes == 246587904 and model.parameter_count == 268098176
    first_slots = readings[0].models[0].slots
    assert len(first_slots) == 1 and first_slots[0].n_ctx == 8192  # the first poll looks at /slots
    assert model.slots == ()  # then, idle, it never asks again (/slots resets the idle timer)
    assert model.counters is not None and model.counters.tokens_predicted_total is not None
    assert model.counters.process_start_s is not None
    assert model.facts == FACTS
    assert calls == [str(model_path)]  # once, however many polls


def test_live_progress_of_another_clients_request(llama_server: LlamaServer) -> None:
    probe = LlamaCppProbe(llama_server.url, metrics_interval_s=0.0)
    try:
        before = probe.poll(time.monotonic()).models[0].counters
        assert before is not None and before.tokens_predicted_total is not None
        job = generate_in_background(
            llama_server.url,
            "Write a long story about a lighthouse keeper.",
            400,
            ignore_eos=True,
            temperature=0.0,
        )
        busy: list[SlotReading] = []
        readings: list[ModelReading] = []
        deadline = time.monotonic() + 90.0
        while not job.done() and time.monotonic() < deadline:
            # Idle, the probe asks /slots only once the server's CPU use says work appeared.
            readings.append(probe.poll(time.monotonic()).models[0])
            slots = readings[-1].slots
            if slots and slots[0].is_processing and slots[0].n_decoded:
                busy.append(slots[0])
            time.sleep(0.25)
        result = job.result(timeout=60.0)
        after_reading = probe.poll(time.monotonic())
        readings.append(after_reading.models[0])
    finally:
        probe.close()

    assert result["tokens_predicted"] == 400
    assert len(busy) >= 3, f"only {len(busy)} busy polls caught"
    decoded = [s.n_decoded or 0 for s in busy]
    context = [s.context_tokens or 0 for s in busy]
    assert decoded == sorted(decoded) and decoded[-1] > decoded[0]
    assert context == sorted(context) and context[-1] > context[0]
    assert all(s.task_id == busy[0].task_id for s in busy)
    # The first /slots answer after the busy ones shows the slot idle. If the request ended between
    # two polls, that answer came inside the loop, and the poll after it asked no /slots at all.
    answered = [m for m in readings if m.slots]
    ended = answered[-1]
    assert not ended.slots[0].is_processing and ended.busy is False
    model = after_reading.models[0]
    assert model.busy is False or (model.slots == () and model.busy is None and ended is not model)
    assert model.counters is not None and model.counters.tokens_predicted_total is not None
    assert model.counters.tokens_predicted_total - before.tokens_predicted_total >= 400


def test_api_key(llama_binary: Path, model_path: Path, tmp_path: Path) -> None:
    with LlamaServer(model_path, binary=llama_binary, api_key="K-test-123", log_dir=tmp_path) as server:
        without = LlamaCppProbe(server.url)
        wrong = LlamaCppProbe(server.url, api_key="nope")
        right = LlamaCppProbe(server.url, api_key="K-test-123")
        try:
            no_key, bad_key, good_key = without.poll(0.0), wrong.poll(0.0), right.poll(0.0)
        finally:
            for probe in (without, wrong, right):
                probe.close()
        completion = generate(server.url, "Hi", 4, api_key="K-test-123")
    assert no_key.status == "unauthorized" and no_key.reason == API_KEY_REQUIRED
    assert bad_key.status == "unauthorized" and bad_key.reason == API_KEY_REJECTED
    assert good_key.status == "ok", good_key.reason
    assert good_key.models[0].context_length == 8192 and good_key.models[0].slots
    assert completion["tokens_predicted"] == 4


def test_killed_server_comes_back_by_itself(llama_binary: Path, model_path: Path, tmp_path: Path) -> None:
    with LlamaServer(model_path, binary=llama_binary, log_dir=tmp_path) as server:
        probe = LlamaCppProbe(server.url, props_refresh_s=3600.0)
        try:
            first = probe.poll(0.0)
            assert first.status == "ok" and first.models[0].context_length == 8192

            server.kill()
            down = probe.poll(1.0)
            assert down.status == "unreachable" and down.models == ()
            assert down.reason is not None and "refused" in down.reason

            server.ctx_size = 4096  # restarted with other flags: props must be read again at once
            server.restart()
            back = poll_until(probe, "ok")
        finally:
            probe.close()
    assert back.models[0].context_length == 4096
    assert back.models[0].name == model_path.name


def test_debug_slots_text_never_reaches_a_reading(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """With LLAMA_SERVER_SLOTS_DEBUG the server puts prompt and output text in /slots: we drop it."""
    prompt = "Zebrafish quokka marmalade: list seven colours."
    env = {"LLAMA_SERVER_SLOTS_DEBUG": "1"}
    with LlamaServer(model_path, binary=llama_binary, env=env, log_dir=tmp_path) as server:
        result = generate(server.url, prompt, 24, temperature=0.0)
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            raw_slots = client.get(server.url + "/slots").text
        probe = LlamaCppProbe(server.url)
        try:
            reading = probe.poll(0.0)
        finally:
            probe.close()
    assert "quokka" in raw_slots  # the server really did expose the text
    assert reading.status == "ok" and reading.models[0].slots[0].task_id is not None
    text = repr(reading)
    assert "quokka" not in text and "Zebrafish" not in text
    assert result["tokens_predicted"] == 24
