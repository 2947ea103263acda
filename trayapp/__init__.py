"""llm-tray: watch local LLM servers against the memory-bandwidth ceiling."""

__version__ = "0.1.0"
