"""`llm-tray report`: a self-contained one-page HTML summary of a session.

No external assets and no script: inline CSS and SVG plots (`report_svg.py`: decode
tok/s over time against the ceiling and the realistic band; decode tok/s against context
depth with the ceiling curve the samples recorded), the hardware, and the alerts
with cause and fix. Every string from the store goes through `html.escape`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from trayapp import __version__
from trayapp.config.files import atomic_write_text
from trayapp.core.client_usage import UNNAMED, client_usage, client_usage_rows
from trayapp.core.energy_summary import EnergyTotals, energy_by_day, energy_text, energy_totals
from trayapp.core.model import SessionRecord
from trayapp.core.units import as_float, format_gb
from trayapp.core.vram_holders import holders_from_evidence, holders_text
from trayapp.sinks.report_svg import PlotSample, context_plot, time_plot
from trayapp.sinks.report_svg import escape_html as _e
from trayapp.sinks.store import Store


class ReportError(ValueError):
    """No session to report on (unknown id, or nothing recorded yet)."""


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
    return format_gb(value if isinstance(value, (int, float)) else None)


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
.alert pre.fix { background: #fff; border: 1px solid #e5e7eb; padding: 6px 8px; margin: 4px 0 0;
                 white-space: pre-wrap; font-size: 12px; }
.none { color: #5b6475; font-style: italic; }
footer { color: #8a93a3; font-size: 12px; margin-top: 32px; }
"""


def _table(rows: Sequence[tuple[str, str]]) -> str:
    body = "\n".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table>\n{body}\n</table>"


def _session_table(s: SessionRecord, samples: Sequence[PlotSample], ttft_estimated: bool = False) -> str:
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


