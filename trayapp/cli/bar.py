"""`llm-tray bar`, and `status` / `watch` answered by the machine's running sampler.

`bar` never probes a server: it reads the sampler's endpoint (sinks/snapshot_server.py),
found through its file (sinks/sampler_file.py). With no sampler it prints a short
"llm-tray not running" line in the bar's format and exits 0 (a bar shows it; a traceback or a
failing exit would only blank the module). `--follow` keeps one stream open and prints only
when the rendered text changes; when the sampler goes away it says so and looks again every
few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from trayapp.core.bar import DEFAULT_MAX_WIDTH, FORMATS, render
from trayapp.core.terminal import terminal_safe
from trayapp.sinks import sampler_file

RETRY_S = 3.0  # --follow: how often to look for a sampler again


def add_bar_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="plain", help="the bar's syntax (plain)")
    parser.add_argument("--follow", action="store_true", help="print a new line whenever the glance changes")
    parser.add_argument(
        "--max-width",
        type=int,
        default=DEFAULT_MAX_WIDTH,
        metavar="N",
        help=f"characters of text at most ({DEFAULT_MAX_WIDTH}; 0: no limit)",
    )
    parser.add_argument("--duration", type=float, default=None, help=argparse.SUPPRESS)


def _open_command() -> list[str]:
    return [sys.executable, "-m", "trayapp"]  # a running tray shows its dashboard; else it starts


def _emit(text: str, fmt: str, follow: bool) -> None:
    if follow and fmt == "swiftbar":
        print("~~~", flush=False)  # SwiftBar's streamable plugins: each update after this line
    print(terminal_safe(text), flush=True)


def run_bar(args: argparse.Namespace) -> int:
    import httpx

    width = args.max_width if args.max_width > 0 else None

    def text(doc: dict[str, Any] | None) -> str:
        return render(args.format, doc, max_width=width, open_command=_open_command())

    if not args.follow:
        info = sampler_file.find_sampler()
        doc = sampler_file.wait_json(info, "/v1/glance", 3.0) if info is not None else None
        _emit(text(doc), args.format, False)
        return 0
    started = time.monotonic()
    shown: str | None = None

    def show(doc: dict[str, Any] | None) -> None:
        nonlocal shown
        line = text(doc)
        if line != shown:
            _emit(line, args.format, True)
            shown = line

    def expired() -> bool:
        return args.duration is not None and time.monotonic() - started >= args.duration

    while not expired():
        info = sampler_file.find_sampler()
        if info is not None:
            try:
                for event, data in sampler_file.events(info):
                    if event == "glance":
                        show(json.loads(data))
                    if expired():
                        return 0
            except (OSError, ValueError, httpx.HTTPError):
                pass  # the sampler went away mid-stream
        show(None)
        time.sleep(RETRY_S if args.duration is None else min(RETRY_S, 0.5))
    return 0


# --------------------------------------------------------------------------- status / watch


def _own_probe_wanted(args: argparse.Namespace) -> bool:
    """Flags that describe what to probe or the hardware: those ask for a sampler of its own."""
    flags = ("gpu", "bandwidth_gbps", "vram_gb", "ram_bandwidth_gbps", "kv_type")
    return (
        bool(getattr(args, "endpoint", None))
        or bool(getattr(args, "no_discover", False))
        or any(getattr(args, name, None) for name in flags)
    )


def live_sampler(args: argparse.Namespace) -> sampler_file.SamplerInfo | None:
    """This machine's running sampler, when the command may use it; stderr says which it follows,
    or why it probes by itself (no tray or agent running, or one that does not answer)."""
    import httpx

    if _own_probe_wanted(args):
        return None
    info, why_not = sampler_file.locate_sampler()
    if info is None:
        print(f"llm-tray: {why_not}: probing by itself", file=sys.stderr)
        return None
    try:
        refused = sampler_file.get(info, "/v1/glance", 2.0).status_code == 401
    except httpx.HTTPError:
        print(f"llm-tray: {info.describe()} stopped answering: probing by itself", file=sys.stderr)
        return None
    if refused:
        print(
            f"llm-tray: the running sampler (pid {info.pid}) wants a token: set {sampler_file.TOKEN_ENV}; "
            "probing by itself",
            file=sys.stderr,
        )
        return None
    print(f"llm-tray: answering from the running sampler (pid {info.pid}, {info.url})", file=sys.stderr)
    return info


def status_from(info: sampler_file.SamplerInfo, as_json: bool) -> int | None:
    """`status` from the sampler; None when it did not answer (the caller probes by itself,
    as stderr says)."""
    import httpx

    if as_json:
        doc = sampler_file.wait_json(info, "/v1/snapshot")
        if doc is not None:
            print(json.dumps(doc, indent=2))
            return 0
    else:
        sampler_file.wait_json(info, "/v1/snapshot")  # its first snapshot, if just started
        try:
            response = sampler_file.get(info, "/v1/snapshot?format=text")
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 200:
            print(response.text)
            return 0
    print(f"llm-tray: {info.describe()} gave no snapshot: probing by itself", file=sys.stderr)
    return None


def watch_from(info: sampler_file.SamplerInfo, args: argparse.Namespace) -> int:
    """`watch` from the sampler's events: one line per tick of the sampler (at its pace)."""
    import httpx

    started = time.monotonic()
    try:
        for event, data in sampler_file.events(info):
            if args.json and event == "snapshot":
                print(data, flush=True)
            elif not args.json and event == "line":
                print(terminal_safe(json.loads(data)), flush=True)
            if args.duration is not None and time.monotonic() - started >= args.duration:
                break
    except (OSError, ValueError, httpx.HTTPError) as exc:
        print(f"llm-tray: the sampler stopped answering: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
