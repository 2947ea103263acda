"""`llm-tray report`: a self-contained one-page HTML summary of a session.

No external assets and no script: inline CSS and SVG plots drawn here (decode tok/s
over time against the ceiling and the realistic band; decode tok/s against context
depth with the ceiling curve the samples recorded), the hardware, and the alerts
with cause and fix. Every string from the store goes through `html.escape`.
"""

from __future__ import annotations

import contextlib
import html
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from trayapp import __version__
from trayapp.adapters.store import Store
from trayapp.core.model import SessionRecord
from trayapp.core.physics import REALISTIC_BAND

MAX_PLOT_POINTS = 600  # per series; longer sessions are averaged into this many time buckets
MAX_SCATTER_POINTS = 1500


class ReportError(ValueError):
    """No session to report on (unknown id, or nothing recorded yet)."""


@dataclass(frozen=True)
class _Sample:
    t_wall_s: float
    decode_tok_s: float | None
    ceiling_tok_s: float | None
    context_tokens: int | None


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _num(value: object, unit: str = "", digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (int, float)):
        text = f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"
        return f"{text} {unit}".strip()
    return _e(value)


def _approx(value: object, estimated: bool) -> str:
    """A "~" prefix when a value that is shown was estimated, else nothing."""
    return "~" if estimated and isinstance(value, (int, float)) and math.isfinite(value) else ""


def _gb(value: object) -> str:
    return _num(value / 1e9, "GB", 1) if isinstance(value, (int, float)) else "—"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


