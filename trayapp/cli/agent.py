"""`llm-tray agent`: headless monitoring for an inference box, with a Prometheus endpoint.

Never imports Qt. Records to the same store as the tray, so `sessions`,
`export` and `report` work on the box too. Prometheus scrapes every agent;
that is how one person watches several machines.

It is this machine's sampler too: its snapshots are served on a loopback endpoint of their own
(sinks/snapshot_server.py; `--snapshot-port`, any free port by default) and the sampler file
says where, so `status`, `watch` and `bar` read them instead of probing again. `/metrics` stays
on its own port, without the snapshot. When a tray (or another agent) is already this machine's
live sampler, the agent leaves its sampler file alone and says so: it serves `/metrics` and its
own endpoint all the same, and takes the file over only once that sampler has stopped.

A tray on another machine reads that endpoint too (`[[agents]]`, docs/remote.md). Off loopback it
needs a token: `llm-tray agent --new-token` writes one to a 0600 file under LLM_TRAY_HOME (a headless
box has no keyring) and from then on the agent requires it on every request, loopback included;
$LLM_TRAY_TOKEN, when set, is used instead of the file.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trayapp.cli.stop_signals import event_setter, on_stop_signals
from trayapp.config import paths
from trayapp.config.files import PRIVATE_PERMISSIONS, atomic_write_text, read_secret_file
from trayapp.core.loopback import is_loopback
from trayapp.sinks.sampler_file import TOKEN_ENV

if TYPE_CHECKING:  # loaded when the agent runs: `llm-tray --help` and the tray's start need neither
    from trayapp.services.monitor import Monitor
    from trayapp.sinks.snapshot_server import SnapshotServer

log = logging.getLogger(__name__)

TICK_RETRY_S = 1.0  # after a failed tick (file-descriptor limit, a bug), the next try this much later


def token_path() -> Path:
    """The agent's token file: `agent-token` in the config dir (under LLM_TRAY_HOME)."""
    return paths.agent_token_file()


def write_new_token() -> Path:
    """A new random token in the token file (mode 0600, replaced atomically); returns its path."""
    path = token_path()
    atomic_write_text(path, secrets.token_urlsafe(32) + "\n", permissions=PRIVATE_PERMISSIONS)
    return path


def agent_token(environ: Mapping[str, str] = os.environ) -> tuple[str | None, str | None]:
    """(the token the endpoint requires or None, where it came from): $LLM_TRAY_TOKEN, else the file."""
    token = environ.get(TOKEN_ENV)
    if token:
        return token, f"${TOKEN_ENV}"
    path = token_path()
    text = read_secret_file(path)  # refuses a link, a non-file, a loose mode (SecretFileError: a ValueError)
    if text is None:
        return None, None
    if not text:
        raise ValueError(f"{path} is empty: run llm-tray agent --new-token")
    return text, str(path)


class _NewToken(argparse.Action):
    """`--new-token`: write the token file, say where, exit (before any monitoring starts)."""

    def __call__(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        try:
            path = write_new_token()
        except OSError as exc:  # a read-only home: said, not a traceback
            why = paths.unwritable(token_path().parent) or exc.strerror or str(exc)
            parser.exit(1, f"llm-tray agent: cannot write {token_path()}: read-only mode? ({why})\n")
        print(f"llm-tray agent: new token written to {path} (mode 0600); the agent now requires it.")
        print(f"Give it to the tray (Settings → Remote machines): cat {path}")
        parser.exit(0)


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--snapshot-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="where the snapshot endpoint listens (127.0.0.1; another address needs a token: --new-token)",
    )
    parser.add_argument(
        "--snapshot-port", type=int, default=0, metavar="N", help="snapshot endpoint port (0: any free)"
    )
    parser.add_argument("--no-snapshot", action="store_true", help="no snapshot endpoint, no sampler file")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the loopback listeners answer besides localhost, 127.0.0.1 and [::1] (repeatable)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser Origin the listeners answer, e.g. http://localhost:3000 (repeatable; none)",
    )
    parser.add_argument(
        "--new-token",
        action=_NewToken,
        nargs=0,
        help=f"write a new token for the snapshot endpoint to a 0600 file and exit (${TOKEN_ENV} wins)",
    )


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """The Host names the user allowed on the loopback listeners (--allow-host)."""
    return tuple(getattr(args, "allow_host", None) or ())


def _allowed_origins(args: argparse.Namespace) -> tuple[str, ...]:
    """The browser Origins the user allowed (--allow-origin)."""
    return tuple(getattr(args, "allow_origin", None) or ())


