"""`llm-tray bench` beside its published peers (#23): the bench's share of the bandwidth ceiling
against the band of the nearest peers, as the text line and the JSON object print them."""

from __future__ import annotations

from trayapp.cli.bench import peer_comparison
from trayapp.core.bench import BenchResult, BenchRun, BenchSettings, BenchTarget, summarize
from trayapp.core.machine import Machine
from trayapp.core.model import ModelFacts
from trayapp.core.thresholds import Thresholds

# A CPU-only machine reading 1e9 bytes per token from 50 GB/s of measured RAM bandwidth: ceiling 50 tok/s.
CPU = Machine("CPU (system RAM)", 50.0, 64 * 10**9, 50.0, has_gpu=False)
FACTS = ModelFacts(
    weights_bytes=10**9, bytes_per_token=10**9, exact=True, source="gguf", quantization="Q4_K_M"
)


def _run(rate: float, warmup: bool = False) -> BenchRun:
    return BenchRun(
        kind="decode",
        warmup=warmup,
        depth_tokens=0,
        prompt_tokens=40,
        cached_tokens=0,
        decode_tokens=20,
        streamed_tokens=20,
        server_decode_tok_s=rate,
        stream_decode_tok_s=None,
        ttft_s=None,
        prompt_tok_s=None,
        prompt_rate_upper_bound=False,
        wall_s=1.0,
    )


def _bench(rate: float, gpus: list[dict[str, object]] | None = None) -> BenchResult:
    target = BenchTarget(
        server_url="http://127.0.0.1:8080",
        server_kind="llamacpp",
        server_version="b1234",
        model="m.gguf",
        quantization="Q4_K_M",
        facts=FACTS,
        context_length=8192,
        gpu_fraction=None,
        gpu_fraction_source=None,
        vram_bytes=None,
        hardware=CPU.label,
        hardware_detail={"gpus": gpus or [], "ram_bandwidth_gbps": 50.0, "ram_bandwidth_source": "measured"},
    )
    settings = BenchSettings(tokens=20, runs=3, warmup=1, depths=(0,), prompt_depth_tokens=512)
    runs = [_run(rate, warmup=True), _run(rate), _run(rate), _run(rate)]
    return summarize(target, settings, runs, CPU, Thresholds(), started_wall_s=1000.0, finished_wall_s=1010.0)


def test_a_cpu_at_80_percent_of_its_measured_bandwidth_is_normal_beside_cpu_peers() -> None:
    line, doc = peer_comparison(_bench(40.0))  # 40 of 50 tok/s
    assert line.startswith("80 % of bandwidth; peers on CPUs (against measured bandwidth), Q4: ")
    assert line.endswith("— normal")
    assert doc["share"] == 0.8 and doc["verdict"] == "normal"
    band = doc["band"]
    assert isinstance(band, dict) and band["n"] >= 3


def test_far_below_its_peers_says_what_usually_explains_it() -> None:
    line, doc = peer_comparison(_bench(10.0))  # 20 %
    assert doc["verdict"] == "far below its peers"
    assert "usually: " in line and "threads" in line


def test_a_gpu_is_compared_with_its_own_part_first() -> None:
    line, doc = peer_comparison(_bench(30.0, gpus=[{"name": "NVIDIA GeForce RTX 4090"}]))
    band = doc["band"]
    assert isinstance(band, dict) and band["basis"] == "RTX 4090, Q4"
    assert "peers on RTX 4090, Q4" in line
