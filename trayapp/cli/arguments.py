"""The `llm-tray` command line's argparse tree (`build_parser`): the global flags, each subcommand's
parser, and the number types that make a bad value a one-line usage error (exit 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from trayapp import __version__
from trayapp.core.quants import KV_TYPES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(
    lo: float,
    hi: float,
    what: str,
    must: str,
    *,
    kind: Callable[[str], float] = float,
    above_lo: bool = False,
) -> Callable[[str], float]:
    """An argparse `type`: `kind(text)` from lo to hi (above lo, not at it, with `above_lo`).

    A bad value is a usage error: "expected <what>, got 'x'" when it is no number, else
    "must be <must>, got 7" (NaN is in no range).
    """

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ((lo < value) if above_lo else (lo <= value)) or not value <= hi:
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return value

    return parse


_positive = _number(0, math.inf, "a number", "positive", above_lo=True)
_positive_int = _number(0, math.inf, "a number", "positive", kind=int, above_lo=True)
_port = _number(0, 65535, "a port number", "0-65535 (0: any free port)", kind=int)
_fraction = _number(0, 1, "a number between 0 and 1", "between 0 and 1")


def add_hardware_options(parser: argparse.ArgumentParser, sub: bool = True) -> None:
    """Hardware flags; on a subcommand they default to SUPPRESS so flags given before it survive."""
    default = argparse.SUPPRESS if sub else None
    group = parser.add_argument_group("hardware (describe the machine that runs the model)")
    gpu = group.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu",
        default=default,
        metavar="NAME",
        help='GPU or chip by name, e.g. "RTX 4090", "M4 Max 40-core"',
    )
    gpu.add_argument(
        "--bandwidth-gbps", type=_positive, default=default, metavar="N", help="memory bandwidth in GB/s"
    )
    group.add_argument(
        "--vram-gb",
        type=_positive,
        default=default,
        metavar="N",
        help="GPU (or unified) memory in GB (10^9 B)",
    )
    group.add_argument(
        "--ram-bandwidth-gbps",
        type=_positive,
        default=default,
        metavar="N",
        help="system RAM bandwidth in GB/s",
    )
    group.add_argument(
        "--kv-type", choices=KV_TYPES, default=default, help="KV-cache element type (default f16)"
    )


def _endpoint(text: str) -> str:
    """`[KIND=]URL`, checked at parse time: a bad URL or kind is a usage error (exit 2)."""
    from trayapp.config.settings import endpoint_arg  # loaded only when --endpoint is given (a fast --help

    return endpoint_arg(text)


def add_endpoint_options(parser: argparse.ArgumentParser, sub: bool = True) -> None:
    """Server selection; on a subcommand the defaults are SUPPRESS so flags given before it survive."""
    parser.add_argument(
        "--endpoint",
        action="append",
        type=_endpoint,
        default=argparse.SUPPRESS if sub else [],
        metavar="[KIND=]URL",
        help="a server to watch (repeatable), e.g. llamacpp=http://127.0.0.1:8080",
    )
    parser.add_argument(
        "--no-discover",
        action="store_true",
        default=argparse.SUPPRESS if sub else False,
        help="skip the default-port scan",
    )


def build_parser() -> argparse.ArgumentParser:
    from trayapp.cli import logs

    parser = _Parser(
        prog="llm-tray",
        description="Watch local LLM servers: live decode tok/s against the memory-bandwidth ceiling.",
    )
    parser.add_argument("--version", action="version", version=f"llm-tray {__version__}")
    add_endpoint_options(parser, sub=False)
    add_hardware_options(parser, sub=False)
    parser.add_argument("--at-login", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    status = sub.add_parser("status", help="one snapshot of every server, model and GPU")
    add_endpoint_options(status)
    add_hardware_options(status)
    status.add_argument("--json", action="store_true", help="print JSON (schema 1, see docs/json.md)")

    watch = sub.add_parser("watch", help="one line per tick, recording to the session store")
    add_endpoint_options(watch)
    add_hardware_options(watch)
    watch.add_argument("--json", action="store_true", help="JSON lines")
    watch.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="seconds between lines")
    watch.add_argument("--duration", type=_positive, default=None, metavar="S", help="stop after S seconds")
    watch.add_argument("--no-record", action="store_true", help="do not write to the session store")

    from trayapp.cli.bar import add_bar_arguments

    add_bar_arguments(sub.add_parser("bar", help="one short line for a status bar, from the running sampler"))

    ceiling = sub.add_parser("ceiling", help="the decode-speed ceiling of a model on some hardware")
    source = ceiling.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="FILE.gguf", help="a GGUF file (exact bytes per token)")
    source.add_argument("--params", type=_positive, metavar="B", help="parameters, in billions")
    source.add_argument("--weights-gb", type=_positive, metavar="GB", help="size of the weights in GB")
    ceiling.add_argument(
        "--active-params", type=_positive, metavar="B", help="active parameters (MoE), billions"
    )
    ceiling.add_argument(
        "--quant", default=None, metavar="Q", help="quantization with --params (default Q4_K_M)"
    )
    ceiling.add_argument(
        "--context", type=_positive_int, default=4096, metavar="N", help="context tokens (4096)"
    )
    ceiling.add_argument(
        "--gpu-fraction", type=_fraction, default=None, metavar="F", help="share of weights on GPU"
    )
    ceiling.add_argument("--json", action="store_true", help="print JSON")
    add_hardware_options(ceiling)

    sessions = sub.add_parser("sessions", help="list recorded sessions")
    logs.add_sessions_arguments(sessions)
    export = sub.add_parser("export", help="export recorded requests, sessions or samples")
    logs.add_export_arguments(export)
    report = sub.add_parser("report", help="a shareable one-page HTML report of a session")
    logs.add_report_arguments(report)

    agent = sub.add_parser("agent", help="headless monitoring with a Prometheus /metrics endpoint")
    add_endpoint_options(agent)
    add_hardware_options(agent)
    agent.add_argument(
        "--metrics-port", type=_port, default=9464, metavar="N", help="port (9464; 0: any free)"
    )
    agent.add_argument(
        "--listen-address", default="127.0.0.1", metavar="ADDR", help="bind address (127.0.0.1)"
    )
    agent.add_argument("--duration", type=_positive, default=None, metavar="S", help=argparse.SUPPRESS)
    from trayapp.cli.agent import add_snapshot_arguments

    add_snapshot_arguments(agent)

    from trayapp.cli.proxy import add_proxy_arguments

    proxy = sub.add_parser("proxy", help="a recording pass-through proxy: exact numbers for every request")
    add_proxy_arguments(proxy)
    add_hardware_options(proxy)

    from trayapp.cli.bench import add_bench_arguments

    bench = sub.add_parser("bench", help="measure decode, TTFT and a context sweep through the server")
    add_endpoint_options(bench)
    add_hardware_options(bench)
    add_bench_arguments(bench)
    from trayapp.cli.peers import add_peers_arguments

    add_peers_arguments(
        sub.add_parser("peers", help="published results beside a model and a machine; its predicted rate")
    )
    from trayapp.cli.autostart import add_autostart_arguments

    add_autostart_arguments(sub.add_parser("autostart", help="start the tray at login: on, off or status"))
    return parser