def _start_snapshots(
    args: argparse.Namespace, monitor: Monitor, token: str | None = None, source: str | None = None
) -> SnapshotServer | None:
    """The snapshot endpoint and the sampler file (None with --no-snapshot); raises OSError."""
    if getattr(args, "no_snapshot", False):
        return None
    address = getattr(args, "snapshot_address", "127.0.0.1")
    if not is_loopback(address) and not token:
        raise ValueError(
            f"--snapshot-address {address} is not loopback: set {TOKEN_ENV} to a token first "
            "(or run llm-tray agent --new-token)"
        )
    from trayapp.sinks.snapshot_server import SnapshotServer

    server = SnapshotServer(
        address,
        getattr(args, "snapshot_port", 0),
        token,
        monitor.settings.thresholds,
        role="agent",
        intake=lambda: monitor,  # a CLI proxy's records and a bench's result (POST /v1/records, /v1/bench)
        allowed_hosts=_allowed_hosts(args),
        allowed_origins=_allowed_origins(args),
    )
    server.start(announce=True)
    if not is_loopback(address):
        print(
            "llm-tray agent: warning: no TLS on the snapshot endpoint: the token and the snapshots cross "
            "the network in clear text (an SSH tunnel avoids that: docs/remote.md)",
            file=sys.stderr,
        )
    needs = f" (token required, from {source})" if token else ""
    print(f"llm-tray agent: snapshots on {server.url}/v1/snapshot{needs}", file=sys.stderr, flush=True)
    if not server.is_machine_sampler:
        _say_sampler(server)
    return server


def _say_sampler(server: SnapshotServer) -> None:
    """One line on stderr: who is this machine's sampler, which `status`, `watch` and `bar` follow."""
    owner = server.machine_sampler
    if owner is None:
        return
    if server.is_machine_sampler:
        line = "now this machine's sampler: status, watch and bar follow this agent"
    else:
        line = (
            f"{owner.describe()} is this machine's sampler: status, watch and bar follow it "
            "(this agent serves its own snapshots and /metrics all the same)"
        )
    print(f"llm-tray agent: {line}", file=sys.stderr, flush=True)


def run_agent(args: argparse.Namespace, monitor: Monitor) -> int:
    from trayapp.services.poll_thread import wait_for_next_tick
    from trayapp.sinks.metrics import MetricsState, start_exporter

    state = MetricsState()
    try:
        token, source = agent_token()
    except (OSError, ValueError) as exc:
        monitor.close()
        print(f"llm-tray agent: token: {exc}", file=sys.stderr)
        return 1
    try:
        exporter = start_exporter(
            state,
            address=args.listen_address,
            port=args.metrics_port,
            token=token,
            allowed_hosts=_allowed_hosts(args),
            allowed_origins=_allowed_origins(args),
        )
    except ValueError as exc:  # beyond loopback without a token
        monitor.close()
        print(f"llm-tray agent: --listen-address {args.listen_address}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        monitor.close()
        print(
            f"llm-tray agent: cannot listen on {args.listen_address}:{args.metrics_port}: {exc}",
            file=sys.stderr,
        )
        return 1
    if not is_loopback(args.listen_address):
        print(
            f"llm-tray agent: warning: /metrics listens beyond loopback: every scrape must send the token "
            f"(from {source}); no TLS: the token and the metrics cross the network in clear text "
            "(docs/prometheus.md)",
            file=sys.stderr,
        )
    try:
        snapshots = _start_snapshots(args, monitor, token, source)
    except (OSError, ValueError) as exc:
        exporter.stop()
        monitor.close()
        print(f"llm-tray agent: snapshot endpoint: {exc}", file=sys.stderr)
        return 1
    for warning in monitor.warnings:
        print(f"llm-tray agent: {warning}", file=sys.stderr)
    print(f"llm-tray agent: metrics on {exporter.url}", file=sys.stderr, flush=True)

    stop = threading.Event()
    started = time.monotonic()
    owner = snapshots.machine_sampler if snapshots is not None else None
    failing: str | None = None  # the tick's failure now (logged once per episode)
    store_said: str | None = None  # the store state last logged (None: recording)
    with on_stop_signals(event_setter(stop)):
        try:
            while not stop.is_set():
                try:
                    snapshot = monitor.tick()
                except Exception as exc:  # e.g. EMFILE at the fd limit: wait, then try again
                    what = f"{type(exc).__name__}: {exc}"
                    if what != failing:
                        failing = what
                        log.warning("agent: a tick failed (%s); serving on, trying again", what, exc_info=exc)
                        print(
                            f"llm-tray agent: a tick failed ({what}); trying again",
                            file=sys.stderr,
                            flush=True,
                        )
                    stop.wait(TICK_RETRY_S)
                    continue
                if failing is not None:
                    failing = None
                    log.info("agent: ticking again")
                    print("llm-tray agent: ticking again", file=sys.stderr, flush=True)
                state.observe(snapshot)
                if snapshots is not None:
                    snapshots.publish(snapshot)
                    if snapshots.machine_sampler != owner:  # re-claimed on its builder thread
                        owner = snapshots.machine_sampler
                        _say_sampler(snapshots)
                if monitor.store_error != store_said:  # each change, not each tick
                    store_said = monitor.store_error
                    log.warning("store: %s", store_said or "recording again")
                if args.duration is not None and time.monotonic() - started >= args.duration:
                    break
                wait_for_next_tick(monitor, stop)
        finally:
            if snapshots is not None:
                snapshots.stop(2.0)  # and its sampler file
            exporter.stop()
            monitor.close()
    return 0
