"""Fixes you can copy (#20): each server's spelling of a fix (core/fixes.py) and the commands every
existing alert with a fix carries, with the same numbers as its text.

Expected commands are written by hand from the servers' own documentation:
* llama-server (`llama-server --help`, tools/server/README.md): `-m`, `-c/--ctx-size` (shared by the
  `-np/--parallel` slots), `-ngl/--n-gpu-layers`, `--n-cpu-moe N` (the experts of the first N layers on
  the CPU), `-fa/--flash-attn on|off|auto`, `-ctk/--cache-type-k`, `-ctv/--cache-type-v` (a quantized
  V cache needs flash attention), `--spec-type none`; a router's `--models-preset` INI takes the long
  flags without dashes as keys (`ctx-size = 8192`) in the model's section;
* Ollama (docs/faq): `OLLAMA_FLASH_ATTENTION=1`, `OLLAMA_KV_CACHE_TYPE=f16|q8_0|q4_0`,
  `OLLAMA_CONTEXT_LENGTH`, `ollama stop MODEL` (unloads it);
* LM Studio (`lms load --help`): `--gpu off|max|0..1`, `-c/--context-length N`, `lms unload MODEL`;
  it has no flag for the KV-cache type (a load setting in the app).
"""

from __future__ import annotations

import re
from dataclasses import replace

from tests.support.diagnose_inputs import LLAMA_8B, QWEN_32B_Q4, VRAM_TOTAL
from trayapp.core.diagnose import ModelView, TrendPoint, diagnose_model
from trayapp.core.fixes import (
    context_size_commands,
    cpu_moe_commands,
    gpu_fit_commands,
    joined,
    kv_cache_commands,
    no_speculation_commands,
    report_command,
    unload_commands,
)
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.machine import Machine
from trayapp.core.model import Baseline, Finding, KvLayout, ModelFacts, ModelStatus, ServerStatus
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_tokens
from trayapp.core.vram_pressure import diagnose_hardware

RTX_4090 = Machine("NVIDIA GeForce RTX 4090", 1008.0, VRAM_TOTAL, 60.0, has_gpu=True)
URLS = {
    "llamacpp": "http://127.0.0.1:8080",
    "ollama": "http://127.0.0.1:11434",
    "lmstudio": "http://127.0.0.1:1234",
}


# --------------------------------------------------------------------------- the builders


def test_gpu_fit_is_the_context_with_every_layer_on_the_gpu() -> None:
    assert gpu_fit_commands("llamacpp", "m", 8192) == ("llama-server -c 8192 -ngl 999",)
    assert gpu_fit_commands("llamacpp", "m", 8192, parallel_slots=4, model_path="/models/q.gguf") == (
        "llama-server -m /models/q.gguf -c 32768 -np 4 -ngl 999",  # -c is shared by the 4 slots
    )
    assert gpu_fit_commands("llamacpp", "qwen3-8b", 8192, router=True) == (
        "ctx-size = 8192",
        "n-gpu-layers = 999",
        "llama-server --models-preset <file> (section [qwen3-8b])",
    )
    assert gpu_fit_commands("lmstudio", "qwen3-8b", 8192) == (
        "lms unload qwen3-8b && lms load qwen3-8b --gpu max --context-length 8192",
    )
    # Ollama and vLLM place the layers themselves: the context is the whole fix.
    assert gpu_fit_commands("ollama", "qwen3:8b", 8192) == context_size_commands("ollama", "qwen3:8b", 8192)
    assert gpu_fit_commands("vllm", "Qwen/Qwen3-8B", 8192) == (
        "vllm serve Qwen/Qwen3-8B --max-model-len 8192",
    )
    assert gpu_fit_commands("mlx", "m", 8192) == ()


