"""Fixes as exact text to copy, written for the server kind that runs the model (#20).

Each function returns the lines a user pastes: a server flag, an environment variable, a command.
llm-tray never applies them; it hands them over (the alert's `fix_commands`, the dashboard's Copy
button, `status --json`'s `fix.commands`, the notification's action, the bar's tooltip).
"""

from __future__ import annotations

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
