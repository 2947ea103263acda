"""What the tray icon and its tooltip show, computed from one Snapshot.

Pure (no Qt, no I/O): `icon_state()` maps a Snapshot to an `IconState`, the
small value the icon renderer draws and caches. `GlanceTracker` adds the little
memory the icon needs between ticks: when each model started decoding (to
show the most recent one when several decode) and what was shown last (number
and colour hysteresis, so the icon does not flicker).

Health, in order of precedence:

* "alert"    an active warning/critical alert anywhere (red even when the number looks fine)
* "none"     no server answers
* "degraded" the shown model is partly on the CPU, stalled, under 3 tok/s, or
             fully on a GPU yet under the efficiency threshold of its ceiling
* "ok"       a model is working (decoding, reading the prompt, loading)
* "idle"     models are loaded, nothing is happening
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from trayapp.core.model import Alert, ModelKey, ModelStatus, ServerStatus, Snapshot
from trayapp.core.phases import Phase, is_active, top_phase
from trayapp.core.server_kinds import server_label
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import (
    estimate_mark,
    format_pct,
    format_rate_marked,
    format_rate_short,
    format_tokens,
    format_tokens_short,
    format_ttft,
)

Health = Literal["ok", "degraded", "alert", "idle", "none"]

RING_STEPS = 20  # the ring is quantized to 5 % steps
RING_HYSTERESIS = 0.04  # keep the previous ring until the share moves this much
NUMBER_HYSTERESIS = 0.03  # keep the previous number until the rate moves 3 %
HEALTH_HYSTERESIS = 0.05  # leave "degraded" only this far above the threshold
TOOLTIP_WIDTH_CHARS = 60  # tooltip lines wrap at spaces past this (an alert's message is one long sentence)
DEFAULT_THRESHOLDS = Thresholds()

_REACHABLE = ("ok", "loading")
_ALERTING = ("warning", "critical")
GENERATING_TEXT = "…"  # the icon's text while decoding before a rate: the first polls of a request
DECODING_NO_RATE_YET = "decoding (rate after the next poll)"  # a rate needs two polls that saw decoding


@dataclass(frozen=True)
class IconState:
    """What the icon draws. Only the drawn fields take part in == and hash (the render cache key)."""

    health: Health
    text: str | None = None  # decode tok/s, at most 3 characters (GENERATING_TEXT before a rate); None
    ring: float | None = None  # share of the ceiling, 0..1 in RING_STEPS steps
    ring_faint: bool = False  # the ring shows the last request, not a live rate
    offload: bool = False  # partly on the CPU
    prefill: bool = False  # reading a prompt: `text` is the prompt tokens in place, `ring` their share
    queued: bool = False  # requests wait for a slot (the server's own count, #22)
    paused: bool = False
    tooltip_lines: tuple[str, ...] = field(default=(), compare=False)
    model_key: ModelKey | None = field(default=None, compare=False)
    rate_tok_s: float | None = field(default=None, compare=False)  # the rate behind `text`

    @property
    def tooltip(self) -> str:
        """The tooltip text: `tooltip_lines`, each wrapped to TOOLTIP_WIDTH_CHARS."""
        return "\n".join(wrap_lines(self.tooltip_lines))


# --------------------------------------------------------------------------- formatting


def wrap_lines(lines: Sequence[str], width_chars: int = TOOLTIP_WIDTH_CHARS) -> list[str]:
    """Each line broken at spaces into lines of at most `width_chars`, continuations indented two
    spaces; a longer word (a URL) stays whole rather than being cut."""
    wrapped: list[str] = []
    for line in lines:
        parts = textwrap.wrap(
            line, width_chars, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
        wrapped += parts or [line]
    return wrapped


def host_port(url: str) -> str:
    """'http://user:pw@127.0.0.1:8080/x?y' → '127.0.0.1:8080' (no credentials, no path)."""
    parts = urlsplit(url)
    host = parts.hostname or url
    if ":" in host:  # IPv6
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


# --------------------------------------------------------------------------- choosing the model


def active_alerts(snapshot: Snapshot) -> tuple[Alert, ...]:
    return tuple(a for a in snapshot.alerts if a.ended_wall_s is None)


def _key(server: ServerStatus, model: ModelStatus) -> ModelKey:
    return (server.url, model.name)


def choose_model(
    snapshot: Snapshot,
    previous_key: ModelKey | None = None,
    decoding_since: Mapping[ModelKey, float] | None = None,
) -> tuple[ServerStatus, ModelStatus] | None:
    """The model the icon speaks for.

    The one decoding; when several decode, the one that started most recently
    (by `decoding_since`), then the previously shown one. With nothing
    decoding: a model in the next phase of `PHASE_PRIORITY` (reading a prompt,
    stalled, loading); else the previously shown model if it is still loaded,
    else the first loaded one.
    """
    since = decoding_since or {}
    pairs = [(s, m) for s, m in snapshot.models() if s.status in _REACHABLE]
    if not pairs:
        return None
    decoding = [(i, s, m) for i, (s, m) in enumerate(pairs) if m.phase == "decoding"]
    if decoding:
        best = max(
            decoding,
            key=lambda t: (since.get(_key(t[1], t[2]), -math.inf), _key(t[1], t[2]) == previous_key, t[0]),
        )
        return best[1], best[2]
    top = top_phase(m.phase for _, m in pairs)
    if top is not None:
        busy = [(s, m) for s, m in pairs if m.phase == top]
        same = [p for p in busy if _key(*p) == previous_key]
        return (same or busy)[0]
    same = [p for p in pairs if _key(*p) == previous_key]
    return (same or pairs)[0]


def server_phase(server: ServerStatus) -> Phase | None:
    """The phase a server's menu line shows: its models' first in `PHASE_PRIORITY` (the icon's order,
    `choose_model`), or "loading" while the server itself loads; None when nothing is active."""
    return top_phase(m.phase for m in server.models) or ("loading" if server.status == "loading" else None)


# --------------------------------------------------------------------------- the state


def _ring(raw: float | None, previous: IconState | None) -> float | None:
    if raw is None or math.isnan(raw):
        return None
    raw = min(max(raw, 0.0), 1.0)
    if previous is not None and previous.ring is not None and abs(raw - previous.ring) < RING_HYSTERESIS:
        return previous.ring
    return round(raw * RING_STEPS) / RING_STEPS


def _number(rate: float, key: ModelKey, previous: IconState | None) -> tuple[str, float]:
    """The number text and the rate it stands for (kept while the rate moves less than 3 %)."""
    if previous is not None and previous.model_key == key and previous.text and previous.rate_tok_s:
        anchor = previous.rate_tok_s
        if abs(rate - anchor) <= max(0.1, NUMBER_HYSTERESIS * anchor):
            return previous.text, anchor
    return format_rate_short(rate), rate


def _is_offloaded(model: ModelStatus, t: Thresholds) -> bool:
    return model.gpu_fraction is not None and model.gpu_fraction < t.offload_gpu_fraction


def _model_health(model: ModelStatus, previous: IconState | None, t: Thresholds) -> Health:
    if not is_active(model.phase):  # resting: nothing to judge, grey icon, no offload mark
        return "idle"
    if model.phase == "stalled" or _is_offloaded(model, t):
        return "degraded"
    if model.phase != "decoding":
        return "ok"
    if model.decode_tok_s is not None and model.decode_tok_s < t.below_floor_tok_s:
        return "degraded"
    fully_on_gpu = model.gpu_fraction is not None and not _is_offloaded(model, t)
    efficiency = model.efficiency
    if not fully_on_gpu or efficiency is None:
        return "ok"  # like the low_efficiency detector: judged only for models fully on a GPU
    threshold = t.low_efficiency_ratio
    if previous is not None and previous.health == "degraded":
        threshold += HEALTH_HYSTERESIS
    return "degraded" if efficiency < threshold else "ok"


def queued_note(model: ModelStatus) -> str:
    """` · queued 2` while requests wait for a slot (the server's own count), else empty."""
    return f" · queued {model.queued_requests}" if model.queued_requests else ""


def _rate_line(model: ModelStatus) -> str:
    last = f"last {format_rate_marked(model.last_decode_tok_s, model.decode_exact, short=True)}"
    if model.phase == "decoding":
        if model.decode_tok_s is None:
            if model.live_rate_reason:
                line = f"decoding · rate unavailable: {model.live_rate_reason}"
            else:
                line = DECODING_NO_RATE_YET
            return f"{line} · {last}" if model.last_decode_tok_s is not None else line
        line = format_rate_marked(model.decode_tok_s, model.decode_exact, short=True)
        if model.ceiling_tok_s:
            share = model.decode_tok_s / model.ceiling_tok_s
            line += f" · {format_pct(share)} of {format_rate_short(model.ceiling_tok_s)} tok/s ceiling"
        else:
            line += " · ceiling unknown"
        if model.active_streams > 1 and model.decode_total_tok_s is not None:
            total = format_rate_marked(model.decode_total_tok_s, model.decode_exact, short=True)
            line += f" · {model.active_streams} streams, {total} total"
        return line + queued_note(model)
    if model.phase == "prefill":
        return prefill_line(model) + queued_note(model)
    if model.phase == "loading":
        return "loading the model…"
    if model.phase == "stalled":
        return "stalled: decoding but no new tokens"
    if model.phase == "sleeping":
        return "sleeping: the server freed the model; the next request loads it again"
    if model.phase == "unloaded":
        return "not loaded: the server loads it on the next request for it"
    parts = ["idle"]
    if model.last_decode_tok_s is not None:
        parts.append(last)
    if model.ttft_s is not None:
        parts.append(format_ttft(model.ttft_s, model.ttft_exact))
    if model.ceiling_tok_s:
        parts.append(f"ceiling {format_rate_short(model.ceiling_tok_s)} tok/s")
    return " · ".join(parts)


def prefill_line(model: ModelStatus) -> str:
    """'reading prompt 12.4k / 28k · 44 % · ~250 tok/s · ~62 s' (total and ETA where the server says).

    The counts are the server's own; the speed (polled) and the ETA are estimates; with no progress,
    the last prompt's speed stands in for this one's: an estimate too."""
    progress = model.prefill
    if progress is None:
        rate = f" · {format_rate_marked(model.prompt_tok_s, False, short=True)}" if model.prompt_tok_s else ""
        return f"reading the prompt (prefill){rate}"
    parts = [f"reading prompt {format_tokens(progress.tokens_done)}"]
    if progress.tokens_total:
        parts[0] += f" / {format_tokens(progress.tokens_total)}"
        if progress.share is not None:
            parts.append(format_pct(progress.share))
    else:
        parts[0] += " tokens so far"
    if progress.tok_s:
        parts.append(format_rate_marked(progress.tok_s, False, short=True))
    if progress.eta_s is not None:
        parts.append(f"{estimate_mark(False)}{progress.eta_s:.0f} s")
    if progress.mostly_cached:
        parts.append(f"{format_tokens(progress.cached_tokens)} from the cache")
    return " · ".join(parts)


def _context_line(model: ModelStatus, t: Thresholds) -> str | None:
    parts = []
    if model.context_length:
        depth = format_tokens(model.context_tokens) if model.context_tokens is not None else "—"
        parts.append(f"context {depth} / {format_tokens(model.context_length)}")
    elif model.context_tokens is not None:
        parts.append(f"context {format_tokens(model.context_tokens)}")
    if model.gpu_fraction is not None:
        gpu = min(max(model.gpu_fraction, 0.0), 1.0)
        if gpu < t.offload_gpu_fraction:
            parts.append(f"{format_pct(gpu)} GPU · {format_pct(1 - gpu)} CPU ⚠")
        else:
            parts.append(f"{format_pct(gpu)} GPU")
    return " · ".join(parts) or None


def model_title(server: ServerStatus, model: ModelStatus) -> str:
    name = model.name
    if model.quantization and model.quantization.lower() not in name.lower():
        name = f"{name} {model.quantization}"
    return f"{name} · {server_label(server.kind)}"


def fix_clipboard_text(alert: Alert) -> str:
    """What "Copy fix" (the dashboard's button, the tray menu's entry) puts on the clipboard: the
    fix's commands, one per line; "" when it has none."""
    return "\n".join(alert.fix_commands)


def first_command(alert: Alert) -> str | None:
    """The alert's first fix command, the others counted: 'llama-server -c 16384 (+1 more)'; None
    when its fix has none."""
    commands = alert.fix_commands
    if not commands:
        return None
    more = f" (+{len(commands) - 1} more)" if len(commands) > 1 else ""
    return f"{commands[0]}{more}"


def fix_line(alert: Alert) -> str | None:
    """The alert's fix in one tooltip line: 'fix: <first command>'; None when it has no command.
    All of them: the dashboard's and the tray menu's "Copy fix"."""
    command = first_command(alert)
    return f"fix: {command}" if command else None


def _alert_lines(alerts: tuple[Alert, ...]) -> list[str]:
    if not alerts:
        return []
    worst = sorted(alerts, key=lambda a: a.severity != "critical")[0]
    lines = [f"⚠ {worst.message}"]
    fix = fix_line(worst)
    if fix:
        lines.append(fix)
    if len(alerts) > 1:
        lines.append(f"(+{len(alerts) - 1} more alert{'s' if len(alerts) > 2 else ''})")
    return lines


def _no_server_lines(snapshot: Snapshot, discovery: bool | None) -> list[str]:
    lines = ["No LLM server found"]
    probed = [s for s in snapshot.servers if s.status == "unreachable"]
    if probed:
        lines.append("probed: " + ", ".join(host_port(s.url) for s in probed[:6]))
        if len(probed) > 6:
            lines[-1] += f" (+{len(probed) - 6})"
    blocked = [s for s in snapshot.servers if s.status in ("unauthorized", "error")]
    for server in blocked[:3]:
        why = "needs an API key" if server.status == "unauthorized" else (server.reason or "error")
        lines.append(f"{server_label(server.kind)} {host_port(server.url)}: {why}")
    if not snapshot.servers:  # no endpoint configured; the scan (if on) found nothing
        if discovery is None:
            lines.append("no endpoints configured and no server found")
        elif discovery:
            lines.append("no endpoint configured; nothing answers on the default ports")
        else:
            lines.append("nothing probed: no endpoints configured and discovery is off")
    return lines


def icon_state(
    snapshot: Snapshot | None,
    previous: IconState | None = None,
    decoding_since: Mapping[ModelKey, float] | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    discovery: bool | None = None,
    queued_since: Mapping[ModelKey, float] | None = None,
) -> IconState:
    """The icon and tooltip for one snapshot (pure; `previous` gives hysteresis).

    `discovery`: whether the default ports are scanned (None: not known), for the no-server text;
    `queued_since`: when the monitor first saw requests waiting for each model (monotonic s).
    """
    if snapshot is None:
        return IconState("none", tooltip_lines=("llm-tray", "waiting for the first reading…"))
    alerts = active_alerts(snapshot)
    alerting = any(a.severity in _ALERTING for a in alerts)
    previous_key = previous.model_key if previous is not None else None
    chosen = choose_model(snapshot, previous_key, decoding_since)
    reachable = [s for s in snapshot.servers if s.status in _REACHABLE]

    if chosen is None:
        lines = _no_server_lines(snapshot, discovery) if not reachable else []
        for server in reachable[:3]:
            lines.append(f"{server_label(server.kind)} {host_port(server.url)} · no model loaded")
        lines += _alert_lines(alerts)
        health: Health = "alert" if alerting else ("idle" if reachable else "none")
        return IconState(health, tooltip_lines=tuple(lines))

    server, model = chosen
    key = _key(server, model)
    lines = [model_title(server, model), _rate_line(model)]
    queued_at = (queued_since or {}).get(key) if model.queued_requests else None
    if queued_at is not None and snapshot.t_mono_s - queued_at >= 1.0:  # seen waiting since then, or longer
        lines[1] += f" · waiting ≥{snapshot.t_mono_s - queued_at:.0f} s"
    context = _context_line(model, thresholds)
    if context:
        lines.append(context)
    others = [m for s, m in snapshot.models() if m.phase == "decoding" and _key(s, m) != key]
    if others:
        lines.append(f"+{len(others)} more model{'s' if len(others) > 1 else ''} decoding")
    lines += _alert_lines(alerts)

    text = None
    rate = None
    ring_raw: float | None = None
    faint = False
    if model.phase == "decoding" and model.decode_tok_s is not None:
        text, rate = _number(model.decode_tok_s, key, previous)
        ring_raw = model.efficiency
    elif model.phase == "decoding":  # generating, no rate yet: '…' and, faintly, the last request's share
        text = GENERATING_TEXT
        if model.last_decode_tok_s is not None and model.ceiling_tok_s:
            ring_raw = model.last_decode_tok_s / model.ceiling_tok_s
            faint = True
    elif model.phase == "prefill" and model.prefill is not None:
        text = format_tokens_short(model.prefill.tokens_done)
        ring_raw = model.prefill.share
    elif model.phase == "idle" and model.last_decode_tok_s is not None and model.ceiling_tok_s:
        ring_raw = model.last_decode_tok_s / model.ceiling_tok_s
        faint = True
    health = "alert" if alerting else _model_health(model, previous, thresholds)
    return IconState(
        health=health,
        text=text,
        ring=_ring(ring_raw, previous),
        ring_faint=faint,
        offload=_is_offloaded(model, thresholds),
        prefill=model.phase == "prefill" and model.prefill is not None,
        queued=bool(model.queued_requests),
        tooltip_lines=tuple(lines),
        model_key=key,
        rate_tok_s=rate,
    )


def paused_state(previous: IconState | None = None) -> IconState:
    """The icon while monitoring is paused: grey with a pause mark."""
    lines = ("llm-tray: monitoring paused", "choose “Pause monitoring” again to resume")
    key = previous.model_key if previous is not None else None
    return IconState("idle", paused=True, tooltip_lines=lines, model_key=key)


class GlanceTracker:
    """Feeds `icon_state` the memory it needs: the last state and when models started decoding."""

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS, discovery: bool | None = None) -> None:
        self.thresholds = thresholds
        self.discovery = discovery  # whether the default ports are scanned; None: not known
        self.state: IconState | None = None
        self._decoding_since: dict[ModelKey, float] = {}
        self._queued_since: dict[ModelKey, float] = {}  # since when requests wait for each model

    def update(self, snapshot: Snapshot) -> IconState:
        decoding = {_key(s, m) for s, m in snapshot.models() if m.phase == "decoding"}
        queued = {_key(s, m) for s, m in snapshot.models() if m.queued_requests}
        for since, now in ((self._decoding_since, decoding), (self._queued_since, queued)):
            for key in list(since):
                if key not in now:
                    del since[key]
            for key in now:
                since.setdefault(key, snapshot.t_mono_s)
        self.state = icon_state(
            snapshot, self.state, self._decoding_since, self.thresholds, self.discovery, self._queued_since
        )
        return self.state