def test_kv_cache_is_quantized_with_flash_attention() -> None:
    assert kv_cache_commands("llamacpp", "m") == ("llama-server -fa on -ctk q8_0 -ctv q8_0",)
    assert kv_cache_commands("llamacpp", "m", model_path="/models/q.gguf") == (
        "llama-server -m /models/q.gguf -fa on -ctk q8_0 -ctv q8_0",
    )
    assert kv_cache_commands("llamacpp", "qwen3-8b", router=True) == (
        "flash-attn = on",
        "cache-type-k = q8_0",
        "cache-type-v = q8_0",
        "llama-server --models-preset <file> (section [qwen3-8b])",
    )
    assert kv_cache_commands("ollama", "qwen3:8b") == (
        "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",
    )
    assert kv_cache_commands("ollama", "qwen3:8b", "q4_0") == (
        "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q4_0 ollama serve",
    )
    assert kv_cache_commands("ollama", "qwen3:8b", "q5_1") == ()  # Ollama takes f16, q8_0, q4_0 only
    assert kv_cache_commands("lmstudio", "qwen3-8b") == ()  # `lms load` has no flag for it


def test_moe_experts_unload_speculation_and_report() -> None:
    assert cpu_moe_commands("llamacpp", "m", 12) == ("llama-server -ngl 999 --n-cpu-moe 12",)
    assert cpu_moe_commands("llamacpp", "qwen3-30b", 12, router=True) == (
        "n-gpu-layers = 999",
        "n-cpu-moe = 12",
        "llama-server --models-preset <file> (section [qwen3-30b])",
    )
    assert cpu_moe_commands("ollama", "qwen3:30b", 12) == ()
    assert unload_commands("ollama", "llama3.1:8b") == ("ollama stop llama3.1:8b",)
    assert unload_commands("lmstudio", "qwen3-8b") == ("lms unload qwen3-8b",)
    assert unload_commands("llamacpp", "m") == ()  # its one model goes only with the server
    assert no_speculation_commands("llamacpp", "m") == ("llama-server --spec-type none",)
    assert no_speculation_commands("llamacpp", "m", router=True) == (
        "spec-type = none",
        "llama-server --models-preset <file> (section [m])",
    )
    assert no_speculation_commands("lmstudio", "m") == ()
    assert report_command("20250601-101500-abc123") == (
        "llm-tray report --session 20250601-101500-abc123 -o llm-tray-report-20250601-101500-abc123.html"
    )
    assert report_command(None) == "llm-tray report -o llm-tray-report.html"
    assert joined(("a", "b"), (), ("b", "c")) == ("a", "b", "c")


# --------------------------------------------------------------------------- the alerts


def view(kind: str, model: ModelStatus, machine: Machine = RTX_4090, **kw: object) -> ModelView:
    server = ServerStatus(
        kind=kind, url=URLS.get(kind, "http://127.0.0.1:8000"), status="ok", models=(model,)
    )
    return ModelView(server=server, model=model, machine=machine, **kw)  # type: ignore[arg-type]


def finding(v: ModelView, kind: str) -> Finding:
    (found,) = [f for f in diagnose_model(v, Thresholds()) if f.kind == kind]
    return found


def qwen_spilled(slots: int | None = None) -> ModelStatus:
    """qwen2.5:32b Q4_K_M at 32k, 77 % on the GPU (tests/unit/test_diagnose_scenarios.py's raised context)."""
    return ModelStatus(
        name="qwen2.5:32b",
        phase="idle",
        gpu_fraction=0.77,
        gpu_fraction_source="server",
        context_length=32768,
        facts=QWEN_32B_Q4,
        parallel_slots=slots,
    )


def test_offload_on_ollama_gives_the_context_and_the_kv_cache_with_the_texts_numbers() -> None:
    # The largest context beside 20_024_550_000 B of weights in 24 GiB: 25_769_803_776 − 20_024_550_000
    # − (536_870_912 + 400_491_000 overhead) = 4_807_891_864 B ÷ 262_144 B/token = 18_340 tokens, in whole
    # 1k steps 17 × 1024 = 17_408 ("17k"). q8_0 at 32k: 32768 × 131_072 × 34/32 = 4_563_402_752 B of KV;
    # 20_024_550_000 + 4_563_402_752 + 937_361_912 = 25_525_314_664 ≤ 25_769_803_776: fits.
    offload = finding(view("ollama", qwen_spilled()), "offload")
    assert offload.fix.startswith(
        "Lower the context to 17k tokens; or a q8_0 KV cache (with flash attention)"
    )
    assert offload.fix_commands == (
        "OLLAMA_CONTEXT_LENGTH=17408 ollama serve",
        "printf 'FROM qwen2.5:32b\\nPARAMETER num_ctx 17408\\n' > Modelfile && "
        "ollama create qwen2.5:32b-ctx17k -f Modelfile",
        '"options": {"num_ctx": 17408}',
        "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",
    )


