"""Headless actions the tray app runs off the GUI thread, on the user's request.

Export the session log, turn start-at-login on or off, identify a server (the settings
dialog's connection test) and store an API key in the OS keyring. Each one blocks (files,
HTTP, the keyring), so `trayapp/app/tray_app.py` hands them to the views as callbacks that
`ui/worker.run_in_background` runs; sources, sinks and services are imported only when an action runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trayapp.config import paths

log = logging.getLogger(__name__)


def export_session_log(path: Path) -> str:
    """Export the session log to `path`; the format follows the suffix (.csv, .jsonl, .parquet)."""
    from trayapp.sinks.export import export
    from trayapp.sinks.store import Store

    fmt = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}.get(path.suffix.lower(), "csv")
    store = Store(paths.store_file(), writer=False)
    try:
        result = export(store, fmt=fmt, out=path)
    finally:
        store.close()
    return f"{result.rows} {result.table} rows → {path}"


def set_autostart(enabled: bool) -> str:
    from trayapp.services import autostart

    if enabled:
        return autostart.enable()
    autostart.disable()
    return "disabled"


def identify_server(url: str, api_key: str | None) -> tuple[str | None, str]:
    """Identify the server at `url`: (kind or None, why). Blocking HTTP: run it off the GUI thread."""
    from trayapp.sources.discovery import IDENTIFY_TIMEOUT, identify
    from trayapp.sources.http import make_client

    with make_client(url, timeout=IDENTIFY_TIMEOUT) as client:
        return identify(url, client, api_key)


def store_api_key(url: str, key: str) -> None:
    """Store an endpoint's API key in the OS keyring (blocking; raises with a reason)."""
    from trayapp.sources.secrets import store_api_key as store

    store(url, key)


def autostart_enabled() -> bool:
    """Whether llm-tray starts at login; False (logged) when the state cannot be read."""
    from trayapp.services import autostart

    try:
        return autostart.is_enabled()
    except Exception:  # a broken registry/permissions: show "off", never crash
        log.exception("cannot read the start-at-login state")
        return False
