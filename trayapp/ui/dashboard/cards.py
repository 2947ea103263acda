"""Per-model cards and the hardware footer line."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QProgressBar, QSizePolicy, QVBoxLayout, QWidget

from trayapp.core.glance import host_port, prefill_line
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import ModelStatus, ServerStatus
from trayapp.core.server_kinds import server_label
from trayapp.core.spec_types import speculative_text
from trayapp.core.text import unseen_cuts_note
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import (
    format_gb,
    format_gb_of,
    format_pct,
    format_rate,
    format_rate_marked,
    format_tokens,
    format_ttft,
)
from trayapp.core.vram_holders import gpu_holders_lines


def ttft_text(model: ModelStatus) -> str:
    """Time to first token (the one rule: `core.units.format_ttft`)."""
    return format_ttft(model.ttft_s, model.ttft_exact)


class ModelCard(QFrame):
    """One loaded model: server, quantization, size, GPU/CPU share, context fill, prompt stats."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        self.title = QLabel()
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.PlainText)
        self.gpu_bar = QProgressBar()
        self.gpu_bar.setRange(0, 100)
        self.context_bar = QProgressBar()
        self.context_bar.setRange(0, 1000)
        self.stats = QLabel()
        self.stats.setTextFormat(Qt.TextFormat.PlainText)
        # silent prompt truncation llm-tray cannot see here (#20): information, shown only while so
        self.cuts_note = QLabel()
        self.cuts_note.setTextFormat(Qt.TextFormat.PlainText)
        self.cuts_note.setVisible(False)
        for label in (self.title, self.details, self.stats, self.cuts_note):
            label.setContentsMargins(0, 0, 0, 2)  # room for underscores below the descent (Q4_K_M)
            label.setWordWrap(True)  # at spaces: a long line (prefill, a reason) grows the card down, not out
        for widget in (self.title, self.details, self.gpu_bar, self.context_bar, self.stats, self.cuts_note):
            layout.addWidget(widget)

    def update_model(
        self,
        server: ServerStatus,
        model: ModelStatus,
        no_gpu: bool = False,
        offload_gpu_fraction: float = Thresholds.offload_gpu_fraction,
    ) -> None:
        """Show `model`; `no_gpu`: this machine has no GPU and the server is local (all in RAM);
        a GPU share under `offload_gpu_fraction` gets the offload mark."""
        self.title.setText(f"{model.name} · {model.phase}")
        self.title.setToolTip(server.url)
        details = [model.quantization or "quantization —"]
        if model.size_bytes is not None:
            details.append(format_gb(model.size_bytes))
        if model.parameter_count:
            details.append(f"{model.parameter_count / 1e9:.1f}B params")
        if model.bytes_per_token is not None:
            exact = "exact" if model.bytes_per_token_exact else "estimated"
            details.append(f"{format_gb(model.bytes_per_token, digits=2)}/token ({exact})")
        where = f"{server_label(server.kind)} {host_port(server.url)}"
        self.details.setText(where + "\n" + " · ".join(details))
        self._update_gpu(model.gpu_fraction, no_gpu, offload_gpu_fraction)
        if model.context_length and model.context_tokens is not None:
            fill = min(model.context_tokens / model.context_length, 1.0)
            self.context_bar.setValue(round(fill * 1000))
            tokens = f"{format_tokens(model.context_tokens)}/{format_tokens(model.context_length)}"
            self.context_bar.setFormat(f"context {tokens} ({format_pct(fill)})")
        else:
            self.context_bar.setValue(0)
            self.context_bar.setFormat(f"context —/{format_tokens(model.context_length or None)}")
        stats = [prefill_line(model)] if model.phase == "prefill" else []
        stats.append(ttft_text(model))
        stats.append(f"prompt {format_rate_marked(model.prompt_tok_s, model.prompt_exact)}")
        speculative = speculative_text(
            model.spec_type, model.draft_acceptance, model.draft_acceptance_by_position
        )
        if speculative:
            stats.append(speculative)  # "speculative: draft-eagle3 (EAGLE-3 head) · acceptance 62 % · …"
        if model.ceiling_tok_s is not None:
            stats.append(f"ceiling {format_rate(model.ceiling_tok_s)} tok/s")
        if model.peer_band is not None:
            stats.append(model.peer_band.label)  # "peers on M2 Max, Q4: 52–62 %, n=14" (#23)
        if model.live_rate_reason:
            stats.append(f"live rate unavailable: {model.live_rate_reason}")
        self.stats.setText(" · ".join(stats))
        note = unseen_cuts_note(server, model)
        self.cuts_note.setText(f"Note: {note}." if note else "")
        self.cuts_note.setVisible(note is not None)

    def _update_gpu(self, gpu_fraction: float | None, no_gpu: bool, offload_gpu_fraction: float) -> None:
        if gpu_fraction is None:
            self.gpu_bar.setValue(0)
            self.gpu_bar.setFormat("no GPU · in system RAM" if no_gpu else "GPU share unknown")
            return
        gpu = min(max(gpu_fraction, 0.0), 1.0)
        self.gpu_bar.setValue(round(gpu * 100))
        cpu = f" · CPU {format_pct(1 - gpu)} ⚠" if gpu < offload_gpu_fraction else ""
        self.gpu_bar.setFormat(f"GPU {format_pct(gpu)}{cpu}")


def hardware_line(hardware: HardwareSnapshot) -> str:
    """'GPU RTX 4090 · 18.0/24 GB · 97 % busy · 64 °C      RAM 18.2/64 GB', then who holds each GPU's
    memory (`gpu_holders_lines`)."""
    parts = []
    for gpu in hardware.gpus:
        text = f"GPU {gpu.name}"
        if gpu.vram_used_bytes is not None and gpu.vram_total_bytes:
            text += f" · {format_gb_of(gpu.vram_used_bytes, gpu.vram_total_bytes)}"
        if gpu.util_gpu_pct is not None:
            text += f" · {gpu.util_gpu_pct:.0f} % busy"
        if gpu.temperature_c is not None:
            text += f" · {gpu.temperature_c:.0f} °C"
        if gpu.power_w is not None:
            limit = f" of {gpu.power_limit_w:.0f}" if gpu.power_limit_w else ""
            text += f" · {gpu.power_w:.0f}{limit} W"
        if gpu.throttle_reasons:
            text += " · throttled: " + ", ".join(gpu.throttle_reasons)
        parts.append(text)
    if not hardware.gpus:
        parts.append(f"GPU — ({hardware.gpu_reason})" if hardware.gpu_reason else "GPU —")
    host = hardware.host
    if host.ram_total_bytes and host.ram_available_bytes is not None:
        used = host.ram_total_bytes - host.ram_available_bytes
        parts.append(f"RAM {format_gb_of(used, host.ram_total_bytes)}")
    else:
        parts.append("RAM —")
    return "\n".join(["      ".join(parts), *gpu_holders_lines(hardware)])
