"""Prefill progress on a real llama-server, as `llm-tray watch --json` shows it (issue #11).

A prompt of about 2,000 tokens (counted by the server's own `/tokenize`) on `-b 64 -ub 64 -t 1`
moves in 64-token steps, so a watch line a second sees it grow before the first token is decoded.
llama-server's `/slots` says how many prompt tokens are evaluated and cached, never the prompt's
whole length (its `n_prompt_tokens` is the KV fill, one batch ahead), so the total and the ETA must
stay null: never a guess.

`watch` is a real subprocess writing to files (no pipe to keep drained); every wait is on a
condition, bounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import WatchToFile
from tests.support.llama import LlamaServer, decode_rate, generate, generate_in_background, tokens_lasting

pytestmark = pytest.mark.llamacpp

BATCH_TOKENS = 64
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "  # 14 tokens
# The prompt is sized from the server's own prompt rate here, to ~PREFILL_S of prefill: 140 sentences
# (~1,960 tokens) took 10-30 s on a busy 2-core host and a few seconds on a fast one, where the
# first prefill poll (every 5 s while idle) can come too late to see three steps.
PREFILL_S = 12.0
SENTENCES_RANGE = (140, 500)  # ~1,960 to ~7,000 tokens, inside the 8,192-token context
PREFILL_LIMIT_S = 150.0  # generous: measured ~83 prompt tok/s on a busy 2-core host (25 s)
DECODE_S = 5.0  # enough decoding at the server's own rate for a watch line to see phase "decoding"
RAM_GBPS = "54"  # given, so that no RAM benchmark competes with the server for the 2 cores
# The live rate is (tokens now − tokens at the first prefill poll) ÷ the seconds between those
# polls, while the server's prompt_per_second is the whole prompt over its own compute time. They
# differ by a batch or two of quantisation at either end (64 tokens of ~2,000), by poll latency on
# the timestamps (an answer waits for the running batch), and by the first seconds the monitor
# did not see (it polls every 5 s while idle). The band is wide for those, and narrow enough to
# catch a rate off by the cache, by the decode rate or by a unit (×2 or ÷2 is a bug).
RATE_BAND = (0.6, 1.6)


def _model(line: dict[str, Any]) -> dict[str, Any] | None:
    servers = line["servers"]
    if not servers or not servers[0]["models"]:
        return None
    model: dict[str, Any] = servers[0]["models"][0]
    return model


def _phase(line: dict[str, Any]) -> str | None:
    model = _model(line)
    return model["phase"] if model else None


def test_watch_shows_prefill_progress_before_the_first_token(
    llama_binary: Path, model_path: Path, tmp_path: Path
) -> None:
    """About 30-45 s on a 2-core host: server start ~5 s, prefill ~10-30 s, decode ~5 s."""
    server = LlamaServer(
        model_path, binary=llama_binary, ctx_size=8192, threads=1, log_dir=tmp_path,
        extra_args=["-b", str(BATCH_TOKENS), "-ub", str(BATCH_TOKENS)],
    )  # fmt: skip
    with server, httpx.Client(trust_env=False, timeout=30.0) as client:
        probe = generate(server.url, SENTENCE * 30, 1, cache_prompt=False, timeout_s=PREFILL_LIMIT_S)
        sentences = round(probe["timings"]["prompt_per_second"] * PREFILL_S / 14)
        prompt = SENTENCE * max(SENTENCES_RANGE[0], min(SENTENCES_RANGE[1], sentences))
        tokens = client.post(server.url + "/tokenize", json={"content": prompt, "add_special": True})
        prompt_tokens = len(tokens.json()["tokens"])
        assert 14 * SENTENCES_RANGE[0] <= prompt_tokens <= 14 * SENTENCES_RANGE[1] + 1, prompt_tokens
        room = server.ctx_size - prompt_tokens - 64  # the answer stays inside the context
        n_predict = tokens_lasting(decode_rate(server.url), DECODE_S, high=room)
        watch = WatchToFile(
            tmp_path, "--endpoint", server.url, "--no-discover", "--ram-bandwidth-gbps", RAM_GBPS,
            "--interval", "1", "--duration", "300",
        )  # fmt: skip
        try:
            watch.wait_line(lambda line: _phase(line) == "idle", 60.0, "watch's first idle line")
            started = len(watch.lines())
            request = generate_in_background(
                server.url,
                prompt,
                n_predict,
                ignore_eos=True,
                cache_prompt=False,
                timeout_s=PREFILL_LIMIT_S + 60,
            )
            watch.wait_line(lambda line: _phase(line) == "decoding", PREFILL_LIMIT_S, "phase 'decoding'")
            timings = request.result(timeout=PREFILL_LIMIT_S)["timings"]
        finally:
            code = watch.stop()
        assert code == 0, watch.err_path.read_text()[-2000:]
        log_tail = server.log_tail()

    assert timings["prompt_n"] == prompt_tokens, (timings, log_tail)  # nothing cached, nothing lost
    lines = watch.lines()[started:]
    first_decoding = next(i for i, line in enumerate(lines) if _phase(line) == "decoding")
    before = [_model(line) for line in lines[:first_decoding]]
    prefill = [m for m in before if m is not None and m["phase"] == "prefill"]
    assert all(m is not None and m["phase"] in ("idle", "prefill") for m in before), before
    done = [m["prefill_tokens_done"] for m in prefill]
    print(f"{prompt_tokens} prompt tokens; watch saw prefill_tokens_done {done}")

    # Rising in batch steps, never past the prompt's length.
    assert len(set(done)) >= 3, done
    assert done == sorted(done), done
    assert all(0 <= n <= prompt_tokens for n in done), (done, prompt_tokens)
    assert all(m["prefill_cached_tokens"] == 0 for m in prefill)  # a fresh server, cache_prompt off
    # llama-server gives no total: neither a total nor an ETA is invented.
    assert all(m["prefill_tokens_total"] is None for m in prefill), prefill
    assert all(m["prefill_eta_s"] is None for m in prefill), prefill

    # The live prefill rate against the server's own for the same request.
    rates = [m["prefill_tok_s"] for m in prefill if m["prefill_tok_s"] is not None]
    assert rates, prefill
    server_rate = timings["prompt_per_second"]
    low, high = RATE_BAND[0] * server_rate, RATE_BAND[1] * server_rate
    print(f"live prefill tok/s {rates}; the server's prompt_per_second {server_rate:.1f}")
    assert low <= rates[-1] <= high, (rates, server_rate)

    # Once decoding, the prefill fields are gone.
    decoding = _model(lines[first_decoding])
    assert decoding is not None
    assert decoding["prefill_tokens_done"] is None and decoding["prefill_tok_s"] is None
