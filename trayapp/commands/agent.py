"""`llm-tray agent`: headless monitoring for an inference box, with a Prometheus endpoint.

Never imports Qt. Records to the same store as the tray, so `sessions`,
`export` and `report` work on the box too. Prometheus scrapes every agent;
that is how one person watches several machines.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time

from trayapp.adapters.metrics import MetricsState, start_exporter
from trayapp.monitor import Monitor

log = logging.getLogger("trayapp.agent")


def run_agent(args: argparse.Namespace, monitor: Monitor) -> int:
    state = MetricsState()
    try:
        exporter = start_exporter(state, address=args.listen_address, port=args.metrics_port)
    except OSError as exc:
        monitor.close()
        print(
            f"llm-tray agent: cannot listen on {args.listen_address}:{args.metrics_port}: {exc}",
            file=sys.stderr,
        )
        return 1
    for warning in monitor.warnings:
        print(f"llm-tray agent: {warning}", file=sys.stderr)
    print(f"llm-tray agent: metrics on {exporter.url}", file=sys.stderr, flush=True)

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)

    started = time.monotonic()
    try:
        while not stop.is_set():
            snapshot = monitor.tick()
            state.observe(snapshot)
            if monitor.store_error:
                log.warning("store: %s", monitor.store_error)
            if args.duration is not None and time.monotonic() - started >= args.duration:
                break
            stop.wait(monitor.next_interval_s())
    finally:
        exporter.stop()
        monitor.close()
    return 0
