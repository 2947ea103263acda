"""Status-bar text (`llm-tray bar`): the glance document and its rendering for each bar.

Pure. The sampler turns each tick's `IconState` (core/glance.py: the tray's own number, ring,
health and tooltip, with their hysteresis) into a small JSON document, `glance_json`; `bar`
renders that document for Waybar, Polybar, i3blocks, lemonbar, tmux, SwiftBar, xbar or plain
text, `render(fmt, doc)`. `doc=None` means no sampler is running. See docs/status-bars.md.
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from trayapp.core.alert_kinds import alert_label
from trayapp.core.glance import IconState, active_alerts, host_port, wrap_lines
from trayapp.core.model import Snapshot
from trayapp.core.server_kinds import server_label
from trayapp.core.units import estimate_mark, format_rate_marked, format_tokens_short

GLANCE_SCHEMA = 1
FORMATS = ("waybar", "polybar", "i3blocks", "lemonbar", "tmux", "swiftbar", "xbar", "plain")
NOT_RUNNING = "llm-tray not running"
DEFAULT_MAX_WIDTH = 40
ELLIPSIS = "…"
ALERTING = ("warning", "critical")  # the severities that turn the icon red (core/glance.py)

# health → (hex colour for Polybar, lemonbar, i3blocks, SwiftBar; tmux colour name)
COLOURS: dict[str, tuple[str, str]] = {
    "ok": ("#4caf50", "green"),
    "degraded": ("#ff9800", "yellow"),
    "alert": ("#f44336", "red"),
    "idle": ("#9e9e9e", "colour245"),
    "none": ("#9e9e9e", "colour245"),
    "not-running": ("#9e9e9e", "colour245"),
}


# --------------------------------------------------------------------------- the document


def glance_json(state: IconState, snapshot: Snapshot) -> dict[str, Any]:
    """What a bar needs from one tick: the tray's glance plus the chosen model's numbers.

    Server addresses are host:port (no credentials, no path); never prompt text.
    """
    chosen: dict[str, Any] | None = None
    models: list[dict[str, Any]] = []
    for server, model in snapshot.models():
        entry: dict[str, Any] = {
            "server": host_port(server.url),
            "kind": server.kind,
            "name": model.name,
            "phase": model.phase,
            "decode_tok_s": model.decode_tok_s,
            "decode_exact": model.decode_exact,  # False: polled, the line marks it '~'
            "ceiling_tok_s": model.ceiling_tok_s,
            "efficiency": model.efficiency,
            "prefill_tokens_done": model.prefill.tokens_done if model.prefill else None,
            "prefill_tokens_total": model.prefill.tokens_total if model.prefill else None,
        }
        models.append(entry)
        if state.model_key == (server.url, model.name):
            chosen = entry
    alerts = sorted(active_alerts(snapshot), key=lambda a: a.severity != "critical")
    return {
        "schema": GLANCE_SCHEMA,
        "t": round(snapshot.t_wall_s, 3),
        "health": state.health,
        "text": state.text,
        "ring": state.ring,
        "offload": state.offload,
        "prefill": state.prefill,
        "tooltip": list(state.tooltip_lines),
        "model": chosen,
        "models": models,
        "alerts": [
            {
                "kind": a.kind,
                "severity": a.severity,
                "model": a.model,
                "words": alert_label(a.kind),
                "message": a.message,
                "commands": list(a.fix_commands),  # the fix to copy (docs/json.md), often none
            }
            for a in alerts
        ],
    }


# --------------------------------------------------------------------------- the line


def _shown_pct(doc: Mapping[str, Any] | None) -> int | None:
    """The percentage the line shows for its model: decode ÷ ceiling while decoding, the share of
    the prompt read while reading one; None when it shows none. Waybar's `percentage` is this one."""
    model = doc.get("model") if doc is not None else None
    if doc is None or not model:
        return None
    phase = model.get("phase")
    if phase == "decoding" and doc.get("text") and model.get("efficiency") is not None:
        return round(float(model["efficiency"]) * 100)
    done, total = model.get("prefill_tokens_done"), model.get("prefill_tokens_total")
    if phase == "prefill" and done is not None and total:
        return round(float(done) / float(total) * 100)
    return None