def test_offload_on_llama_server_sets_the_kv_caches_size() -> None:
    # llama-server's default (auto) slots share one KV cache of -c tokens, and each slot's n_ctx is all
    # of it (b11434: `-c 2048` → 4 slots of n_ctx 2048, kv_unified): the cache holds 32_768 tokens, as
    # above, whatever the 4 slots; -c 17408 fits in either layout (with -np N alone, N slots share it).
    offload = finding(view("llamacpp", qwen_spilled(slots=4)), "offload")
    assert offload.fix.startswith("Lower the context to 17k tokens;")
    assert offload.fix_commands == (
        "llama-server -c 17408 -ngl 999",
        "llama-server -fa on -ctk q8_0 -ctv q8_0",
    )
    lms = finding(view("lmstudio", qwen_spilled()), "offload")
    assert lms.fix.startswith("Lower the context to 17k tokens;") and "a q8_0 KV cache" in lms.fix
    assert lms.fix_commands == (  # no KV-cache flag in `lms load`: that option has no command
        "lms unload qwen2.5:32b && lms load qwen2.5:32b --gpu max --context-length 17408",
    )


def test_offload_of_an_moe_model_keeps_the_first_layers_experts_in_ram() -> None:
    # 30e9 parameters, 3.75e9 active, 8 of 128 experts: expert parameters (30e9 − 3.75e9) ÷ (1 − 8/128)
    # = 26.25e9 ÷ 0.9375 = 28e9, 28/30 of 24e9 B = 22.4e9 B over 48 layers = 466_666_667 B a layer.
    # KV: 48 layers × 4 KV heads × (128 + 128) = 49_152 elements × 2 B × 8192 tokens = 805_306_368 B.
    # In 16 GiB (17_179_869_184 B): w + 805_306_368 + 536_870_912 + 0.02 w ≤ 17_179_869_184 → w ≤
    # 15_527_148_925; 24e9 − n × 466_666_667 ≤ that → n ≥ 18.2 → 19 layers, 8_866_666_667 B ("8.9 GB").
    moe = ModelFacts(
        weights_bytes=24_000_000_000,
        bytes_per_token=3_000_000_000,
        exact=True,
        source="gguf",
        quantization="Q4_K_M",
        parameter_count=30_000_000_000,
        active_parameter_count=3_750_000_000,
        expert_count=128,
        expert_used_count=8,
        kv=KvLayout(full_elems_per_token=49_152, n_layers=48),
    )
    status = ModelStatus(
        name="qwen3-30b-a3b", phase="idle", gpu_fraction=0.7, context_length=8192, facts=moe, parallel_slots=1
    )
    rtx_4080 = replace(RTX_4090, label="RTX 4080", fast_capacity_bytes=16 * 1024**3)
    offload = finding(view("llamacpp", status, rtx_4080), "offload")
    assert offload.fix.startswith(
        "Keep the experts of the first 19 layers (8.9 GB) in system RAM and the rest"
    )
    assert offload.fix_commands[0] == "llama-server -ngl 999 --n-cpu-moe 19"
    on_ollama = finding(view("ollama", status, rtx_4080), "offload")  # Ollama has no such option
    assert "experts" not in on_ollama.fix and not any("n-cpu-moe" in c for c in on_ollama.fix_commands)


def test_offload_names_the_sibling_to_unload() -> None:
    sibling = ModelStatus(name="llama3.1:8b", phase="idle", vram_bytes=6_300_000_000)
    spilled = qwen_spilled()
    server = ServerStatus(kind="ollama", url=URLS["ollama"], status="ok", models=(sibling, spilled))
    offload = finding(ModelView(server, spilled, RTX_4090), "offload")
    assert offload.fix.startswith("Unload llama3.1:8b, which holds 6.3 GB of VRAM")
    assert offload.fix_commands[0] == "ollama stop llama3.1:8b"


