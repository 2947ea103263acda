"""The HTML report, from a real SQLite store: session, hardware, SVG plots, alerts, escaping."""

from __future__ import annotations

import argparse
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support import store_records
from tests.support.snapshots import hardware_snapshot, rtx4090
from tests.support.store_records import T0, bench_result, snapshot, sweep_point
from trayapp.cli import logs
from trayapp.config import paths
from trayapp.core.model import (
    Alert,
    ModelStatus,
    RequestRecord,
    SessionRecord,
    Snapshot,
)
from trayapp.sinks.report import ReportError, render_report, write_report
from trayapp.sinks.store import Store

URL = "http://127.0.0.1:11434"
HOSTILE = '<script>alert("x")</script>'
HARDWARE = hardware_snapshot(rtx4090(bandwidth_source="nvml"), ram_bandwidth_source="measured")


def tick(
    t: float,
    name: str,
    sid: str,
    i: int,
    *,
    alerts: tuple[Alert, ...] = (),
    ended: tuple[Alert, ...] = (),
    requests: tuple[RequestRecord, ...] = (),
) -> Snapshot:
    model = ModelStatus(
        name=name,
        phase="decoding",
        decode_tok_s=90.0 - i * 0.1,
        decode_total_tok_s=90.0 - i * 0.1,
        active_streams=1,
        context_tokens=200 + 40 * i,
        context_length=32768,
        ceiling_tok_s=130.0 - i * 0.05,
        gpu_fraction=1.0,
        session_id=sid,
    )
    return snapshot(t, (model,), url=URL, alerts=alerts, ended=ended, requests=requests, hardware=HARDWARE)


def session(sid: str, name: str, start: float, end: float | None) -> SessionRecord:
    """`name`'s session on Ollama at URL (store_records.session(): 0.30.1, Q4_K_M, an RTX 4090)."""
    return store_records.session(
        sid,
        model=name,
        started_wall_s=start,
        ended_wall_s=end,
        requests=2,
        decode_tokens=700,
        mean_decode_tok_s=85.0,
        peak_decode_tok_s=90.0,
        mean_prompt_tok_s=1500.0,
        mean_ttft_s=0.21,
        max_context_tokens=4200,
        alerts=("kv_slowdown",),
    )


def kv_alert(**kw: object) -> Alert:
    values: dict[str, object] = {
        "id": "kv-1",
        "kind": "kv_slowdown",
        "severity": "warning",
        "server": URL,
        "model": HOSTILE,
        "message": "decode fell 24 % as the context grew to 4200 tokens <b>",
        "fix": "quantize the KV cache (OLLAMA_KV_CACHE_TYPE=q8_0) & keep chats short",
        "since_wall_s": T0 + 60,
        "evidence": {"drop_pct": 24.0, "explained_pct": 70.0},
        "cause": "KV-cache reads grow with context",
        "peak": 24.0,
    }
    values.update(kw)
    return Alert(**values)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        # An older session of another model, then the hostile one with an alert and requests.
        store.record(tick(T0 - 1000, "llama3", "old", 0), [session("old", "llama3", T0 - 1000, T0 - 900)])
        for i in range(100):
            alerts = (kv_alert(),) if 60 <= i < 90 else ()
            ended = (kv_alert(ended_wall_s=T0 + 90),) if i == 90 else ()
            requests: tuple[RequestRecord, ...] = ()
            if i in (40, 80):
                requests = (
                    RequestRecord(URL, "ollama", HOSTILE, T0 + i, "evil", True, context_tokens=200 + 40 * i,
                                  decode_tok_s=88.0 - i * 0.1, decode_tokens=350),
                )  # fmt: skip
            store.record(tick(T0 + i, HOSTILE, "evil", i, alerts=alerts, ended=ended, requests=requests))
        store.record(tick(T0 + 100, HOSTILE, "evil", 100), [session("evil", HOSTILE, T0, T0 + 100)])
    return path


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += attrs