def _shown_alerts(doc: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The alerts the line shows: those that turn the icon red (critical first, as the document has
    them); an info alert (a cold load) is in the tooltip only."""
    alerts = (doc.get("alerts") or []) if doc is not None else []
    return [a for a in alerts if a.get("severity", "warning") in ALERTING]


def _exact(model: Mapping[str, Any]) -> bool | None:
    """Whether the model's decode rate is exact (a document from before `decode_exact`: None)."""
    exact = model.get("decode_exact")
    return exact if isinstance(exact, bool) else None


def _core(doc: Mapping[str, Any]) -> str:
    model = doc.get("model")
    if not model:
        return "LLM: no server" if doc.get("health") == "none" else "LLM: no model"
    phase = model.get("phase")
    pct = _shown_pct(doc)
    share = f" {pct}%" if pct is not None else ""
    if phase == "decoding":
        if not doc.get("text") or model.get("decode_tok_s") is None:
            return "decoding"  # no rate yet (the icon's '…'), or none to be had
        return f"{estimate_mark(_exact(model))}{doc['text']} tok/s{share}"
    if phase == "prefill":
        done, total = model.get("prefill_tokens_done"), model.get("prefill_tokens_total")
        if done is None:
            return "prefill"
        if total:
            return f"prefill {format_tokens_short(done)}/{format_tokens_short(total)}{share}"
        return f"prefill {format_tokens_short(done)}"
    return str(phase or "idle")


def _alert(doc: Mapping[str, Any]) -> str:
    alerts = _shown_alerts(doc)
    if not alerts:
        return ""
    more = f" +{len(alerts) - 1}" if len(alerts) > 1 else ""
    return f" ⚠ {alerts[0]['words']}{more}"


def fit(text: str, max_width: int | None) -> str:
    """`text` cut to `max_width` characters, the cut marked with an ellipsis."""
    if max_width is None or len(text) <= max_width:
        return text
    return text[: max(max_width - 1, 0)] + ELLIPSIS if max_width > 0 else ""


def bar_line(doc: Mapping[str, Any] | None, max_width: int | None = DEFAULT_MAX_WIDTH) -> str:
    """The bar's text: '<model> ~42 tok/s 71% ⚠ <alert>' ('~': a polled rate), shortened to fit `max_width`.

    Drops the model name first, then cuts the alert's words, then the rest.
    """
    if doc is None:
        return fit(NOT_RUNNING, max_width)
    core, alert = _core(doc), _alert(doc)
    model = doc.get("model")
    full = f"{model['name']} {core}{alert}" if model else f"{core}{alert}"
    if max_width is None or len(full) <= max_width:
        return full
    if len(core) + len(alert) <= max_width:
        return core + alert
    if alert and len(core) + 4 <= max_width:  # room for ' ⚠ x…'
        return core + fit(alert, max_width - len(core))
    return fit(core, max_width)


def _health(doc: Mapping[str, Any] | None) -> str:
    """The state the line shows, for colours and Waybar's class: `alert` exactly when it shows one."""
    if doc is None:
        return "not-running"
    health = str(doc.get("health") or "none")
    if _shown_alerts(doc):
        return "alert"
    return health if health != "alert" else "ok"  # red with no alert to show: an inconsistent document


def _percentage(doc: Mapping[str, Any] | None) -> int:
    """Waybar's `percentage` (0–100): the line's own percentage, clamped; 0 when it shows none."""
    pct = _shown_pct(doc)
    return min(max(pct, 0), 100) if pct is not None else 0


def _tooltip(doc: Mapping[str, Any] | None) -> str:
    if doc is None:
        return f"{NOT_RUNNING}: start the tray app or `llm-tray agent`"
    return "\n".join(wrap_lines(doc.get("tooltip") or []))


# --------------------------------------------------------------------------- per bar


def _markup_safe(text: str) -> str:
    """Polybar / lemonbar: `%{` opens a tag; break it so text can never open one."""
    return text.replace("%{", "% {")


def _menu_safe(text: str) -> str:
    """SwiftBar / xbar: ` | ` starts the parameters; a newline ends the item."""
    return text.replace("|", "¦").replace("\n", " ")


def _menu(doc: Mapping[str, Any] | None, title: str, open_command: Sequence[str]) -> str:
    colour = COLOURS[_health(doc)][0]
    lines = [f"{_menu_safe(title)} | color={colour}", "---"]
    if doc is None:
        lines.append(f"{NOT_RUNNING} | color={colour}")
    else:
        for model in doc.get("models") or []:
            rate = model.get("decode_tok_s")
            speed = f" · {format_rate_marked(rate, _exact(model), short=True)}" if rate is not None else ""
            item = (
                f"{model['name']} · {model['phase']}{speed} · {server_label(model['kind'])} {model['server']}"
            )
            lines.append(_menu_safe(item))
        if not doc.get("models"):
            lines.append(_menu_safe(bar_line(doc, None)))
        for alert in doc.get("alerts") or []:
            lines.append(f"⚠ {_menu_safe(alert['message'])} | color={COLOURS['alert'][0]}")
            # its fix's commands as a submenu (`--`), to read off; a document before #20 has none
            lines += [f"--{_menu_safe(command)} | font=Menlo" for command in alert.get("commands") or []]
    if open_command:
        params = " ".join(f"param{i}={shlex.quote(arg)}" for i, arg in enumerate(open_command[1:], 1))
        lines += ["---", f"Open dashboard | shell={shlex.quote(open_command[0])} {params} terminal=false"]
    return "\n".join(lines)


def render(
    fmt: str,
    doc: Mapping[str, Any] | None,
    *,
    max_width: int | None = DEFAULT_MAX_WIDTH,
    open_command: Sequence[str] = (),
) -> str:
    """What `llm-tray bar --format FMT` prints for `doc` (None: no sampler running).

    One line, except SwiftBar / xbar (title, `---`, the menu). `open_command` is the argv of
    the "Open dashboard" menu item (running llm-tray shows the running tray's dashboard).
    """
    line = bar_line(doc, max_width)
    health = _health(doc)
    hex_colour, tmux_colour = COLOURS[health]
    if fmt == "waybar":
        return json.dumps(
            {
                "text": html.escape(line, quote=False),  # Waybar reads Pango markup
                "tooltip": html.escape(_tooltip(doc), quote=False),
                "class": health,
                "percentage": _percentage(doc),
            },
            ensure_ascii=False,
        )
    if fmt in ("polybar", "lemonbar"):
        return f"%{{F{hex_colour}}}{_markup_safe(line)}%{{F-}}"
    if fmt == "i3blocks":
        return f"<span foreground='{hex_colour}'>{html.escape(line)}</span>"
    if fmt == "tmux":
        return f"#[fg={tmux_colour}]{line.replace('#', '##')}#[default]"
    if fmt in ("swiftbar", "xbar"):
        return _menu(doc, line, open_command)
    if fmt == "plain":
        return line
    raise ValueError(f"unknown bar format {fmt!r}: one of {', '.join(FORMATS)}")
