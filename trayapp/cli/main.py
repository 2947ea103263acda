"""`llm-tray` command line: one argparse tree (cli/arguments.py), and `main` runs the command it names.

No subcommand starts the tray. Bad flags print a one-line error and exit 2,
never a traceback. Qt is imported only when the tray starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trayapp.cli.arguments import build_parser
from trayapp.cli.stop_signals import StopFlag, on_stop_signals
from trayapp.config.log_format import RedactingFormatter
from trayapp.core.terminal import terminal_safe

if TYPE_CHECKING:  # the commands import what they need when they run: `llm-tray bar` starts fast
    from trayapp.config.settings import EndpointConfig, Settings
    from trayapp.core.hardware_readings import HardwareProfile
    from trayapp.services.monitor import Monitor


# --------------------------------------------------------------------------- helpers


def _profile(args: argparse.Namespace) -> HardwareProfile:
    from trayapp.core.hardware_readings import HardwareProfile
    from trayapp.core.units import GB

    return HardwareProfile(
        gpu_name=args.gpu,
        bandwidth_gbps=args.bandwidth_gbps,
        vram_bytes=int(args.vram_gb * GB) if args.vram_gb else None,
        ram_bandwidth_gbps=args.ram_bandwidth_gbps,
        kv_type=args.kv_type or "f16",
    )


def _load_settings() -> Settings:
    from trayapp.config.settings_file import load_settings

    result = load_settings()
    for error in result.errors:
        print(f"llm-tray: config: {error}", file=sys.stderr)
    if result.backup_path is not None:
        print(
            f"llm-tray: config: using defaults where broken; your file is kept as {result.backup_path}",
            file=sys.stderr,
        )
    return result.settings


def _extra_endpoints(args: argparse.Namespace) -> list[EndpointConfig]:
    from trayapp.config.settings import endpoint_from_arg

    return [endpoint_from_arg(value) for value in args.endpoint]


def _check_gpu_name(args: argparse.Namespace) -> None:
    from trayapp.sources.hwtable import lookup_gpu

    if getattr(args, "gpu", None) and lookup_gpu(args.gpu) is None:
        raise ValueError(f"unknown GPU {args.gpu!r}: give --bandwidth-gbps N [--vram-gb N] instead")


def _make_monitor(args: argparse.Namespace, *, record: bool, one_shot: bool) -> Monitor:
    from trayapp.services.monitor import Monitor

    settings = _load_settings()
    return Monitor(
        settings,
        extra_endpoints=_extra_endpoints(args),
        discover=False if args.no_discover else None,
        profile=_profile(args),
        record=record,
        one_shot=one_shot,
    )


# --------------------------------------------------------------------------- commands


def run_status(args: argparse.Namespace) -> int:
    from trayapp.cli.bar import live_sampler, status_from
    from trayapp.core.jsonview import snapshot_json
    from trayapp.core.phases import is_busy
    from trayapp.core.text import format_snapshot

    live = live_sampler(args)
    answered = status_from(live, args.json) if live is not None else None
    if answered is not None:
        return answered
    monitor = _make_monitor(args, record=False, one_shot=True)
    try:
        snapshot = monitor.tick()
        if any(is_busy(m.phase) for _, m in snapshot.models()):
            # A live rate needs two polls: take a second one a moment later.
            time.sleep(monitor.settings.monitor.poll_active_s)
            snapshot = monitor.tick()
    finally:
        monitor.close()
    for warning in monitor.warnings:
        print(f"llm-tray: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(snapshot_json(snapshot), indent=2))
    else:
        print(terminal_safe(format_snapshot(snapshot, _hardware_note(args))))
    return 0


def _hardware_note(args: argparse.Namespace) -> str | None:
    parts = []
    if args.gpu:
        parts.append(args.gpu)
    if args.bandwidth_gbps:
        parts.append(f"{args.bandwidth_gbps:g} GB/s")
    if args.vram_gb:
        parts.append(f"{args.vram_gb:g} GB")
    if args.ram_bandwidth_gbps:
        parts.append(f"RAM {args.ram_bandwidth_gbps:g} GB/s")
    if args.kv_type:
        parts.append(f"KV {args.kv_type}")
    return " · ".join(parts) or None


def run_watch(args: argparse.Namespace) -> int:
    from trayapp.cli.bar import live_sampler, watch_from
    from trayapp.core.jsonview import snapshot_json
    from trayapp.core.text import format_watch_line

    live = live_sampler(args)
    if live is not None:
        return watch_from(live, args)
    hint = "add --no-record to silence this"
    record = not args.no_record and _record_unless_taken("llm-tray", "this watch", hint)
    monitor = _make_monitor(args, record=record, one_shot=False)
    for warning in monitor.warnings:
        print(f"llm-tray: {warning}", file=sys.stderr)
    start = time.monotonic()
    next_at = start
    stop = StopFlag()
    store_said: str | None = None
    try:
        with on_stop_signals(stop):
            while not stop.requested:
                snapshot = monitor.tick(budget_s=max(0.2, args.interval * 0.8))
                if args.json:
                    print(json.dumps(snapshot_json(snapshot)), flush=True)
                else:
                    print(terminal_safe(format_watch_line(snapshot)), flush=True)
                if monitor.store_error != store_said:  # each change, not each tick
                    store_said = monitor.store_error
                    print(f"llm-tray: store: {store_said or 'recording again'}", file=sys.stderr)
                next_at += args.interval
                now = time.monotonic()
                if args.duration is not None and now - start >= args.duration:
                    break
                if next_at > now:
                    time.sleep(next_at - now)
                else:
                    next_at = now  # fell behind (slow tick): don't try to catch up in a burst
    except KeyboardInterrupt:
        pass
    finally:
        monitor.close()
    return 0


def _run_bar(args: argparse.Namespace) -> int:
    from trayapp.cli.bar import run_bar

    return run_bar(args)


def _run_autostart(args: argparse.Namespace) -> int:
    from trayapp.cli.autostart import run_autostart

    return run_autostart(args)


def run_ceiling(args: argparse.Namespace) -> int:
    from trayapp.cli.ceiling import build_ceiling_report, format_ceiling_report
    from trayapp.core.hardware_readings import HardwareSnapshot, HostReading, ValueSource
    from trayapp.core.machine import resolve_machine
    from trayapp.core.modelfacts import facts_from_params
    from trayapp.sources.hardware import HardwareProbe
    from trayapp.sources.hwtable import gpu_lookup
    from trayapp.sources.ram_bandwidth import default_ram_bandwidth

    if args.model:
        from trayapp.sources.modelfile import ModelFileError, read_model_facts

        try:
            facts = read_model_facts(args.model)
        except ModelFileError as exc:
            raise ValueError(str(exc)) from exc
    elif args.params or args.weights_gb:
        facts = facts_from_params(
            params_b=args.params,
            active_params_b=args.active_params,
            quant=args.quant or (None if args.weights_gb else "Q4_K_M"),
            weights_gb=args.weights_gb,
        )
    else:
        raise ValueError("give --model FILE.gguf, --params B, or --weights-gb GB")

    profile = _profile(args)
    ram: tuple[float | None, ValueSource] = (profile.ram_bandwidth_gbps, "given")
    if profile.ram_bandwidth_gbps is None:
        # RAM bandwidth (for layers that spill to the CPU) is this machine's, measured once a week.
        ram = default_ram_bandwidth()  # type: ignore[assignment]
    if profile.gpu_name is None and profile.bandwidth_gbps is None:
        probe = HardwareProbe(ram_bandwidth_gbps=ram[0], ram_bandwidth_source=ram[1])
        try:
            hardware = probe.read()
        finally:
            probe.close()
    else:
        hardware = HardwareSnapshot(gpus=(), host=HostReading(None, None, ram[0], ram[1]))
    machine = resolve_machine(hardware, profile, gpu_lookup)
    if machine.fast_bandwidth_gbps is None:
        raise ValueError("no bandwidth known for this hardware: give --bandwidth-gbps N")
    report = build_ceiling_report(facts, machine, context_tokens=args.context, gpu_fraction=args.gpu_fraction)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_ceiling_report(report))
    return 0


def _record_unless_taken(prefix: str, this: str, hint: str) -> bool:
    """Whether this command should open the store: not when another process records (a second
    writer is refused); then one line on stderr says who, and `hint` what to do."""
    from trayapp.cli.proxy import store_locked
    from trayapp.sinks.sampler_file import find_sampler

    locked = store_locked()
    if locked is None:
        return True
    info = find_sampler()
    if info is not None:
        who = f"the {info.role or 'sampler'} (pid {info.pid})"
        print(f"{prefix}: {who} records to the store: {this} does not ({hint})", file=sys.stderr)
    else:
        print(f"{prefix}: not recording: {locked} ({hint})", file=sys.stderr)
    return False


def run_agent(args: argparse.Namespace) -> int:
    from trayapp.cli.agent import run_agent as agent_main

    record = _record_unless_taken("llm-tray agent", "this agent", "quit it first for this agent to record")
    return agent_main(args, _make_monitor(args, record=record, one_shot=False))


def run_proxy(args: argparse.Namespace) -> int:
    from trayapp.cli.proxy import run_proxy as proxy_main

    return proxy_main(args, _profile(args))


def run_bench(args: argparse.Namespace) -> int:
    from trayapp.cli.bench import run_bench as bench_main

    return bench_main(args, _make_monitor(args, record=False, one_shot=True))


def run_peers(args: argparse.Namespace) -> int:
    from trayapp.cli.peers import run_peers as peers_main

    return peers_main(args)


def run_tray(args: argparse.Namespace) -> int:
    if (
        sys.platform.startswith("linux")
        and not os.environ.get("DISPLAY")
        and not os.environ.get("WAYLAND_DISPLAY")
        and not os.environ.get("QT_QPA_PLATFORM")
    ):
        print(
            "llm-tray: no graphical display (DISPLAY / WAYLAND_DISPLAY unset). On a headless box use "
            "`llm-tray watch` or `llm-tray agent`.",
            file=sys.stderr,
        )
        return 1
    try:
        from trayapp.app.tray_main import run_tray as tray_main
    except ImportError as exc:
        print(f"llm-tray: the tray needs PySide6 and pyqtgraph ({exc})", file=sys.stderr)
        return 1
    from trayapp.config.settings_file import load_settings

    loaded = load_settings()
    warnings = [f"config: {error}" for error in loaded.errors]
    if loaded.backup_path is not None:
        warnings.append(f"config: using defaults where broken; your file is kept as {loaded.backup_path}")
    for warning in warnings:
        print(f"llm-tray: {warning}", file=sys.stderr)
    return tray_main(
        loaded.settings,
        extra_endpoints=_extra_endpoints(args),
        discover=False if args.no_discover else None,
        profile=_profile(args),
        at_login=args.at_login,
        startup_warnings=warnings,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = logging.StreamHandler()
    console.setFormatter(RedactingFormatter("llm-tray: %(message)s"))  # no secret reaches a terminal
    logging.basicConfig(level=logging.WARNING, handlers=[console])
    from trayapp.cli import logs

    commands = {
        None: run_tray,
        "status": run_status,
        "watch": run_watch,
        "bar": _run_bar,
        "ceiling": run_ceiling,
        "sessions": logs.run_sessions,
        "export": logs.run_export,
        "report": logs.run_report,
        "agent": run_agent,
        "proxy": run_proxy,
        "bench": run_bench,
        "peers": run_peers,
        "autostart": _run_autostart,
    }
    try:
        if getattr(args, "gpu", None):
            _check_gpu_name(args)
        return commands[args.command](args)
    except ValueError as exc:
        print(f"llm-tray: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `llm-tray status | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