def _bench_note(windows: Sequence[tuple[float, float]]) -> str:
    if not windows:
        return ""
    spans = ", ".join(f"{_utc(a)} – {_utc(b)}" for a, b in windows)
    return (
        f'<p class="sub">A bench ran during this session ({_e(spans)}): its requests are left out of '
        "the figures and plots below (see <code>llm-tray sessions --bench</code>).</p>\n"
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


def fix_commands(stored: object) -> list[str]:
    """An alert's fix commands from its stored JSON list (`alerts.fix_commands_json`); [] for none,
    a row from before they were kept, or a value that is not a list of strings."""
    if not isinstance(stored, str) or not stored:
        return []
    try:
        value = json.loads(stored)
    except ValueError:
        return []
    return [c for c in value if isinstance(c, str)] if isinstance(value, list) else []


def _commands_html(stored: object) -> str:
    """The fix's commands, one per line, to copy (llm-tray never ran them)."""
    commands = fix_commands(stored)
    if not commands:
        return ""
    lines = "\n".join(commands)
    return f'<pre class="fix">{_e(lines)}</pre>'


def _evidence_text(evidence: object) -> str:
    """'cpu_share = 0.4, vram_holders = python (pid 4121) 5.8 GB, Xorg 0.2 GB, …' (the holders as words)."""
    if not isinstance(evidence, dict):
        return ""
    return ", ".join(
        f"{k} = {holders_text(holders_from_evidence(evidence), 5) if k == 'vram_holders' else v}"
        for k, v in evidence.items()
    )


def _alerts_html(alerts: Sequence[dict[str, object]]) -> str:
    if not alerts:
        return '<p class="none">No alerts during this session.</p>'
    parts = []
    for a in alerts:
        evidence_text = _evidence_text(a.get("evidence"))
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
            f"<div><b>Fix:</b> {_e(a.get('fix'))}</div>{_commands_html(a.get('fix_commands_json'))}"
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


def _bench_windows(store: Store, s: SessionRecord) -> list[tuple[float, float]]:
    """When a stored bench of the session's model ran during the session: (started, finished)."""
    end = s.ended_wall_s if s.ended_wall_s is not None else math.inf
    windows = {
        (as_float(r["started_wall_s"]) or 0.0, as_float(r["finished_wall_s"]) or 0.0)
        for r in store.iter_rows("bench", since_wall_s=s.started_wall_s - 86400)
        if r["model"] == s.model and (s.hardware is None or r["hardware"] == s.hardware)
    }
    return sorted(w for w in windows if w[0] <= end and w[1] >= s.started_wall_s)


def _in_windows(t_wall_s: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= t_wall_s <= end for start, end in windows)


def _without_bench(
    s: SessionRecord, samples: Sequence[PlotSample], requests: Sequence[dict[str, object]]
) -> SessionRecord:
    """The session's decode figures from what was left once the bench's own traffic was taken out."""
    rates = [x.decode_tok_s for x in samples if x.decode_tok_s is not None]
    exact = [r for r in requests if r["exact"] and as_float(r["decode_tok_s"]) is not None]
    request_rates = [
        as_float(r["decode_tok_s"]) or 0.0 for r in requests if as_float(r["decode_tok_s"]) is not None
    ]
    mean = statistics.mean(rates) if rates else (statistics.mean(request_rates) if request_rates else None)
    peaks = rates + [as_float(r["decode_tok_s"]) or 0.0 for r in exact]
    return replace(
        s,
        requests=len(requests),
        decode_tokens=sum(_int(r["decode_tokens"]) or 0 for r in requests),
        mean_decode_tok_s=mean,
        peak_decode_tok_s=max(peaks) if peaks else None,
    )


def render_report(store: Store, *, session_id: str | None = None, now_wall_s: float | None = None) -> str:
    """The report page for `session_id` (default: the latest session) as an HTML string. A bench
    that ran during the session (its requests went through the same server) is left out of the
    session's decode figures and plots, and the page says so."""
    s = _pick_session(store, session_id)
    benches = _bench_windows(store, s)
    samples = [
        PlotSample(as_float(r["t_wall_s"]) or 0.0, as_float(r["decode_tok_s"]), as_float(r["ceiling_tok_s"]),
                _int(r["context_tokens"]))
        for r in store.iter_rows("samples", session_ids=[s.id])
        if not _in_windows(as_float(r["t_wall_s"]) or 0.0, benches)
    ]  # fmt: skip
    request_rows = [
        r
        for r in store.iter_rows("requests", session_ids=[s.id])
        if not _in_windows(as_float(r["finished_wall_s"]) or 0.0, benches)
    ]
    if benches:
        s = _without_bench(s, samples, request_rows)
    energy = energy_text(energy_totals(request_rows))
    week = energy_by_day(store.iter_rows("requests", since_wall_s=s.started_wall_s - 6 * 86400))
    requests: list[tuple[float, float, int | None]] = []
    ttft_estimated = False  # a request TTFT the server did not time
    for r in request_rows:
        if r["ttft_s"] is not None and not r["exact"]:
            ttft_estimated = True
        if (rate := as_float(r["decode_tok_s"])) is not None:
            requests.append((as_float(r["finished_wall_s"]) or 0.0, rate, _int(r["context_tokens"])))
    end = s.ended_wall_s
    alerts = store.alerts_between(s.started_wall_s, end, server=s.server, model=s.model)
    hardware = store.hardware_at(s.started_wall_s)
    same_model = [x for x in store.sessions(last_n=200) if x.model == s.model][-10:]
    if all(x.id != s.id for x in same_model):
        same_model.append(s)

    if samples or requests:
        time_svg = time_plot(samples, [(t, r) for t, r, _ in requests], s.started_wall_s)
        context_svg = context_plot(samples, [(c, r) for _, r, c in requests if c is not None])
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
{_bench_note(benches)}{_session_table(s, samples, ttft_estimated)}
{_energy_html(energy, week)}
{_clients_html(request_rows)}
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


def _clients_html(request_rows: Sequence[dict[str, object]]) -> str:
    """Who used the server in this session: requests per client (the proxy names them), with the
    server's time on them and their wait for a slot; nothing when no request went through a proxy."""
    usage = client_usage(request_rows)
    if all(u.client == UNNAMED for u in usage):
        return ""
    header, *rows = client_usage_rows(usage)
    head = "".join(f"<th>{_e(cell)}</th>" for cell in header)
    body = "\n".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return (
        '<h2>Clients</h2>\n<p class="sub">Requests per client, as the recording proxy saw them (the '
        "process on this machine, else its User-Agent); waits are for a slot, before the server read the "
        f"prompt.</p>\n<table>\n<tr>{head}</tr>\n{body}\n</table>"
    )


def _energy_html(session_text: str, days: Sequence[tuple[str, EnergyTotals]]) -> str:
    """The session's energy and the last days' watt-hours (above the idle draw, measured requests only)."""
    rows = [("This session", _e(session_text))]
    rows += [(f"{day} (UTC)", _e(energy_text(totals))) for day, totals in days]
    return (
        '<h2>Energy</h2>\n<p class="sub">Energy above the idle draw, over each request\'s prefill and '
        "decode (RAPL, NVML or macmon; ~: power × time).</p>\n" + _table(rows)
    )


def write_report(store: Store, path: Path | str, *, session_id: str | None = None) -> Path:
    """Write the report of `session_id` (default: the latest session) to `path`; returns the path."""
    target = Path(path)
    text = render_report(store, session_id=session_id)
    atomic_write_text(target, text)
    return target
