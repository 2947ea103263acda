"""`llm-tray bench`: measure a model through its real server (#13). The run itself is
services/bench_job.py (shared with the tray's bench window); this is its command line: the
arguments, the text or JSON printed, and the result kept as the baseline. The progress line goes
to stderr on a terminal only; Ctrl-C stops at once and prints what finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from trayapp.core.bench import BenchOptions
from trayapp.core.bench_json import bench_json
from trayapp.core.terminal import terminal_safe
from trayapp.services.bench_job import BenchError, Progress, find_target, run_job
from trayapp.services.bench_report import format_result, store_baseline

if TYPE_CHECKING:
    from trayapp.core.bench import BenchResult
    from trayapp.services.monitor import Monitor

DEFAULT_DEPTHS = "0,2048,8192"


def _depths(text: str) -> tuple[int, ...]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected depths like 0,2048,8192, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"depths must be token counts ≥ 0, got {text!r}")
    return tuple(sorted(set(values)))


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, metavar="NAME", help="the model to bench (default: the one loaded)"
    )
    parser.add_argument(
        "--tokens", type=_count(2), default=200, metavar="N", help="tokens per decode run (200)"
    )
    parser.add_argument(
        "--depths",
        type=_depths,
        default=_depths(DEFAULT_DEPTHS),
        metavar="D,D,…",
        help=f"context depths of the sweep, in tokens ({DEFAULT_DEPTHS}; 0 alone: no sweep)",
    )
    parser.add_argument("--runs", type=_count(1), default=5, metavar="K", help="measured runs per step (5)")
    parser.add_argument("--warmup", type=_count(0), default=2, metavar="W", help="discarded warm-up runs (2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (see docs/json.md)")
    parser.add_argument(
        "--force", action="store_true", help="bench even while another client uses the server"
    )


def run_bench(args: argparse.Namespace, monitor: Monitor) -> int:
    """The command: 0 done, 1 could not bench, 130 interrupted (finished runs still printed)."""
    try:
        return _run(args, monitor)
    except BenchError as exc:
        print(f"llm-tray: bench: {exc}", file=sys.stderr)
        return 1
    finally:
        monitor.close()


@contextlib.contextmanager
def _ctrl_c_cancels() -> Iterator[threading.Event]:
    """Ctrl-C stops the bench: the run in flight at once (KeyboardInterrupt), and, should that
    interrupt be lost (raised where Python swallows it, e.g. in a finalizer the main thread was
    running; seen once on a busy host: the bench ran on to its end and exited 0), at the next run."""
    cancel = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        cancel.set()
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield cancel  # signals reach the main thread only
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace, monitor: Monitor) -> int:
    from trayapp.config.settings import endpoint_from_arg

    urls = [endpoint_from_arg(value).url for value in getattr(args, "endpoint", [])]
    snapshot, server, model = find_target(monitor, urls, args.model, bool(args.force), warn=sys.stderr)
    options = BenchOptions(args.tokens, args.runs, args.warmup, tuple(args.depths), bool(args.force))
    with _ctrl_c_cancels() as cancel:
        outcome = run_job(monitor, snapshot, server, model, options, Progress(options.total_runs()), cancel)
    result = outcome.result
    stored, note = store_baseline(result)
    line, peers = peer_comparison(result)
    if args.json:
        doc = {**bench_json(result), "baseline_stored": stored, "baseline_note": note, "peers": peers}
        print(json.dumps(doc, indent=2))
    else:
        print(terminal_safe(format_result(result)))
        print(terminal_safe(f"peers      {line}"))
        if stored:
            print("baseline   stored: later sessions of this model on this hardware are compared with it")
    if note:
        print(f"llm-tray: bench: {note}", file=sys.stderr)
    if outcome.failure and not outcome.measured:
        print(f"llm-tray: bench: {outcome.failure}", file=sys.stderr)
        return 1
    return 130 if result.interrupted else 0


def peer_comparison(result: BenchResult) -> tuple[str, dict[str, object]]:
    """This machine beside its published peers (#23): the bench's share of the bandwidth ceiling at
    depth 0 against the band of the nearest peers (same part, class or family; same quantization
    group), as a line for the text and an object for the JSON."""
    from trayapp.core.peers import band_for, likely_causes, peer_band_json, peer_line, verdict
    from trayapp.sources.peers_table import load_peers, peer_query

    target = result.target
    gpus = target.hardware_detail.get("gpus") or []
    names = [str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")]
    query = peer_query(names, target.quantization)
    rows = load_peers()
    band = band_for(rows, query)
    share = result.efficiency
    line = peer_line(share, band)
    judged = verdict(share, band) if share is not None and band is not None else None
    if judged == "far below its peers":
        line += "; usually: " + " / ".join(likely_causes(rows, query)[:2])
    return line, {
        "share": None if share is None else round(share, 3),
        "band": None if band is None else peer_band_json(band),
        "verdict": judged,
        "line": line,
    }
