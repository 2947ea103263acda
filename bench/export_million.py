"""Time and peak memory of exporting a store that holds one million samples.

    python bench/export_million.py [--rows 1000000] [--format csv|jsonl|parquet] [--json]

Builds a store in a temporary directory (the real schema, rows inserted with
executemany in one transaction), then exports the samples table in a fresh child
process and reports the child's time and its peak RSS before and after the export
(`resource.getrusage`, so only Linux and macOS). The export streams rows in batches,
so the growth should stay a few MB whatever the row count.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trayapp.sinks.store import Store  # noqa: E402

T0 = 1_750_000_000.0
SESSIONS = 100

_INSERT = (
    "INSERT INTO samples (t_wall_s, session_id, server, server_kind, model, phase, decode_tok_s, "
    "decode_total_tok_s, active_streams, decode_exact, prompt_tok_s, ttft_s, context_tokens, context_length, "
    "ceiling_tok_s, full_gpu_ceiling_tok_s, gpu_fraction, vram_bytes, draft_acceptance) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def sample_row(i: int, rows: int) -> tuple[object, ...]:
    """The i-th synthetic sample: one per second, SESSIONS sessions, numbers that vary."""
    session = i * SESSIONS // rows
    rate = 60.0 + (i % 400) * 0.05
    return (
        T0 + i, f"s{session:03d}", "http://127.0.0.1:8080", "llamacpp", "gemma3:270m", "decoding",
        rate, rate, 1, i % 2, 300.0 + (i % 7), 0.015 + (i % 5) / 1000, 100 + i % 8000, 8192,
        217.5 - (i % 8000) / 100, 217.5, 0.0, None, None,
    )  # fmt: skip


def build_store(path: Path, rows: int) -> float:
    """A store with `rows` samples and their sessions; returns the seconds it took."""
    started = time.perf_counter()
    Store(path).close()  # the real schema
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")

    def generate() -> Iterator[tuple[object, ...]]:
        for i in range(rows):
            yield sample_row(i, rows)

    conn.executemany(_INSERT, generate())
    per_session = rows / SESSIONS
    conn.executemany(
        "INSERT INTO sessions (session_id, server, server_kind, model, started_wall_s, ended_wall_s) "
        "VALUES (?, 'http://127.0.0.1:8080', 'llamacpp', 'gemma3:270m', ?, ?)",
        [(f"s{k:03d}", T0 + k * per_session, T0 + (k + 1) * per_session - 1) for k in range(SESSIONS)],
    )
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - started


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from trayapp.sinks.export import export
from trayapp.sinks.store import Store
scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
store = Store(sys.argv[2], writer=False)
if sys.argv[3] == "parquet":
    import pyarrow.parquet  # its import alone is ~60 MB: count only the export
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
started = time.perf_counter()
result = export(store, table="samples", fmt=sys.argv[3], out=sys.argv[4])
elapsed = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
store.close()
out = {"rows": result.rows, "export_s": elapsed, "rss_before_bytes": before, "rss_peak_bytes": after}
print(json.dumps(out))
"""


def measure_export(store_path: Path, fmt: str, out_path: Path) -> dict[str, float]:
    """Export the samples in a fresh process; its time and peak RSS before/after."""
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, str(REPO), str(store_path), fmt, str(out_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    result["rss_growth_bytes"] = result["rss_peak_bytes"] - result["rss_before_bytes"]
    result["output_bytes"] = out_path.stat().st_size
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("csv", "jsonl", "parquet"), default="csv")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llm-tray-bench-") as tmp:
        store_path = Path(tmp) / "store.sqlite3"
        build_s = build_store(store_path, args.rows)
        store_bytes = store_path.stat().st_size
        result = measure_export(store_path, args.format, Path(tmp) / f"samples.{args.format}")
    if args.json:
        print(json.dumps({**result, "build_s": build_s, "store_bytes": store_bytes, "format": args.format}))
        return 0
    mib = 2**20
    print(f"store: {args.rows:,} samples, {store_bytes / mib:.0f} MiB, built in {build_s:.1f} s")
    print(
        f"export {args.format}: {result['rows']:,} rows in {result['export_s']:.1f} s "
        f"({result['rows'] / result['export_s']:,.0f} rows/s), {result['output_bytes'] / mib:.0f} MiB written"
    )
    print(
        f"peak RSS: {result['rss_before_bytes'] / mib:.0f} MiB after imports, "
        f"{result['rss_peak_bytes'] / mib:.0f} MiB during the export "
        f"(growth {result['rss_growth_bytes'] / mib:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
