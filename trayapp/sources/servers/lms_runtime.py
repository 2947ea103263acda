"""LM Studio's inference runtime, the build its speed depends on: `lms runtime ls`.

LM Studio's own version says little about speed; its runtimes ("llama.cpp-linux-x86_64-avx2@1.52.0",
"mlx-llm-mac-arm64-apple-metal-advsimd@0.30.0") are updated apart from the app, and one update can
break offload (lms#348). `lms runtime ls` (lmstudio-ai/lms `src/subcommands/runtime/list.ts`) prints
a table, no JSON: `LLM ENGINE    SELECTED    MODEL FORMAT`, one row per installed engine as
`NAME@VERSION`, `✓` on the ones selected for a model format. The selected ones are the build.
"""

from __future__ import annotations

SELECTED_MARK = "✓"
MAX_RUNTIME_TEXT = 64 * 1024


def parse_runtime_ls(text: str) -> str | None:
    """The selected engines, each once, in the table's order ("llama.cpp-…@1.52.0, mlx-llm-…@0.30.0");
    None when the text holds no table or nothing is selected."""
    selected: list[str] = []
    lines = text[:MAX_RUNTIME_TEXT].splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip().startswith("LLM ENGINE")), None)
    if header is None:
        return None
    for line in lines[header + 1 :]:
        cells = line.split()
        if len(cells) >= 2 and "@" in cells[0] and SELECTED_MARK in cells[1:] and cells[0] not in selected:
            selected.append(cells[0])
    return ", ".join(selected) or None
