"""One fact, one place (#9): every view quotes the same ceiling, the floor moves with the user's
setting, and impossible server sizes give an unknown placement.

The expected ceilings are hand arithmetic from DOMAIN.md §2 (decode time = bytes on each memory ÷
that memory's bandwidth, the times add up), for a model that reads 5.0 GB per token (no KV layout,
so the context depth does not change the bytes):

* unified memory, 546 GB/s (an M4 Max, one memory for "GPU" and "CPU"):   546 / 5.0 = 109.2 tok/s,
  whatever share the server says is "on the GPU".
* split, RTX 4090 at 1008 GB/s + RAM at 50 GB/s, half the model on each:
  2.5 / 1008 + 2.5 / 50 = 0.0024802 + 0.05 = 0.0524802 s  →  19.055 tok/s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.support.metrics import scrape
from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, HostReading
from trayapp.core.jsonview import snapshot_json
from trayapp.core.machine import resolve_machine
from trayapp.core.model import (
    CounterReading,
    FinishedRequest,
    ModelFacts,
    ModelReading,
    ServerReading,
    Snapshot,
)
from trayapp.core.pipeline import Pipeline, TickOutput
from trayapp.core.thresholds import Thresholds
from trayapp.sinks.metrics import MetricsState
from trayapp.sinks.store import Store
from trayapp.ui.dashboard import Dashboard

URL = "http://127.0.0.1:11434"
MODEL = "qwen3:14b"
WALL0 = 1_750_000_000.0
GB = 1_000_000_000
FACTS = ModelFacts(weights_bytes=5 * GB, bytes_per_token=5 * GB, exact=True, source="test")

UNIFIED = HardwareSnapshot(
    gpus=(GpuReading(0, "Apple M4 Max", "apple", 48 * GB, 20 * GB, 546.0, "spec", unified_memory=True),),
    host=HostReading(48 * GB, 20 * GB, None),
)
SPLIT = HardwareSnapshot(
    gpus=(GpuReading(0, "NVIDIA GeForce RTX 4090", "nvidia", 24 * GB, 23 * GB, 1008.0, "spec"),),
    host=HostReading(64 * GB, 30 * GB, 50.0, "measured"),
)
CPU_ONLY = HardwareSnapshot(gpus=(), host=HostReading(64 * GB, 30 * GB, 50.0, "measured"))
UNIFIED_CEILING_TOK_S = 546 / 5.0
SPLIT_CEILING_TOK_S = 1 / (2.5 / 1008 + 2.5 / 50)


def ollama_reading(size_bytes: int, vram_bytes: int, t_wall_s: float, finished: bool) -> ServerReading:
    model = ModelReading(
        name=MODEL, size_bytes=size_bytes, vram_bytes=vram_bytes, context_length=8192, facts=FACTS, busy=True
    )
    done = (
        FinishedRequest(
            model=MODEL,
            finished_wall_s=t_wall_s,
            prompt_tokens=200,
            decode_tokens=100,
            decode_tok_s=15.0,
            context_tokens=1200,
        ),
    )
    return ServerReading(
        kind="ollama",
        url=URL,
        status="ok",
        version="0.32.15",
        models=(model,),
        finished=done if finished else (),
    )


def run(hardware: HardwareSnapshot, size_bytes: int, vram_bytes: int) -> list[TickOutput]:
    pipeline = Pipeline()
    machine = resolve_machine(hardware)
    return [
        pipeline.process(
            [ollama_reading(size_bytes, vram_bytes, WALL0 + t, finished=t == 2)],
            hardware,
            {},
            machine,
            float(t),
            WALL0 + t,
        )
        for t in range(1, 4)
    ]


@pytest.mark.parametrize(
    ("hardware", "vram_share", "expected_tok_s"),
    [(UNIFIED, 0.7, UNIFIED_CEILING_TOK_S), (SPLIT, 0.5, SPLIT_CEILING_TOK_S)],
    ids=["unified-memory", "split-gpu-ram"],
)
def test_every_view_quotes_the_same_ceiling(
    qtbot: QtBot, tmp_path: Path, hardware: HardwareSnapshot, vram_share: float, expected_tok_s: float
) -> None:
    size = 10 * GB
    outputs = run(hardware, size, round(size * vram_share))
    last: Snapshot = outputs[-1].snapshot

    # the JSON of `status --json` / `watch --json`
    document = json.loads(json.dumps(snapshot_json(last)))
    assert document["servers"][0]["models"][0]["ceiling_tok_s"] == pytest.approx(expected_tok_s, abs=0.01)

    # the stored request and session rows (a real SQLite file)
    with Store(tmp_path / "store.db") as store:
        for output in outputs:
            store.record(output.snapshot, output.sessions)
        requests = list(store.iter_rows("requests"))
        sessions = store.sessions()
    assert len(requests) == 1 and requests[0]["ceiling_tok_s"] == pytest.approx(expected_tok_s, rel=1e-6)
    assert len(sessions) == 1 and sessions[0].ceiling_tok_s == pytest.approx(expected_tok_s, rel=1e-6)

    # the Prometheus exporter
    state = MetricsState()
    state.observe(last)
    samples = scrape(state)["llm_tray_ceiling_tokens_per_second"]
    assert [v for labels, v in samples if labels.get("model") == MODEL] == [pytest.approx(expected_tok_s)]

    # the dashboard's ceiling line
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.show()
    qtbot.waitExposed(dash)
    for output in outputs:
        dash.update_snapshot(output.snapshot)
    assert dash.time_plot.ceiling_line.value() == pytest.approx(expected_tok_s)


def test_a_user_floor_moves_the_dashboard_line_and_the_below_floor_alert_together(qtbot: QtBot) -> None:
    """Floor 5 tok/s: a steady 4 tok/s decode (a vLLM-style live token counter, +4 per second, on a
    CPU-only machine) is below it; the default floor of 3 calls the same run fine."""
    floor = Thresholds(below_floor_tok_s=5.0, confirm_s=2.0)
    machine = resolve_machine(CPU_ONLY)
    snapshots: dict[float, Snapshot] = {}
    for thresholds in (Thresholds(confirm_s=2.0), floor):
        pipeline = Pipeline(thresholds)
        for t in range(1, 8):
            model = ModelReading(
                name=MODEL,
                facts=FACTS,
                counters=CounterReading(tokens_predicted_total=4.0 * t, requests_running=1.0),
            )
            reading = ServerReading(kind="vllm", url=URL, status="ok", models=(model,))
            snapshots[thresholds.below_floor_tok_s] = pipeline.process(
                [reading], CPU_ONLY, {}, machine, float(t), WALL0 + t
            ).snapshot
    assert snapshots[5.0].servers[0].models[0].decode_tok_s == pytest.approx(4.0)
    assert {a.kind for a in snapshots[3.0].alerts} == set()
    assert [a.kind for a in snapshots[5.0].alerts] == ["below_floor"]
    assert snapshots[5.0].alerts[0].evidence["floor_tok_s"] == 5.0

    dash = Dashboard(thresholds=floor)
    qtbot.addWidget(dash)
    dash.show()
    qtbot.waitExposed(dash)
    dash.update_snapshot(snapshots[5.0])
    assert dash.time_plot.floor_line.value() == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("size_bytes", "vram_bytes"), [(10 * GB, 12 * GB), (0, 4 * GB)], ids=["vram-above-size", "size-zero"]
)
def test_impossible_ollama_sizes_give_an_unknown_placement(size_bytes: int, vram_bytes: int) -> None:
    """`ollama ps` shows such a model as unknown: neither 100 % GPU nor an offload."""
    snapshot = run(SPLIT, size_bytes, vram_bytes)[-1].snapshot
    status = snapshot.servers[0].models[0]
    assert status.gpu_fraction is None and status.gpu_fraction_source is None
    assert "offload" not in {a.kind for a in snapshot.alerts}
