"""MLX-LM's adapter without a server (issue #22): which model is served, the proxy's streamed answers
as live slots (core/proxied_streams.py) and the rate the rates stage makes of them, the inbox's
board of streams. Values by hand; the real server is tests/integration/test_mlx_real.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trayapp.core.model import ModelReading, ServerReading, SlotReading
from trayapp.core.proxied_streams import SLOT_ID_BASE, ProxiedStream, with_proxied_streams
from trayapp.core.rates import RateTracker
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.servers.openai_compat import MLX_REASON, MLX_WHICH_UNKNOWN, mlx_models

SERVED = "/models/Qwen3-8B-4bit"


def _listed(*names: str) -> list[ModelReading]:
    return [ModelReading(name) for name in names]


def test_a_fresh_machine_lists_nothing_and_the_process_names_the_model() -> None:
    (model,) = mlx_models([], SERVED)
    assert (model.name, model.loaded, model.model_path, model.live_rate_reason) == (
        SERVED, True, SERVED, MLX_REASON
    )  # fmt: skip


def test_of_the_cached_models_only_the_served_one_is_loaded() -> None:
    models = mlx_models(_listed("mlx-community/gemma-3-4b", SERVED), SERVED)
    assert [(m.name, m.loaded) for m in models] == [("mlx-community/gemma-3-4b", False), (SERVED, True)]
    assert all(m.live_rate_reason == MLX_REASON for m in models)
    # A served repo id the list lacks (no cache entry yet) comes first.
    models = mlx_models(_listed("mlx-community/gemma-3-4b"), "mlx-community/Qwen3-8B-4bit")
    assert [(m.name, m.loaded, m.model_path) for m in models] == [
        ("mlx-community/Qwen3-8B-4bit", True, None),
        ("mlx-community/gemma-3-4b", False, None),
    ]


def test_without_the_process_one_listed_model_is_the_served_one_and_of_several_none_is_known() -> None:
    (only,) = mlx_models(_listed("a"), None)
    assert only.loaded and only.live_rate_reason == MLX_REASON
    several = mlx_models(_listed("a", "b"), None)
    assert [m.loaded for m in several] == [True, True]
    assert all(m.live_rate_reason == MLX_REASON + MLX_WHICH_UNKNOWN for m in several)
    assert mlx_models([], None) == ()


def _mlx(*models: ModelReading, kind: str = "mlx", age_s: float | None = None) -> ServerReading:
    return ServerReading(kind, "http://127.0.0.1:8080", "ok", models=models, age_s=age_s)


def test_a_streamed_answer_is_a_slot_of_the_served_model_whatever_name_the_client_used() -> None:
    reading = _mlx(ModelReading(SERVED, live_rate_reason=MLX_REASON), ModelReading("cached", loaded=False))
    out = with_proxied_streams(reading, [ProxiedStream(3, "default_model", 120)])
    served, cached = out.models
    assert served.slots == (SlotReading(SLOT_ID_BASE + 3, True, task_id=SLOT_ID_BASE + 3, n_decoded=120),)
    assert served.live_rate_reason is None  # the proxy measures one now
    assert cached == reading.models[1]


def test_streams_go_to_the_model_they_name_and_are_dropped_when_it_cannot_be_told() -> None:
    reading = _mlx(ModelReading("a"), ModelReading("b"))
    out = with_proxied_streams(reading, [ProxiedStream(1, "b", 5), ProxiedStream(2, None, 9)])
    assert [len(m.slots) for m in out.models] == [0, 1]
    assert out.models[1].slots[0].n_decoded == 5


def test_servers_with_live_numbers_of_their_own_and_repeated_readings_are_left_alone() -> None:
    streams = [ProxiedStream(1, None, 5)]
    llama = _mlx(ModelReading("m"), kind="llamacpp")
    assert with_proxied_streams(llama, streams) is llama
    stale = _mlx(ModelReading("m"), age_s=2.0)
    assert with_proxied_streams(stale, streams) is stale
    generic = _mlx(ModelReading("m"), kind="openai")
    assert generic.models[0].slots == () and len(with_proxied_streams(generic, streams).models[0].slots) == 1


def test_the_rates_stage_makes_an_estimated_decode_rate_of_the_tokens_streamed() -> None:
    """Ticks at 10.0, 11.0 and 12.0 s seeing 100, 400 and 650 tokens forwarded: (650 - 100) / 2 s."""
    tracker = RateTracker()
    model = ModelReading(SERVED, live_rate_reason=MLX_REASON)
    estimates = []
    for t, n in ((10.0, 100), (11.0, 400), (12.0, 650)):
        reading = with_proxied_streams(_mlx(model), [ProxiedStream(1, None, n)])
        estimates.append(tracker.update(reading, t, 1_000.0 + t).models[SERVED])
    assert estimates[-1].phase == "decoding" and estimates[-1].decode_exact is False
    assert estimates[-1].decode_tok_s == pytest.approx(550 / 2.0)
    # The answer ended: its slot is gone, the model is idle, no record from polling (the proxy's is it).
    after = tracker.update(with_proxied_streams(_mlx(model), []), 13.0, 1_013.0)
    assert after.models[SERVED].phase == "idle" and after.requests == ()


def test_a_stream_before_its_first_token_is_reading_its_prompt() -> None:
    out = with_proxied_streams(_mlx(ModelReading(SERVED)), [ProxiedStream(1, None, 0)])
    estimate = RateTracker().update(out, 1.0, 1.0).models[SERVED]
    assert estimate.phase == "prefill" and estimate.decode_tok_s is None


@dataclass
class _Tap:
    request_model: str | None = "default_model"
    streaming: bool = False
    text_pieces: int = 0


def test_the_inbox_lists_a_request_once_its_answer_streams_until_it_ends() -> None:
    inbox = RecordInbox()
    tap = _Tap()
    inbox.stream_started(7, "http://localhost:8080", tap)
    assert inbox.streams("http://127.0.0.1:8080") == []  # no answer yet (or not a streamed one)
    tap.streaming, tap.text_pieces = True, 42
    (stream,) = inbox.streams("http://127.0.0.1:8080")
    assert (stream.model, stream.tokens_streamed) == ("default_model", 42)
    assert inbox.streams("http://127.0.0.1:9090") == []
    inbox.stream_started(8, "http://127.0.0.1:8080", _Tap(streaming=True))
    numbers = [s.number for s in inbox.streams("http://127.0.0.1:8080")]
    assert len(set(numbers)) == 2
    inbox.stream_ended(7)
    inbox.stream_ended(8)
    assert inbox.streams("http://127.0.0.1:8080") == []
