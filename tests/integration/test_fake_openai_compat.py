"""VllmProbe / SglangProbe / MlxProbe / OpenAiProbe over real HTTP on 127.0.0.1.

vLLM and SGLang cannot run here (no GPU); a fake serves fixtures/vllm and
fixtures/sglang `/metrics` (vLLM v0.11–0.12, SGLang collector.py shapes) with
counters that grow between polls, plus `/v1/models` as those servers shape it.
"""

from __future__ import annotations

import pytest

from tests.support.fake_servers import FakeHttpServer, fixture_text
from trayapp.sources.servers.openai_compat import (
    MLX_REASON,
    OPENAI_REASON,
    SGLANG_NO_METRICS_REASON,
    MlxProbe,
    OpenAiProbe,
    SglangProbe,
    VllmProbe,
)

VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen3-8B",
            "object": "model",
            "created": 1790771832,
            "owned_by": "vllm",
            "root": "Qwen/Qwen3-8B",
            "parent": None,
            "max_model_len": 32768,
        }
    ],
}


def test_vllm_counters_grow_between_polls() -> None:
    text = fixture_text("vllm/metrics.txt")
    with FakeHttpServer() as fake:
        fake.overrides["/metrics"] = (200, text)
        fake.overrides["/v1/models"] = (200, VLLM_MODELS)
        fake.overrides["/version"] = (200, {"version": "0.11.0"})
        probe = VllmProbe(fake.url, api_key="token")
        try:
            first = probe.poll(0.0)
            assert first.status == "ok"
            assert first.version == "0.11.0"
            [model] = first.models
            assert model.name == "Qwen/Qwen3-8B"
            assert model.context_length == 32768
            assert model.busy is True  # 3 running
            assert model.counters is not None and model.counters.tokens_predicted_total == 284117.0

            fake.overrides["/metrics"] = (200, text.replace("} 284117.0", "} 285117.0"))
            [model] = probe.poll(1.0).models
            assert model.counters is not None and model.counters.tokens_predicted_total == 285117.0
            assert fake.count("GET", "/v1/models") == 1  # once, not every poll
            assert fake.count("GET", "/metrics") == 2
        finally:
            probe.close()


def test_vllm_errors_are_statuses() -> None:
    with FakeHttpServer() as fake:
        probe = VllmProbe(fake.url)
        try:
            fake.overrides["/metrics"] = (401, {"error": "Unauthorized"})
            assert probe.poll(0.0).status == "unauthorized"
            fake.overrides["/metrics"] = (200, "# nothing useful\nfoo 1\n")
            wrong = probe.poll(1.0)
            assert wrong.status == "error" and "vllm:" in (wrong.reason or "")
        finally:
            probe.close()
        url = fake.url
    gone = VllmProbe(url)
    try:
        assert gone.poll(2.0).status == "unreachable"
    finally:
        gone.close()


def test_sglang_with_and_without_metrics() -> None:
    with FakeHttpServer() as fake:
        fake.overrides["/v1/models"] = (
            200,
            {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "max_model_len": 40960}]},
        )
        probe = SglangProbe(fake.url)
        try:
            # Started without --enable-metrics: /metrics is 404, the server is still up.
            plain = probe.poll(0.0)
            assert plain.status == "ok"
            [model] = plain.models
            assert model.live_rate_reason == SGLANG_NO_METRICS_REASON
            assert model.counters is None

            fake.overrides["/metrics"] = (200, fixture_text("sglang/metrics.txt"))
            [model] = probe.poll(1.0).models
            assert model.name == "Qwen/Qwen3-8B"
            assert model.context_length == 40960
            assert model.counters is not None
            assert model.counters.tokens_predicted_total == pytest.approx(7.557572e6)
            assert model.counters.kv_usage_ratio == pytest.approx(0.28)
            assert model.live_rate_reason is None
        finally:
            probe.close()


def test_mlx_and_generic_openai() -> None:
    with FakeHttpServer() as fake:
        fake.overrides["/health"] = (200, {"status": "ok"})
        fake.overrides["/v1/models"] = (
            200,
            {
                "object": "list",
                "data": [{"id": "mlx-community/Qwen3-8B-4bit", "object": "model", "created": 1}],
            },
        )
        mlx = MlxProbe(fake.url)
        generic = OpenAiProbe(fake.url)
        try:
            [model] = mlx.poll(0.0).models
            assert model.loaded is True
            assert model.live_rate_reason == MLX_REASON
            [model] = generic.poll(0.0).models
            assert model.name == "mlx-community/Qwen3-8B-4bit"
            assert model.live_rate_reason == OPENAI_REASON

            fake.overrides["/v1/models"] = (
                200,
                {"object": "list", "data": [{"id": "a", "object": "model"}, {"id": "b", "object": "model"}]},
            )
            several = MlxProbe(fake.url)
            try:
                models = several.poll(0.0).models
                # which one is loaded is unknown: neither is called unloaded, the reason says so
                assert [m.loaded for m in models] == [True, True]
                assert all("unknown" in (m.live_rate_reason or "") for m in models)
            finally:
                several.close()

            fake.overrides["/health"] = (503, {"status": "loading"})
            assert mlx.poll(1.0).status == "error"
        finally:
            mlx.close()
            generic.close()
