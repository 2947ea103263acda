"""`llm-tray agent`: headless monitoring for an inference box, with a Prometheus endpoint.

Never imports Qt. Records to the same store as the tray, so `sessions`,
`export` and `report` work on the box too. Prometheus scrapes every agent;
that is how one person watches several machines.

It is this machine's sampler too: its snapshots are served on a loopback endpoint of their own
(adapters/snapshot_server.py; `--snapshot-port`, any free port by default) and the sampler file
says where, so `status`, `watch` and `bar` read them instead of probing again. `/metrics` stays
on its own port, without the snapshot.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from trayapp.adapters.metrics import MetricsState, start_exporter
from trayapp.adapters.proxy.server import is_loopback
from trayapp.adapters.sampler_file import TOKEN_ENV
from trayapp.adapters.snapshot_server import SnapshotServer
from trayapp.monitor import Monitor

log = logging.getLogger("trayapp.agent")


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--snapshot-address",
        default="127.0.0.1",
        metavar="ADDR",
        help=f"where the snapshot endpoint listens (127.0.0.1; another address needs ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--snapshot-port", type=int, default=0, metavar="N", help="snapshot endpoint port (0: any free)"
    )
    parser.add_argument("--no-snapshot", action="store_true", help="no snapshot endpoint, no sampler file")


def _start_snapshots(args: argparse.Namespace, monitor: Monitor) -> SnapshotServer | None:
    """The snapshot endpoint and the sampler file (None with --no-snapshot); raises OSError."""
    if getattr(args, "no_snapshot", False):
        return None
    address = getattr(args, "snapshot_address", "127.0.0.1")
    token = os.environ.get(TOKEN_ENV) or None
    if not is_loopback(address) and not token:
        raise ValueError(f"--snapshot-address {address} is not loopback: set {TOKEN_ENV} to a token first")
    server = SnapshotServer(address, getattr(args, "snapshot_port", 0), token, monitor.settings.thresholds)
    server.start(announce=True)
    if not is_loopback(address):
        print("llm-tray agent: warning: no TLS on the snapshot endpoint (use an SSH tunnel)", file=sys.stderr)
    print(f"llm-tray agent: snapshots on {server.url}/v1/snapshot", file=sys.stderr, flush=True)
    return server


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
    try:
        snapshots = _start_snapshots(args, monitor)
    except (OSError, ValueError) as exc:
        exporter.stop()
        monitor.close()
        print(f"llm-tray agent: snapshot endpoint: {exc}", file=sys.stderr)
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
            if snapshots is not None:
                snapshots.publish(snapshot)
            if monitor.store_error:
                log.warning("store: %s", monitor.store_error)
            if args.duration is not None and time.monotonic() - started >= args.duration:
                break
            stop.wait(monitor.next_interval_s())
    finally:
        if snapshots is not None:
            snapshots.stop(2.0)  # and its sampler file
        exporter.stop()
        monitor.close()
    return 0
