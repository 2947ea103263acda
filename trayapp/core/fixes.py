"""Fixes as exact text to copy, written for the server kind that runs the model (#20).

Each function returns the lines a user pastes: a server flag, an environment variable, a command.
llm-tray never applies them; it hands them over (the alert's `fix_commands`, the dashboard's Copy
button, `status --json`'s `fix.commands`, the notification's action, the bar's tooltip).
"""

from __future__ import annotations

from trayapp.core.quants import OLLAMA_KV_TYPES

CONTEXT_STEP_TOKENS = 1024  # contexts are offered in whole KiB-tokens (servers allocate in such steps)


def round_up_context(tokens: int, step: int = CONTEXT_STEP_TOKENS) -> int:
    """`tokens` rounded up to a whole `step` (at least one step)."""
    return max(step, -(-max(tokens, 1) // step) * step)


def context_size_commands(
    server_kind: str,
    model: str,
    context_tokens: int,
    *,
    parallel_slots: int = 1,
    model_path: str | None = None,
    router: bool = False,
) -> tuple[str, ...]:
    """How to give `model` a context of `context_tokens` per request on this kind of server.

    llama-server splits `-c` over its slots (`-np`), so a per-request context of N with S slots needs
    `-c N×S`. Ollama's OpenAI-compatible endpoints ignore a request's `num_ctx`: the server-wide
    variable or a model made with the parameter are the fixes that reach every client.
    """
    n = context_tokens
    if server_kind == "llamacpp":
        total = n * max(parallel_slots, 1)
        slots = f" -np {parallel_slots}" if parallel_slots > 1 else ""
        if router:
            return (f"ctx-size = {total}", f"llama-server --models-preset <file> (section [{model}])")
        where = f"-m {model_path} " if model_path else ""
        return (f"llama-server {where}-c {total}{slots}",)
    if server_kind == "ollama":
        return (
            f"OLLAMA_CONTEXT_LENGTH={n} ollama serve",
            f"printf 'FROM {model}\\nPARAMETER num_ctx {n}\\n' > Modelfile && "
            f"ollama create {_ollama_tag(model, n)} -f Modelfile",
            f'"options": {{"num_ctx": {n}}}',
        )
    if server_kind == "lmstudio":
        return (f"lms unload {model} && lms load {model} --context-length {n}",)
    if server_kind == "vllm":
        return (f"vllm serve {model} --max-model-len {n}",)
    if server_kind == "sglang":
        return (f"python -m sglang.launch_server --model-path {model} --context-length {n}",)
    return ()


def _ollama_tag(model: str, context_tokens: int) -> str:
    """A new model name for `model` with a bigger context: `qwen3:8b` → `qwen3:8b-ctx24k`."""
    suffix = f"ctx{context_tokens // 1024}k" if context_tokens % 1024 == 0 else f"ctx{context_tokens}"
    return f"{model}-{suffix}" if ":" in model else f"{model}:{suffix}"


# --------------------------------------------------------------------------- more fixes, per server kind

ALL_LAYERS = 999  # `-ngl 999`: every layer on the GPU (any build; newer ones also take `all`)
KV_FIX_TYPE = "q8_0"  # the KV-cache type a fix offers: about half of f16's bytes, a small loss
NVIDIA_SMI_PERFORMANCE = "nvidia-smi -q -d PERFORMANCE"  # the clocks and why they are held down


def _llama_server(flags: str, model_path: str | None) -> str:
    where = f"-m {model_path} " if model_path else ""
    return f"llama-server {where}{flags}"


def _router_preset(model: str, settings: tuple[str, ...]) -> tuple[str, ...]:
    """A router's settings for one model: lines of its `--models-preset` file (keys are the long
    flags without dashes), in the model's section."""
    return (*settings, f"llama-server --models-preset <file> (section [{model}])")


def gpu_fit_commands(
    server_kind: str,
    model: str,
    context_tokens: int,
    *,
    parallel_slots: int = 1,
    model_path: str | None = None,
    router: bool = False,
) -> tuple[str, ...]:
    """How to run `model` at a context of `context_tokens` per request with every layer on the GPU.

    llama-server: `-c` (over its slots, as `context_size_commands`) with `-ngl 999`; LM Studio:
    `lms load --gpu max --context-length`; the others place layers themselves, so their context
    setting is the whole fix.
    """
    if server_kind == "llamacpp":
        total = context_tokens * max(parallel_slots, 1)
        if router:
            return _router_preset(model, (f"ctx-size = {total}", f"n-gpu-layers = {ALL_LAYERS}"))
        slots = f" -np {parallel_slots}" if parallel_slots > 1 else ""
        return (_llama_server(f"-c {total}{slots} -ngl {ALL_LAYERS}", model_path),)
    if server_kind == "lmstudio":
        return (f"lms unload {model} && lms load {model} --gpu max --context-length {context_tokens}",)
    return context_size_commands(
        server_kind,
        model,
        context_tokens,
        parallel_slots=parallel_slots,
        model_path=model_path,
        router=router,
    )


def kv_cache_commands(
    server_kind: str,
    model: str,
    kv_type: str = KV_FIX_TYPE,
    *,
    model_path: str | None = None,
    router: bool = False,
) -> tuple[str, ...]:
    """A quantized KV cache (`kv_type` for keys and values) with flash attention, which a quantized
    V cache needs: llama-server `-fa on -ctk -ctv`; Ollama's server-wide `OLLAMA_FLASH_ATTENTION=1`
    and `OLLAMA_KV_CACHE_TYPE` (f16, q8_0 or q4_0). LM Studio sets it in the model's load settings
    (`lms load` has no flag for it): no command."""
    if server_kind == "llamacpp":
        if router:
            return _router_preset(
                model, ("flash-attn = on", f"cache-type-k = {kv_type}", f"cache-type-v = {kv_type}")
            )
        return (_llama_server(f"-fa on -ctk {kv_type} -ctv {kv_type}", model_path),)
    if server_kind == "ollama" and kv_type in OLLAMA_KV_TYPES:
        return (f"OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE={kv_type} ollama serve",)
    return ()


def kv_cache_where(server_kind: str, kv_type: str = KV_FIX_TYPE) -> str:
    """Where a quantized KV cache is set on a server `kv_cache_commands` has no command for."""
    if server_kind == "lmstudio":
        return f"LM Studio: the model's load settings, Flash Attention and a {kv_type} K and V cache"
    return f"llama-server -fa on -ctk {kv_type} -ctv {kv_type}; Ollama OLLAMA_KV_CACHE_TYPE={kv_type}"


def cpu_moe_commands(
    server_kind: str,
    model: str,
    cpu_moe_layers: int,
    *,
    model_path: str | None = None,
    router: bool = False,
) -> tuple[str, ...]:
    """An MoE model's expert weights of the first `cpu_moe_layers` layers in system RAM, everything
    else on the GPU: llama-server `-ngl 999 --n-cpu-moe N`. Only llama-server has the flag."""
    if server_kind != "llamacpp":
        return ()
    if router:
        return _router_preset(model, (f"n-gpu-layers = {ALL_LAYERS}", f"n-cpu-moe = {cpu_moe_layers}"))
    return (_llama_server(f"-ngl {ALL_LAYERS} --n-cpu-moe {cpu_moe_layers}", model_path),)


def unload_commands(server_kind: str, model: str) -> tuple[str, ...]:
    """Free a loaded model's memory without stopping its server: `ollama stop`, `lms unload`."""
    if server_kind == "ollama":
        return (f"ollama stop {model}",)
    if server_kind == "lmstudio":
        return (f"lms unload {model}",)
    return ()


def no_speculation_commands(
    server_kind: str, model: str, *, model_path: str | None = None, router: bool = False
) -> tuple[str, ...]:
    """Speculative decoding off: llama-server `--spec-type none`."""
    if server_kind != "llamacpp":
        return ()
    if router:
        return _router_preset(model, ("spec-type = none",))
    return (_llama_server("--spec-type none", model_path),)


def report_command(session_id: str | None) -> str:
    """`llm-tray report` for a session (the latest when None), written to a file named after it."""
    if session_id is None:
        return "llm-tray report -o llm-tray-report.html"
    return f"llm-tray report --session {session_id} -o llm-tray-report-{session_id}.html"


def joined(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """The commands of several options, in order, each once."""
    return tuple(dict.fromkeys(command for group in groups for command in group))