def _utc(t: float | None) -> str:
    if t is None:
        return "—"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "live"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# --------------------------------------------------------------------------- SVG


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks: list[float] = []
    value = first
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _tick_label(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


class _Plot:
    """A minimal SVG chart: linear axes, polylines, bands and dots."""

    def __init__(self, title: str, x_label: str, y_label: str, x_range: tuple[float, float],
                 y_max: float, width: int = 760, height: int = 320) -> None:  # fmt: skip
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = 64, 16, 46, 44
        self.x0, self.x1 = x_range if x_range[1] > x_range[0] else (x_range[0], x_range[0] + 1.0)
        self.y1 = y_max if y_max > 0 else 1.0
        self.parts: list[str] = [
            f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
            f"<title>{_e(title)}</title>",
            f'<text x="{self.left}" y="18" class="title">{_e(title)}</text>',
        ]
        self._axes(x_label, y_label)

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return self.left + (value - self.x0) / (self.x1 - self.x0) * span

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        return self.top + span - min(max(value, 0.0), self.y1 * 1.05) / (self.y1 * 1.05) * span

    def _axes(self, x_label: str, y_label: str) -> None:
        bottom, top = self.height - self.bottom, self.top
        left, right = self.left, self.width - self.right
        for tick in _nice_ticks(0.0, self.y1):
            y = self.y(tick)
            self.parts.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
            self.parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                              f"{_tick_label(tick)}</text>")  # fmt: skip
        for tick in _nice_ticks(self.x0, self.x1):
            x = self.x(tick)
            self.parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
            self.parts.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                              f"{_tick_label(tick)}</text>")  # fmt: skip
        self.parts.append(f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>')
        self.parts.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>')
        self.parts.append(f'<text class="label" x="{(left + right) / 2:.0f}" y="{self.height - 6}" '
                          f'text-anchor="middle">{_e(x_label)}</text>')  # fmt: skip
        middle = (top + bottom) / 2
        self.parts.append(f'<text class="label" transform="translate(14 {middle:.0f}) rotate(-90)" '
                          f'text-anchor="middle">{_e(y_label)}</text>')  # fmt: skip

    def line(self, points: Sequence[tuple[float, float | None]], css: str) -> None:
        """A polyline; None values break it into segments."""
        segment: list[str] = []
        for x, y in [*points, (math.nan, None)]:
            if y is None or not math.isfinite(x):
                if len(segment) == 1:
                    px, py = segment[0].split(",")
                    self.parts.append(f'<circle class="{css}" cx="{px}" cy="{py}" r="2"/>')
                elif segment:
                    self.parts.append(f'<polyline class="{css}" points="{" ".join(segment)}"/>')
                segment = []
            else:
                segment.append(f"{self.x(x):.1f},{self.y(y):.1f}")

    def band(self, points: Sequence[tuple[float, float, float]], css: str) -> None:
        """A filled area between two curves: (x, low, high) points."""
        if len(points) < 2:
            return
        upper = [f"{self.x(x):.1f},{self.y(hi):.1f}" for x, _, hi in points]
        lower = [f"{self.x(x):.1f},{self.y(lo):.1f}" for x, lo, _ in reversed(points)]
        self.parts.append(f'<polygon class="{css}" points="{" ".join(upper + lower)}"/>')

    def dots(self, points: Iterable[tuple[float, float]], css: str, radius: float = 2.5) -> None:
        for x, y in points:
            self.parts.append(
                f'<circle class="{css}" cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="{radius}"/>'
            )

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """A key row under the title."""
        x = float(self.left)
        for css, label in items:
            self.parts.append(f'<rect class="{css} key" x="{x:.0f}" y="26" width="10" height="10"/>')
            self.parts.append(f'<text class="legend" x="{x + 14:.0f}" y="35">{_e(label)}</text>')
            x += 30 + 6.5 * len(label)

    def svg(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def _buckets(samples: Sequence[_Sample], start: float, end: float) -> list[_Sample]:
    """Average samples into at most MAX_PLOT_POINTS time buckets (a gap stays a gap)."""
    if len(samples) <= MAX_PLOT_POINTS:
        return list(samples)
    width = max((end - start) / MAX_PLOT_POINTS, 1e-9)
    grouped: dict[int, list[_Sample]] = {}
    for s in samples:
        index = min(int((s.t_wall_s - start) / width), MAX_PLOT_POINTS - 1)
        grouped.setdefault(index, []).append(s)
    result = []
    for index in sorted(grouped):
        group = grouped[index]
        rates = [s.decode_tok_s for s in group if s.decode_tok_s is not None]
        ceilings = [s.ceiling_tok_s for s in group if s.ceiling_tok_s is not None]
        contexts = [s.context_tokens for s in group if s.context_tokens is not None]
        result.append(
            _Sample(
                t_wall_s=start + (index + 0.5) * width,
                decode_tok_s=statistics.fmean(rates) if rates else None,
                ceiling_tok_s=statistics.fmean(ceilings) if ceilings else None,
                context_tokens=max(contexts) if contexts else None,
            )
        )
    return result


def _time_plot(samples: Sequence[_Sample], requests: Sequence[tuple[float, float]], start: float) -> str:
    end = max([s.t_wall_s for s in samples] + [t for t, _ in requests] + [start + 1.0])
    minutes = end - start > 180
    scale = 60.0 if minutes else 1.0
    points = _buckets(samples, start, end)
    y_max = max(
        [s.ceiling_tok_s or 0.0 for s in points]
        + [s.decode_tok_s or 0.0 for s in points]
        + [r for _, r in requests]
    )
    plot = _Plot(
        "Decode speed over time",
        f"time since start ({'min' if minutes else 's'})",
        "tok/s",
        (0.0, (end - start) / scale),
        y_max,
    )
    low, high = REALISTIC_BAND
    plot.band(
        [((s.t_wall_s - start) / scale, s.ceiling_tok_s * low, s.ceiling_tok_s * high)
         for s in points if s.ceiling_tok_s is not None],
        "band",
    )  # fmt: skip
    plot.line([((s.t_wall_s - start) / scale, s.ceiling_tok_s) for s in points], "ceiling")
    plot.line([((s.t_wall_s - start) / scale, s.decode_tok_s) for s in points], "rate")
    plot.dots([((t - start) / scale, r) for t, r in requests], "request", radius=3.5)
    plot.legend([("rate", "decode tok/s"), ("ceiling", "ceiling"), ("band", "realistic 60–75 %"),
                 ("request", "finished requests")])  # fmt: skip
    return plot.svg()


def _context_plot(samples: Sequence[_Sample], requests: Sequence[tuple[int, float]]) -> str:
    measured = [(s.context_tokens, s.decode_tok_s) for s in samples
                if s.context_tokens is not None and s.decode_tok_s is not None]  # fmt: skip
    stride = max(1, math.ceil(len(measured) / MAX_SCATTER_POINTS))
    measured = measured[::stride]
    curve_points: dict[int, list[float]] = {}
    contexts = [s.context_tokens for s in samples if s.context_tokens is not None] + [c for c, _ in requests]
    x_max = float(max(contexts, default=0)) or 1.0
    bin_width = max(x_max / 120, 1.0)
    for s in samples:
        if s.context_tokens is not None and s.ceiling_tok_s is not None:
            curve_points.setdefault(int(s.context_tokens / bin_width), []).append(s.ceiling_tok_s)
    curve = [((b + 0.5) * bin_width, statistics.fmean(v)) for b, v in sorted(curve_points.items())]
    y_max = max([c for _, c in curve] + [r for _, r in measured] + [r for _, r in requests] + [0.0])
    plot = _Plot(
        "Decode speed against context depth", "context depth (tokens)", "tok/s", (0.0, x_max * 1.02), y_max
    )
    low, high = REALISTIC_BAND
    plot.band([(x, c * low, c * high) for x, c in curve], "band")
    plot.line(curve, "ceiling")
    plot.dots([(float(c), r) for c, r in measured], "rate-dot", radius=2.0)
    plot.dots([(float(c), r) for c, r in requests], "request", radius=3.5)
    plot.legend([("rate", "decode tok/s"), ("ceiling", "ceiling (recorded)"), ("band", "realistic 60–75 %"),
                 ("request", "finished requests")])  # fmt: skip
    return plot.svg()


# --------------------------------------------------------------------------- page


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 24px auto;
       max-width: 820px; padding: 0 12px; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px; }
.sub { color: #5b6475; margin-top: 0; }
table { border-collapse: collapse; width: 100%; margin: 8px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6ec; vertical-align: top; }
th { color: #5b6475; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.plot { max-width: 100%; height: auto; background: #fff; border: 1px solid #e3e6ec; border-radius: 6px;
        margin: 8px 0; }
.plot .grid { stroke: #eef0f4; } .plot .axis { stroke: #8a93a3; }
.plot .tick, .plot .legend { font-size: 11px; fill: #5b6475; }
.plot .label { font-size: 12px; fill: #3b4353; }
.plot .title { font-size: 13px; font-weight: 600; fill: #1d2330; }
.plot .rate { fill: none; stroke: #2563eb; stroke-width: 1.8; } .plot circle.rate { fill: #2563eb; }
.plot .rate-dot, .plot rect.rate { fill: #2563eb; fill-opacity: .55; stroke: none; }
.plot .ceiling { fill: none; stroke: #111827; stroke-width: 1.5; stroke-dasharray: 6 4; }
.plot rect.ceiling { fill: #111827; stroke: none; }
.plot .band { fill: #16a34a; fill-opacity: .16; stroke: none; }
.plot .request { fill: #ea580c; stroke: #fff; stroke-width: 1; }
.alert { border-left: 4px solid #d97706; background: #fffbeb; padding: 8px 12px; margin: 10px 0;
         border-radius: 4px; }
.alert.critical { border-color: #dc2626; background: #fef2f2; }
.alert.info { border-color: #2563eb; background: #eff6ff; }
.alert .kind { font-weight: 700; } .alert .when, .evidence { color: #5b6475; font-size: 12px; }
.none { color: #5b6475; font-style: italic; }
footer { color: #8a93a3; font-size: 12px; margin-top: 32px; }
"""


def _table(rows: Sequence[tuple[str, str]]) -> str:
    body = "\n".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table>\n{body}\n</table>"


def _session_table(s: SessionRecord, samples: Sequence[_Sample], ttft_estimated: bool = False) -> str:
    """`ttft_estimated`: a TTFT behind the mean was not timed by the server (shown with "~")."""
    rates = [x.decode_tok_s for x in samples if x.decode_tok_s is not None]
    median = statistics.median(rates) if rates else None
    efficiency = s.mean_decode_tok_s / s.ceiling_tok_s if s.mean_decode_tok_s and s.ceiling_tok_s else None
    duration = None if s.ended_wall_s is None else s.ended_wall_s - s.started_wall_s
    return _table(
        [
            ("Session", f"<code>{_e(s.id)}</code>"),
            ("Model", _e(s.model)),
            ("Quantization", _num(s.quantization)),
            ("Server", f"{_e(s.server_kind)} {_e(s.server_version or '')} — {_e(s.server)}"),
            ("Hardware", _num(s.hardware)),
            ("Started", _utc(s.started_wall_s)),
            ("Duration", _duration(duration)),
            ("Requests", _num(s.requests)),
            ("Decoded tokens", _num(s.decode_tokens)),
            (
                "Decode, mean / peak",
                f"{_num(s.mean_decode_tok_s, 'tok/s')} / {_num(s.peak_decode_tok_s, 'tok/s')}",
            ),
            ("Decode, median of samples", _num(median, "tok/s")),
            ("Prompt processing, mean", _num(s.mean_prompt_tok_s, "tok/s")),
            (
                "Time to first token, mean",
                _approx(s.mean_ttft_s, ttft_estimated) + _num(s.mean_ttft_s, "s", 3),
            ),
            ("Deepest context", _num(s.max_context_tokens, "tokens")),
            ("Ceiling (empty context)", _num(s.ceiling_tok_s, "tok/s")),
            ("Share of the ceiling", _pct(efficiency)),
            ("Share in GPU memory", _pct(s.gpu_fraction)),
            ("Alerts raised", _e(", ".join(s.alerts)) if s.alerts else "none"),
        ]
    )


def _hardware_table(hw: dict[str, object] | None) -> str:
    if hw is None:
        return '<p class="none">No hardware snapshot recorded.</p>'

    def pair(used: str, total: str) -> str:
        return f"{_gb(hw.get(used))} / {_gb(hw.get(total))}"

    def rate(key: str, source: str, digits: int) -> str:
        return f"{_num(hw.get(key), 'GB/s', digits)} ({_e(hw.get(source) or '—')})"

    recorded = hw.get("t_wall_s")
    return _table(
        [
            ("GPU", _e(hw.get("gpu_names")) or f"none ({_e(hw.get('gpu_reason') or 'no GPU found')})"),
            ("VRAM used / total", pair("vram_used_bytes", "vram_total_bytes")),
            ("GPU memory bandwidth", rate("gpu_bandwidth_gbps", "gpu_bandwidth_source", 0)),
            ("RAM available / total", pair("ram_available_bytes", "ram_total_bytes")),
            ("RAM bandwidth", rate("ram_bandwidth_gbps", "ram_bandwidth_source", 1)),
            ("Recorded", _utc(float(recorded)) if isinstance(recorded, (int, float)) else "—"),
        ]
    )


def _alerts_html(alerts: Sequence[dict[str, object]]) -> str:
    if not alerts:
        return '<p class="none">No alerts during this session.</p>'
    parts = []
    for a in alerts:
        evidence = a.get("evidence")
        evidence_text = (
            ", ".join(f"{k} = {v}" for k, v in evidence.items()) if isinstance(evidence, dict) else ""
        )
        started, ended = a.get("started_wall_s"), a.get("ended_wall_s")
        since = _utc(float(started)) if isinstance(started, (int, float)) else "—"
        until = _utc(float(ended)) if isinstance(ended, (int, float)) else "still active"
        cause = f"<div><b>Cause:</b> {_e(a.get('cause'))}</div>" if a.get("cause") else ""
        severity = _e(a.get("severity"))
        parts.append(
            f'<div class="alert {severity}">'
            f'<div><span class="kind">{_e(a.get("kind"))}</span> ({severity}) — {_e(a.get("model"))} '
            f'<span class="when">{since} → {until}</span></div>'
            f"<div>{_e(a.get('message'))}</div>{cause}"
            f"<div><b>Fix:</b> {_e(a.get('fix'))}</div>"
            f'<div class="evidence">Evidence: {_e(evidence_text) or "—"}</div></div>'
        )
    return "\n".join(parts)


def _recent_table(sessions: Sequence[SessionRecord], current: str) -> str:
    if len(sessions) < 2:
        return '<p class="none">No other sessions of this model recorded.</p>'
    head = ("<tr><th>Session</th><th>Started</th><th>Server version</th><th>Quant</th>"
            "<th>Mean tok/s</th><th>% of ceiling</th><th>Deepest context</th></tr>")  # fmt: skip
    rows = []
    for s in sessions:
        share = s.mean_decode_tok_s / s.ceiling_tok_s if s.mean_decode_tok_s and s.ceiling_tok_s else None
        mark = " (this one)" if s.id == current else ""
        rows.append(
            f"<tr><td><code>{_e(s.id)}</code>{mark}</td><td>{_utc(s.started_wall_s)}</td>"
            f"<td>{_e(s.server_version or '—')}</td><td>{_e(s.quantization or '—')}</td>"
            f'<td class="num">{_num(s.mean_decode_tok_s)}</td><td class="num">{_pct(share)}</td>'
            f'<td class="num">{_num(s.max_context_tokens)}</td></tr>'
        )
    return f"<table>\n{head}\n" + "\n".join(rows) + "\n</table>"


def _pick_session(store: Store, session_id: str | None) -> SessionRecord:
    if session_id is not None:
        found = store.sessions(session_id=session_id)
        if not found:
            raise ReportError(f"unknown session {session_id!r} (see `llm-tray sessions`)")
        return found[0]
    latest = store.sessions(last_n=1)
    if not latest:
        raise ReportError(f"no sessions recorded yet in {store.path}")
    return latest[0]


def render_report(store: Store, *, session_id: str | None = None, now_wall_s: float | None = None) -> str:
    """The report page for `session_id` (default: the latest session) as an HTML string."""
    s = _pick_session(store, session_id)
    samples = [
        _Sample(_float(r["t_wall_s"]) or 0.0, _float(r["decode_tok_s"]), _float(r["ceiling_tok_s"]),
                _int(r["context_tokens"]))
        for r in store.iter_rows("samples", session_ids=[s.id])
    ]  # fmt: skip
    requests: list[tuple[float, float, int | None]] = []
    ttft_estimated = False  # a request TTFT the server did not time
    for r in store.iter_rows("requests", session_ids=[s.id]):
        if r["ttft_s"] is not None and not r["exact"]:
            ttft_estimated = True
        if (rate := _float(r["decode_tok_s"])) is not None:
            requests.append((_float(r["finished_wall_s"]) or 0.0, rate, _int(r["context_tokens"])))
    end = s.ended_wall_s
    alerts = store.alerts_between(s.started_wall_s, end, server=s.server, model=s.model)
    hardware = store.hardware_at(s.started_wall_s)
    same_model = [x for x in store.sessions(last_n=200) if x.model == s.model][-10:]
    if all(x.id != s.id for x in same_model):
        same_model.append(s)

    if samples or requests:
        time_svg = _time_plot(samples, [(t, r) for t, r, _ in requests], s.started_wall_s)
        context_svg = _context_plot(samples, [(c, r) for _, r, c in requests if c is not None])
        plots = f"{time_svg}\n{context_svg}"
    else:
        plots = '<p class="none">No samples or requests recorded for this session.</p>'
    generated = _utc(now_wall_s if now_wall_s is not None else datetime.now(tz=timezone.utc).timestamp())
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llm-tray report — {_e(s.model)} ({_e(s.id)})</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(s.model)} on {_e(s.server_kind)}</h1>
<p class="sub">Session <code>{_e(s.id)}</code>, {_utc(s.started_wall_s)}, {
        _duration(None if end is None else end - s.started_wall_s)
    }</p>
<h2>Session</h2>
{_session_table(s, samples, ttft_estimated)}
<h2>Plots</h2>
<p class="sub">The ceiling is memory bandwidth ÷ bytes read per token at the live context and offload
split; a healthy GPU decode sits in the realistic band (60–75 % of it). On CPUs the ceiling is an
upper bound, not a prediction.</p>
{plots}
<h2>Alerts</h2>
{_alerts_html(alerts)}
<h2>Hardware</h2>
{_hardware_table(hardware)}
<h2>Recent sessions of this model</h2>
{_recent_table(same_model, s.id)}
<footer>Generated by llm-tray {_e(__version__)} on {generated}. Metrics only: no prompt or completion
text is ever recorded.</footer>
</body>
</html>
"""


def write_report(store: Store, path: Path | str, *, session_id: str | None = None) -> Path:
    """Write the report of `session_id` (default: the latest session) to `path`; returns the path."""
    target = Path(path)
    text = render_report(store, session_id=session_id)
    part = target.with_name(f".{target.name}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, target)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise
    return target
