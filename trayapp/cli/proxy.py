"""`llm-tray proxy`: a recording pass-through proxy in front of a server.

Clients talk to the listen address; every byte goes to the upstream and back unchanged, and
each request's exact numbers (TTFT, prompt processed / cached, decode tok/s from the server's
own durations) are printed and recorded to the session store by a monitor of the upstream. When
another process holds the store and this machine's sampler (the tray, `llm-tray agent`) runs, the
records go to the sampler instead (POST /v1/records, off the forwarding path), which records them
as it records its own proxies' (exact numbers in its live view, the store).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import secrets
import sys
import time
from typing import TYPE_CHECKING

from trayapp.cli.stop_signals import on_stop_signals
from trayapp.config import paths
from trayapp.config.files import read_secret_file
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import QUEUE_WAIT_NOTED_S, FinishedRequest
from trayapp.core.terminal import terminal_safe
from trayapp.core.units import format_rate

if TYPE_CHECKING:  # the proxy and the monitor load only when the command runs (a fast `--help`)
    from trayapp.services.monitor import Monitor
    from trayapp.services.proxy.route import Route
    from trayapp.sinks.sampler_file import SamplerInfo

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "LLM_TRAY_TOKEN"
TOKEN_FILE = "proxy-token"


def _upstream(text: str) -> str:
    """`[KIND=]URL`, checked at parse time: a bad URL or kind is a usage error (exit 2)."""
    from trayapp.config.settings import endpoint_arg  # loaded only when the flag is given (a fast --help

    return endpoint_arg(text)


def add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="where clients connect (repeatable, one per --upstream), e.g. 127.0.0.1:11435",
    )
    parser.add_argument(
        "--upstream",
        action="append",
        required=True,
        type=_upstream,
        metavar="[KIND=]URL",
        help="the server behind it, e.g. ollama=http://127.0.0.1:11434",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a listen address other than loopback (needs a token)",
    )
    parser.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="NAME",
        help=f"environment variable holding the clients' bearer token ({DEFAULT_TOKEN_ENV})",
    )
    parser.add_argument("--json", action="store_true", help="JSON lines: listening, then one per request")
    parser.add_argument("--no-record", action="store_true", help="do not write to the session store")
    parser.add_argument("--duration", type=float, default=None, help=argparse.SUPPRESS)


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `[::1]:PORT` or `:PORT` (loopback) → (host, port); ValueError otherwise."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:11435")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def _token(args: argparse.Namespace, remote: bool) -> str | None:
    """The clients' token: from the named environment variable, or (remote, none set) a new one
    saved 0600 under LLM_TRAY_HOME. Never printed, never logged."""
    token = os.environ.get(args.token_env)
    if token or not remote:
        return token or None
    path = paths.config_dir() / TOKEN_FILE
    if os.path.lexists(path):  # a link, a directory, a loose mode: refused with the fix (a ValueError)
        return read_secret_file(path) or None
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    print(f"llm-tray proxy: a new client token is in {path} (mode 0600)", file=sys.stderr)
    return token


def build_routes(args: argparse.Namespace) -> list[Route]:
    from trayapp.config.settings import endpoint_from_arg
    from trayapp.core.loopback import is_loopback
    from trayapp.services.proxy.route import Route

    if len(args.listen) != len(args.upstream):
        raise ValueError("give one --listen for each --upstream")
    listens = [parse_listen(value) for value in args.listen]
    remote = [host for host, _ in listens if not is_loopback(host)]
    if remote and not args.allow_remote:
        raise ValueError(
            f"{remote[0]} is not a loopback address: add --allow-remote (clients then need a token)"
        )
    token = _token(args, bool(remote))
    routes = []
    for (host, port), upstream in zip(listens, args.upstream, strict=True):
        endpoint = endpoint_from_arg(upstream)
        routes.append(Route(host, port, endpoint.url.rstrip("/"), endpoint.kind or "openai", token))
    if remote:
        print(
            "llm-tray proxy: warning: no TLS: the token and all traffic cross the network in clear text "
            "(put an SSH tunnel or a TLS terminator in front)",
            file=sys.stderr,
        )
    return routes


def record_line(record: FinishedRequest) -> str:
    """One human line per request: numbers only, never text."""
    parts = [f"{record.endpoint or '?'} {record.model}", str(record.http_status or "—")]
    if record.client_name is not None:
        pid = f" (pid {record.client_pid})" if record.client_pid is not None else ""
        parts.append(f"from {terminal_safe(record.client_name)}{pid}")
    if record.aborted:
        parts.append("aborted")
    if record.queue_wait_s is not None and record.queue_wait_s >= QUEUE_WAIT_NOTED_S:
        parts.append(f"queued {record.queue_wait_s:.1f} s")
    if record.ttft_s is not None:
        parts.append(f"TTFT {record.ttft_s * 1000:.0f} ms")
    if record.prompt_tokens is not None:
        cached = f" ({record.cached_tokens} cached)" if record.cached_tokens else ""
        rate = ""
        if record.prompt_tok_s is not None:
            rate = f" at {'≤' if record.prompt_rate_upper_bound else ''}{format_rate(record.prompt_tok_s)}"
        parts.append(f"prompt {record.prompt_tokens}{cached}{rate}")
    if record.decode_tokens is not None:
        rate = ""
        if record.decode_tok_s is not None:
            rate = f" at {'' if record.decode_exact else '~'}{format_rate(record.decode_tok_s)}"
        parts.append(f"decode {record.decode_tokens}{rate}")
    if record.context_limit_tokens is not None and record.prompt_tokens_sent is not None:
        sent, limit = record.prompt_tokens_sent, record.context_limit_tokens
        parts.append(f"refused: a {sent}-token prompt, the context holds {limit}")
    elif record.stop_reason == "context":
        parts.append("cut short: the context is full")
    return "  ".join(parts)


def store_locked() -> str | None:
    """Why this process cannot record (another process holds the store's writer lock), or None.
    The lock is taken and given back at once: the monitor opens the store right after."""
    from trayapp.sinks.store import StoreLockedError
    from trayapp.sinks.store.lock import acquire_lock, lock_path_for, release_lock

    path = paths.store_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = acquire_lock(lock_path_for(path), path)
    except StoreLockedError as exc:
        return str(exc)
    except OSError:
        return None  # the monitor says what is wrong when it opens the store
    release_lock(fd)
    return None


def _sampler_for_records() -> tuple[SamplerInfo | None, str | None]:
    """(the sampler to send records to, None) when another process records and a tray or agent
    runs, or a tray runs (it records once its monitor has opened the store, ~3 s after it answers: a
    proxy started then used to take the store from it); (None, what to tell the user) when the store
    is taken and nothing would take them; (None, None) when this proxy records itself."""
    from trayapp.sinks.sampler_file import locate_sampler

    info, why_not = locate_sampler()
    locked = store_locked()
    if info is not None and (locked is not None or info.role == "tray"):
        return info, None
    if locked is None:
        return None, None
    return None, (
        f"not recording: {locked}, and {why_not} to take this proxy's records: they are printed only. "
        "Stop that process (a `llm-tray watch`?) and start the proxy again, or start the tray first; "
        "--no-record silences this"
    )


def run_proxy(args: argparse.Namespace, profile: HardwareProfile | None = None) -> int:
    from trayapp.config.settings import endpoint_from_arg
    from trayapp.config.settings_file import load_settings
    from trayapp.services.monitor import Monitor
    from trayapp.services.proxy.inbox import RecordInbox
    from trayapp.services.proxy.runner import ProxyThread
    from trayapp.sinks.sampler_file import RecordForwarder
    from trayapp.sources.malloc import settle_the_heap

    routes = build_routes(args)
    sampler, refusal = (None, None) if args.no_record else _sampler_for_records()
    printed: queue.SimpleQueue[FinishedRequest] = queue.SimpleQueue()
    forwarder: RecordForwarder | None = None
    monitor: Monitor | None = None
    inbox: RecordInbox | None = None
    sink: RecordForwarder | RecordInbox
    if sampler is not None:  # the tray (or agent) records: it takes this proxy's records
        forwarder = RecordForwarder(
            sampler,
            [route.upstream_url for route in routes],
            say=lambda line: print(f"llm-tray proxy: {line}", file=sys.stderr, flush=True),
        )
        sink = forwarder
    else:
        inbox = RecordInbox(route.upstream_url for route in routes)
        sink = inbox
        monitor = Monitor(
            load_settings().settings,
            extra_endpoints=[endpoint_from_arg(u) for u in args.upstream],
            discover=False,
            record=not args.no_record and refusal is None,
            profile=profile,
            proxy_inbox=inbox,
        )

    def on_record(route: Route, record: FinishedRequest) -> None:
        sink.put(route.upstream_url, record)  # never blocks: the inbox, or the forwarder's queue
        printed.put(record)  # printed by the main thread: a blocked stdout never stalls a stream

    proxies = ProxyThread(routes, on_record, inbox)
    try:
        urls = proxies.start()
    except OSError as exc:
        if monitor is not None:
            monitor.close()
        print(f"llm-tray proxy: cannot listen: {exc}", file=sys.stderr)
        return 1
    if forwarder is not None:
        assert sampler is not None
        forwarder.start()
        who = f"the {sampler.role or 'sampler'} (pid {sampler.pid})"
        print(f"llm-tray proxy: {who} records to the store: this proxy's records go to it", file=sys.stderr)
    if refusal is not None:
        print(f"llm-tray proxy: {refusal}", file=sys.stderr)
    for warning in monitor.warnings if monitor is not None else ():
        print(f"llm-tray proxy: {warning}", file=sys.stderr)
    if monitor is not None and monitor.store_error:  # taken since the look above: tried again each tick
        print(f"llm-tray proxy: {monitor.store_error}", file=sys.stderr)
    for url, route in zip(urls, routes, strict=True):
        if args.json:
            line = {
                "event": "listening",
                "listen": url,
                "upstream": route.upstream_url,
                "kind": route.server_kind,
                "event_loop": proxies.event_loop,
            }
            print(json.dumps(line), flush=True)
        else:
            print(f"llm-tray proxy: {url} -> {route.upstream_url}: point clients at {url}", flush=True)
    settle_the_heap()  # started: no full collection over start-up's objects under a stream
    # A plain flag, not an Event: a handler that sets an Event can deadlock on the lock of the
    # Event's own wait, which the main thread may hold when the signal comes (seen with wait(0)).
    stopping: list[int] = []
    started = time.monotonic()
    said: set[str] = set()
    with on_stop_signals(stopping.append):
        try:
            next_tick = 0.0
            while not stopping:
                if monitor is not None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + _tick(monitor, said)
                _print_records(printed, args.json)
                if args.duration is not None and time.monotonic() - started >= args.duration:
                    break
                time.sleep(0.2 if monitor is None else min(0.2, max(0.01, next_tick - time.monotonic())))
        finally:
            proxies.stop()
            _print_records(printed, args.json)
            if forwarder is not None:
                forwarder.close()  # the last records reach the sampler, and the lease ends
            if monitor is not None:
                _tick(monitor, said)  # the last records reach the store
                monitor.close()
    return 0


TICK_RETRY_S = 5.0  # after a failed tick (out of file descriptors…), the next try


def _tick(monitor: Monitor, said: set[str]) -> float:
    """One monitor tick, behind the command's boundary: a failure (the process out of file
    descriptors, a full disk) is said once per kind on stderr and the proxy keeps forwarding;
    returns the seconds until the next tick."""
    try:
        monitor.tick()
        return monitor.next_interval_s()
    except Exception as exc:
        kind = type(exc).__name__ + (f"[{exc.errno}]" if isinstance(exc, OSError) else "")
        if kind not in said:
            said.add(kind)
            print(
                f"llm-tray proxy: recording failed ({type(exc).__name__}: {exc}); forwarding goes on, "
                f"recording is retried every {TICK_RETRY_S:g} s",
                file=sys.stderr,
                flush=True,
            )
            log.warning("monitor tick failed", exc_info=True)
        return TICK_RETRY_S


def _print_records(printed: queue.SimpleQueue[FinishedRequest], as_json: bool) -> None:
    """The records made since the last look, one line each, in one write (50 streams ending together
    were 50 writes, each line built by `dataclasses.asdict`'s deep copy, on the GIL the forwarding
    needs: issue #26)."""
    lines = []
    while True:
        try:
            record = printed.get_nowait()
        except queue.Empty:
            break
        if as_json:  # every field a number, a string, a bool or None: read as it is
            lines.append(json.dumps({"event": "request", **vars(record)}))
        else:
            lines.append(terminal_safe(record_line(record)))
    if lines:
        print("\n".join(lines), flush=True)
