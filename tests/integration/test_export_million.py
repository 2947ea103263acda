"""Exporting a store of one million samples streams: bounded memory, while the monitor keeps writing."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.model import ModelStatus, ServerStatus, Snapshot
from trayapp.sinks.store import Store

REPO = Path(__file__).resolve().parents[2]
ROWS = 1_000_000
T0 = 1_750_000_000.0
MAX_GROWTH_BYTES = 64 * 2**20  # loading every row would take well over 500 MB

_INSERT = (
    "INSERT INTO samples (t_wall_s, session_id, server, server_kind, model, phase, decode_tok_s, "
    "decode_total_tok_s, active_streams, decode_exact, prompt_tok_s, ttft_s, context_tokens, context_length, "
    "ceiling_tok_s, full_gpu_ceiling_tok_s, gpu_fraction, vram_bytes, draft_acceptance) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

# The child measures its own peak RSS (getrusage) around the export: only the export's growth counts.
_CHILD = """
import json, resource, sys
from trayapp.sinks.export import export
from trayapp.sinks.store import Store
scale = 1 if sys.platform == "darwin" else 1024
store = Store(sys.argv[1], writer=False)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
result = export(store, table="samples", fmt="csv", out=sys.argv[2])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
print(json.dumps({"rows": result.rows, "before": before, "after": after}))
"""


def _rows() -> Iterator[tuple[object, ...]]:
    for i in range(ROWS):
        rate = 60.0 + (i % 400) * 0.05
        yield (
            T0 + i, f"s{i // 10_000:03d}", "http://127.0.0.1:8080", "llamacpp", "gemma3:270m", "decoding",
            rate, rate, 1, i % 2, 300.5, 0.015, 100 + i % 8000, 8192, 217.5, 217.5, 0.0, None, None,
        )  # fmt: skip


def _tick(t: float) -> Snapshot:
    model = ModelStatus(
        name="live", phase="decoding", decode_tok_s=80.0, context_tokens=10, session_id="live"
    )
    server = ServerStatus(kind="llamacpp", url="http://127.0.0.1:8080", status="ok", models=(model,))
    hardware = HardwareSnapshot(gpus=(), host=HostReading(None, None, None))
    return Snapshot(t_wall_s=t, t_mono_s=t, servers=(server,), hardware=hardware)


def test_a_million_samples_export_in_bounded_memory_while_the_monitor_records(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    Store(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(_INSERT, _rows())  # one transaction, rows generated on the fly
    conn.execute("COMMIT")
    conn.close()

    out = tmp_path / "samples.csv"
    errors: list[str] = []
    ticks = 0
    with Store(db) as monitor, subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db), str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as child:  # fmt: skip
        deadline = time.monotonic() + 600
        while child.poll() is None and time.monotonic() < deadline:  # bounded by the deadline
            error = monitor.record(_tick(T0 + ROWS + ticks))
            if error:
                errors.append(error)
            ticks += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.02)  # paces the ticks; returns early when the export ends
        if child.poll() is None:
            child.kill()
        stdout, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    result = json.loads(stdout.strip().splitlines()[-1])

    assert errors == [] and ticks > 10  # the monitor kept recording during the export
    assert (
        result["rows"] >= ROWS
    )  # a consistent snapshot: the million, plus any tick committed before it began
    growth = result["after"] - result["before"]
    assert growth < MAX_GROWTH_BYTES, f"export grew RSS by {growth / 2**20:.0f} MiB"

    lines = 0
    first = last = ""
    with open(out, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split(",")
        for line in f:  # streamed: never the whole file in memory here either
            if lines == 0:
                first = line
            last = line
            lines += 1
    assert lines == result["rows"]
    row0 = dict(zip(header, first.rstrip("\n").split(","), strict=True))
    assert (
        float(row0["t_wall_s"]) == T0 and float(row0["decode_tok_s"]) == 60.0 and row0["session_id"] == "s000"
    )
    assert row0["time_utc"] == "2025-06-15T15:06:40.000Z"
    row_n = dict(zip(header, last.rstrip("\n").split(","), strict=True))
    assert float(row_n["t_wall_s"]) >= T0 + ROWS - 1
