"""`lms runtime ls` → LM Studio's build: the selected engines (table shape: lmstudio-ai/lms list.ts)."""

from __future__ import annotations

from pathlib import Path

from trayapp.sources.servers.lms_runtime import parse_runtime_ls


def test_the_selected_engine_is_the_build(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "lmstudio" / "lms_runtime_ls.txt").read_text(encoding="utf-8")
    assert parse_runtime_ls(text) == "llama.cpp-linux-x86_64-avx2@1.52.0"


def test_one_engine_per_format_on_a_mac() -> None:
    text = (
        "LLM ENGINE                                   SELECTED    MODEL FORMAT\n"
        "llama.cpp-mac-arm64-apple-metal-advsimd@1.52.0    ✓          GGUF\n"
        "mlx-llm-mac-arm64-apple-metal-advsimd@0.30.0      ✓          MLX\n"
        "mlx-llm-mac-arm64-apple-metal-advsimd@0.29.1                 MLX\n"
    )
    assert parse_runtime_ls(text) == (
        "llama.cpp-mac-arm64-apple-metal-advsimd@1.52.0, mlx-llm-mac-arm64-apple-metal-advsimd@0.30.0"
    )


def test_no_table_or_nothing_selected() -> None:
    assert parse_runtime_ls("No runtimes found.\n") is None
    assert parse_runtime_ls("LLM ENGINE    SELECTED    MODEL FORMAT\nllama.cpp@1.0        GGUF\n") is None