def test_the_report_shows_the_latest_session_with_plots_alerts_and_hardware(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    with Store(db, writer=False) as store:
        assert write_report(store, out) == out
    page = out.read_text(encoding="utf-8")
    parsed = _Collect()
    parsed.feed(page)

    assert page.startswith("<!DOCTYPE html>")
    assert "<code>evil</code>" in page and "0.30.1" in page and "Q4_K_M" in page
    assert "85.0 tok/s" in page and "65 %" in page  # mean rate and its share of the 130 tok/s ceiling
    # Two inline SVG plots with a rate line, a ceiling line, the realistic band and request dots.
    assert parsed.tags.count("svg") == 2
    assert page.count('<polyline class="rate"') >= 1 and page.count('<polyline class="ceiling"') == 2
    assert page.count('<polygon class="band"') == 2
    assert page.count('<circle class="request"') == 4  # two requests, in both plots
    assert page.count('<circle class="rate-dot"') == 101  # every decoding sample against its context
    # The alert with cause and fix; the hardware.
    assert "kv_slowdown" in page and "KV-cache reads grow with context" in page
    assert "OLLAMA_KV_CACHE_TYPE=q8_0) &amp; keep chats short" in page
    assert "drop_pct = 24.0" in page
    assert (
        "NVIDIA GeForce RTX 4090" in page and "1,008 GB/s (nvml)" in page and "54.0 GB/s (measured)" in page
    )
    # Self-contained: no scripts, no external resources.
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    urls = [v for k, v in parsed.attrs if k in ("src", "href") and v]
    assert urls == []
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg|127\.0\.0\.1)", page)


def test_a_mean_ttft_from_an_estimated_request_is_marked_with_a_tilde(db: Path, tmp_path: Path) -> None:
    with Store(db, writer=False) as store:
        assert "<td>0.210 s</td>" in render_report(store)  # server-timed requests only: no "~"
    path = tmp_path / "estimated.sqlite3"
    with Store(path) as store:
        estimated = RequestRecord(URL, "ollama", "m", T0 + 5, "est", False, ttft_s=0.21, decode_tok_s=80.0)
        store.record(tick(T0 + 5, "m", "est", 0, requests=(estimated,)), [session("est", "m", T0, T0 + 10)])
    with Store(path, writer=False) as store:
        assert "<td>~0.210 s</td>" in render_report(store)


def test_hostile_names_are_escaped_everywhere(db: Path) -> None:
    with Store(db, writer=False) as store:
        page = render_report(store)
    assert HOSTILE not in page and "<script" not in page.lower()
    assert html_escaped(HOSTILE) in page
    assert "tokens &lt;b&gt;" in page  # an alert message cannot inject markup either


def html_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def test_a_chosen_session_and_unknown_or_missing_sessions(db: Path, tmp_path: Path) -> None:
    with Store(db, writer=False) as store:
        page = render_report(store, session_id="old")
        assert "<code>old</code>" in page and "llama3" in page and "No alerts during this session." in page
        with pytest.raises(ReportError, match="unknown session 'nope'"):
            write_report(store, tmp_path / "x.html", session_id="nope")
    assert not (tmp_path / "x.html").exists()
    with (
        Store(tmp_path / "empty.sqlite3", writer=False) as empty,
        pytest.raises(ReportError, match="no sessions"),
    ):
        render_report(empty)


def test_a_long_session_is_averaged_into_a_bounded_plot(tmp_path: Path) -> None:
    path = tmp_path / "long.sqlite3"
    with Store(path) as store:
        for i in range(3000):
            store.record(tick(T0 + i, "m", "long", i % 100))
        store.record(tick(T0 + 3000, "m", "long", 0), [session("long", "m", T0, T0 + 3000)])
    with Store(path, writer=False) as store:
        page = render_report(store)
    (time_plot, _) = page.split("</svg>", 1)
    (rate_line,) = re.findall(r'<polyline class="rate" points="([^"]*)"', time_plot)
    assert 100 < len(rate_line.split()) <= 600
    assert "time since start (min)" in page


