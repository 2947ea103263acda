"""`llm-tray autostart on|off|status`: start at login from the command line.

The same registration as the tray's "Start at login" item (`services/autostart`): the XDG
autostart file, the LaunchAgent, or the HKCU Run value `llm-tray`. The Windows installer runs
`llm-tray.exe autostart on` for its "start at login" task and `autostart off` when uninstalled.
"""

from __future__ import annotations

import argparse
import sys

from trayapp.services import autostart


def add_autostart_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("on", "off", "status"),
        help="on: start the tray at login; off: stop doing so; status: say which (exit 0 on, 1 off)",
    )


def run_autostart(args: argparse.Namespace) -> int:
    """Enable, disable or report start at login; errors go to stderr with exit 1."""
    try:
        if args.action == "on":
            where = autostart.enable()
            print(f"llm-tray starts at login: {where} ({autostart.describe()})")
            return 0
        if args.action == "off":
            autostart.disable()
            print("llm-tray no longer starts at login")
            return 0
    except autostart.AutostartError as exc:
        print(f"llm-tray: autostart: {exc}", file=sys.stderr)
        return 1
    enabled = autostart.is_enabled()
    print("on" if enabled else "off")
    return 0 if enabled else 1