def deep_trend() -> tuple[TrendPoint, ...]:
    return (TrendPoint(600, 140.0, True), TrendPoint(16_000, 96.0, True), TrendPoint(16_300, 95.0, True))


def test_kv_slowdown_offers_the_servers_own_kv_cache_setting() -> None:
    llama = ModelStatus(name="llama3.1:8b", phase="decoding", context_tokens=16_300, facts=LLAMA_8B)
    on_llama = finding(view("llamacpp", llama, trend=deep_trend()), "kv_slowdown")
    assert "a q8_0 KV cache, which about halves" in on_llama.fix
    assert on_llama.fix_commands == ("llama-server -fa on -ctk q8_0 -ctv q8_0",)
    on_ollama = finding(view("ollama", llama, trend=deep_trend()), "kv_slowdown")
    assert on_ollama.fix_commands == ("OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",)
    on_lms = finding(view("lmstudio", llama, trend=deep_trend()), "kv_slowdown")
    assert on_lms.fix_commands == () and "LM Studio: the model's load settings" in on_lms.fix
    quantized = replace(RTX_4090, kv_type="q8_0")  # already quantized: only a fresh conversation helps
    again = finding(view("llamacpp", llama, quantized, trend=deep_trend()), "kv_slowdown")
    assert again.fix == "Start a fresh conversation or trim the context." and again.fix_commands == ()


def test_context_full_raises_the_context_to_what_fits() -> None:
    llama = ModelStatus(
        name="llama3.1:8b",
        phase="decoding",
        context_length=8192,
        context_tokens=8000,
        gpu_fraction=1.0,
        facts=LLAMA_8B,
        parallel_slots=1,
    )
    # Twice 8192 = 16_384 ("16k"): 4_920_753_328 + 16_384 × 131_072 + 635_285_978 = 7.7 GB ≤ 24 GiB.
    full = finding(view("llamacpp", llama), "context_full")
    assert full.fix == "Start a new conversation, or raise the context to 16k tokens (it fits in GPU memory)."
    assert full.fix_commands == ("llama-server -c 16384",)
    on_lms = finding(view("lmstudio", llama), "context_full")
    assert on_lms.fix_commands == ("lms unload llama3.1:8b && lms load llama3.1:8b --context-length 16384",)
    # 6.5 GB of GPU memory: 6_500_000_000 − 4_920_753_328 − 635_285_978 = 943_960_694 B ÷ 131_072 = 7_201
    # tokens, fewer than the 8192 it has: no bigger context to offer.
    small = replace(RTX_4090, fast_capacity_bytes=6_500_000_000)
    tight = finding(view("llamacpp", llama, small), "context_full")
    assert tight.fix == (
        "Start a new conversation: a larger context does not fit in GPU memory beside the model."
    )
    assert tight.fix_commands == ()
    # 10 GB: 10e9 − 5_556_039_306 = 4_443_960_694 B ÷ 131_072 = 33_904 tokens; 2 slots → 16_952 a slot
    # → 16 × 1024 = 16_384 each ("16k"), -c 32768.
    roomy = replace(RTX_4090, fast_capacity_bytes=10_000_000_000)
    two = finding(view("llamacpp", replace(llama, parallel_slots=2), roomy), "context_full")
    assert "raise the context to 16k tokens" in two.fix and two.fix_commands == (
        "llama-server -c 32768 -np 2",
    )
    trained = replace(llama, facts=replace(LLAMA_8B, context_train=8192))
    capped = finding(view("ollama", trained), "context_full")
    assert (
        capped.fix == "Start a new conversation: the model was trained on 8k tokens."
        and not capped.fix_commands
    )


