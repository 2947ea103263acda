"""The dashboard's first-run panel: no LLM server answers, so say how to start one or add a remote one.

Shown while the latest snapshot has no server that answers (the tray's menu then reads
"No LLM server found"); hidden as soon as one does.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from trayapp.core.glance import host_port
from trayapp.core.model import Snapshot

START_TIPS = (
    "llama.cpp: `llama-server -m MODEL.gguf` (port 8080; 9931 from upstream's newer builds)",
    "Ollama: `ollama serve` (port 11434)",
    "LM Studio: Developer → Start Server (port 1234)",
    "vLLM: `vllm serve MODEL` (port 8000); SGLang: port 30000; MLX-LM: `mlx_lm.server` (port 8080)",
)
REMOTE_TIPS = (
    "in the tray icon's menu: Settings… → Servers → Add (its URL, kind and API key)",
    'or in config.toml: an [[endpoints]] entry with url = "http://HOST:PORT"',
    "or for one run: `llm-tray --endpoint llamacpp=http://HOST:8080`",
)
MAX_PROBED_SHOWN = 8


def no_server_found(snapshot: Snapshot | None) -> bool:
    """Whether a reading came and no server in it answers (every one unreachable, or none at all)."""
    return snapshot is not None and all(s.status == "unreachable" for s in snapshot.servers)


def empty_state_lines(snapshot: Snapshot) -> list[str]:
    """What the panel says, as plain lines: what was probed, how to start a server, how to add one."""
    probed = [host_port(s.url) for s in snapshot.servers]
    lines = ["No LLM server found."]
    if probed:
        shown = ", ".join(probed[:MAX_PROBED_SHOWN]) + (", …" if len(probed) > MAX_PROBED_SHOWN else "")
        lines.append(f"Probed: {shown} (nothing answered).")
    lines.append("Start one on this machine; llm-tray finds it on its default port within a minute:")
    lines += [f"  • {tip}" for tip in START_TIPS]
    lines.append("A server on another machine, or on another port:")
    lines += [f"  • {tip}" for tip in REMOTE_TIPS]
    return lines


class EmptyState(QFrame):
    """The first-run panel; `update_snapshot` shows it while no server answers and hides it after."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("empty-state")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.label)
        self.lines: list[str] = []
        self.hide()

    def update_snapshot(self, snapshot: Snapshot | None) -> None:
        if not no_server_found(snapshot) or snapshot is None:
            self.lines = []
            self.hide()
            return
        lines = empty_state_lines(snapshot)
        if lines != self.lines:
            self.lines = lines
            head, *rest = (html.escape(line) for line in lines)
            self.label.setText(f"<b>{head}</b><br>" + "<br>".join(rest).replace("  • ", "&nbsp;&nbsp;• "))
        self.show()

    def text(self) -> str:
        """What it says, as plain text ('' while hidden)."""
        return "\n".join(self.lines)