def test_cli_report_writes_the_file_or_fails_in_one_line(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copyfile(db, paths.store_file())  # where the CLI looks (LLM_TRAY_HOME is per test)
    parser = argparse.ArgumentParser()
    logs.add_report_arguments(parser)
    out = tmp_path / "r.html"
    assert logs.run_report(parser.parse_args(["--session", "ev", "-o", str(out)])) == 0  # a unique prefix
    assert "<code>evil</code>" in out.read_text(encoding="utf-8")
    assert f"wrote {out}" in capsys.readouterr().err

    assert logs.run_report(parser.parse_args(["--session", "nope", "-o", str(tmp_path / "n.html")])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown session 'nope'" in err
    assert not (tmp_path / "n.html").exists()


def test_a_bench_during_the_session_is_left_out_of_its_figures(tmp_path: Path) -> None:
    """The tray saw a bench's requests as part of the session (150 tok/s during the bench's window
    T0+10 … T0+40, 50 tok/s around it): the report's decode figures are the session's own 50 tok/s,
    and the page says a bench was left out."""
    from dataclasses import replace

    name, sid = "qwen3:8b", "mixed"  # the bench result's model and hardware (store_records.bench_result)
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        times = [*range(0, 10), *range(10, 41), *range(41, 51)]
        for i in times:
            snap = tick(T0 + i, name, sid, 0)
            rate = 150.0 if 10 <= i <= 40 else 50.0
            model = replace(snap.servers[0].models[0], decode_tok_s=rate, decode_total_tok_s=rate)
            store.record(replace(snap, servers=(replace(snap.servers[0], models=(model,)),)))
        mixed = replace(session(sid, name, T0, T0 + 50), mean_decode_tok_s=110.0, peak_decode_tok_s=150.0)
        store.record(tick(T0 + 51, name, "other", 0), [mixed])
        store.record_bench(bench_result(T0 + 10, (sweep_point(0, 60, 150.0, 200.0),)))
        page = render_report(store, session_id=sid)
    assert "A bench ran during this session" in page
    row = re.search(r"Decode, mean / peak</th><td>([^<]*)</td>", page)
    assert row is not None and row.group(1) == "50.0 tok/s / 50.0 tok/s", row and row.group(1)
    median = re.search(r"Decode, median of samples</th><td>([^<]*)</td>", page)
    assert median is not None and median.group(1) == "50.0 tok/s"


def test_the_fix_commands_are_shown_to_copy_and_escaped(tmp_path: Path) -> None:
    """#20: the alert's fix commands (alerts.fix_commands_json) under its fix, one per line, escaped."""
    path = tmp_path / "fix.sqlite3"
    commands = (
        "OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0 ollama serve",
        '"options": {"num_ctx": 8192}',
    )
    alert = kv_alert(model="m", since_wall_s=T0 + 1, fix_commands=(*commands, "<b>"))
    with Store(path) as store:
        store.record(tick(T0, "m", "fix", 0, alerts=(alert,)), [session("fix", "m", T0, T0 + 10)])
    with Store(path, writer=False) as store:
        page = render_report(store)
    lines = "\n".join(html_escaped(c) for c in (*commands, "<b>"))
    assert f'<pre class="fix">{lines}</pre>' in page
    assert "<b>" not in page.split('<pre class="fix">')[1].split("</pre>")[0]


def test_stored_fix_commands_are_read_defensively() -> None:
    from trayapp.sinks.report import fix_commands

    assert fix_commands('["llama-server -c 4096", "x"]') == ["llama-server -c 4096", "x"]
    assert fix_commands(None) == fix_commands("") == fix_commands("not json") == []  # rows before #20
    assert fix_commands('{"a": 1}') == [] and fix_commands('["ok", 3]') == ["ok"]


def test_the_vram_holders_of_an_offload_are_shown_as_words(tmp_path: Path) -> None:
    """#21: the holders kept with an offload episode (its evidence) read as 'python (pid 4121) 5.8 GB'."""
    from dataclasses import replace

    path = tmp_path / "holders.sqlite3"
    holders = [{"pid": 4121, "name": "python", "used_bytes": 5_800_000_000, "gpu_index": 0}]
    alert = replace(
        kv_alert(model="m", since_wall_s=T0 + 1), evidence={"cpu_share": 0.4, "vram_holders": holders}
    )
    with Store(path) as store:
        store.record(tick(T0, "m", "holders", 0, alerts=(alert,)), [session("holders", "m", T0, T0 + 10)])
    with Store(path, writer=False) as store:
        page = render_report(store)
    assert "vram_holders = python (pid 4121) 5.8 GB" in page