def test_speculation_regression_and_efficiency_fixes_carry_their_command() -> None:
    spec = ModelStatus(
        name="qwen3-8b", phase="decoding", decode_tok_s=40.0, draft_acceptance=0.2, spec_type="ngram-simple"
    )
    drafts = finding(view("llamacpp", spec), "draft_acceptance")
    assert "(--spec-type none)" in drafts.fix and drafts.fix_commands == ("llama-server --spec-type none",)
    assert finding(view("lmstudio", spec), "draft_acceptance").fix_commands == ()
    slow = replace(spec, decode_tok_s=2.0, draft_acceptance=None, spec_type="draft-simple")
    floor = finding(view("llamacpp", slow), "below_floor")
    assert "(--spec-type none)" in floor.fix and floor.fix_commands == ("llama-server --spec-type none",)
    plain = finding(view("llamacpp", replace(slow, spec_type=None)), "below_floor")
    assert "--spec-type" not in plain.fix and plain.fix_commands == ()

    baseline = Baseline(decode_tok_s=150.0, context_tokens=600, server_version="b5000", session_id="s0")
    now = replace(spec, decode_tok_s=90.0, draft_acceptance=None, spec_type=None, session_id="20250601-1")
    trend = (TrendPoint(600, 90.0, True, request=True, decode_s=8.0),)  # one finished request
    v = view("llamacpp", now, baseline=baseline, trend=trend)
    v = replace(v, server=replace(v.server, version="b6500"))
    regression = finding(v, "regression")
    assert "`llm-tray report`" in regression.fix
    assert regression.fix_commands == (
        "llm-tray report --session 20250601-1 -o llm-tray-report-20250601-1.html",
    )

    slow_gpu = ModelStatus(
        name="m", phase="decoding", decode_tok_s=20.0, ceiling_tok_s=200.0, gpu_fraction=1.0
    )
    low = finding(view("llamacpp", slow_gpu), "low_efficiency")
    assert low.fix_commands == ("nvidia-smi -q -d PERFORMANCE",) and low.fix_commands[0] in low.fix


def test_vram_pressure_unloads_the_idle_models_it_names() -> None:
    gpu = GpuReading(0, "RTX 4090", "nvidia", VRAM_TOTAL, VRAM_TOTAL - 500_000_000, 1008.0)
    hw = HardwareSnapshot((gpu,), HostReading(64_000_000_000, 32_000_000_000, 60.0))
    (alone,) = diagnose_hardware(hw, Thresholds())
    assert (
        alone.fix.startswith("Unload idle models (ollama stop, LM Studio eject)") and not alone.fix_commands
    )
    ollama = ServerStatus(
        kind="ollama",
        url=URLS["ollama"],
        status="ok",
        models=(
            ModelStatus(name="llama3.1:8b", phase="idle", vram_bytes=6_000_000_000),
            ModelStatus(name="qwen3:30b", phase="decoding", vram_bytes=18_000_000_000),  # busy: kept
            ModelStatus(name="qwen3:14b", phase="idle", vram_bytes=9_000_000_000),
        ),
    )
    lms = ServerStatus(
        kind="lmstudio",
        url=URLS["lmstudio"],
        status="ok",
        models=(ModelStatus(name="gemma-3", phase="idle"),),
    )
    llama = ServerStatus(
        kind="llamacpp", url=URLS["llamacpp"], status="ok", models=(ModelStatus("m", "idle"),)
    )
    (pressure,) = diagnose_hardware(hw, Thresholds(), (ollama, lms, llama))
    assert pressure.fix == "Unload idle models (qwen3:14b, llama3.1:8b, gemma-3) or close other GPU programs."
    assert pressure.fix_commands == ("ollama stop qwen3:14b", "ollama stop llama3.1:8b", "lms unload gemma-3")


def test_every_context_in_the_commands_is_a_context_the_text_names() -> None:
    """One fact in one place: a context a command sets, per request, is one the text says."""
    cases = [
        finding(view("ollama", qwen_spilled()), "offload"),
        finding(view("lmstudio", qwen_spilled()), "offload"),
        finding(view("llamacpp", qwen_spilled(slots=4)), "offload"),
        finding(
            view(
                "llamacpp",
                ModelStatus("m", "decoding", context_length=8192, context_tokens=8000, facts=LLAMA_8B),
            ),
            "context_full",
        ),
    ]
    for found in cases:
        assert found.fix_commands
        for command in found.fix_commands:
            slots = re.search(r"-np (\d+)", command)
            per_slot = int(slots.group(1)) if slots else 1
            for setting in re.findall(r"(?:-c |CONTEXT_LENGTH=|num_ctx\"?:? |context-length )(\d+)", command):
                assert format_tokens(int(setting) // per_slot) in found.fix, (command, found.fix)
