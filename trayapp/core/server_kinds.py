"""The kinds of LLM server llm-tray knows, one row each: the one place a kind's facts are written.

Discovery scans the default ports and builds probes from the rows, the settings check a kind
against them, and every view names a kind by its label. Adding a kind: a row here, a probe class
under `sources/servers/` whose `kind` is the row's name, and a line in `sources/discovery.py`'s
`identify` and probe table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ServerKindName = Literal["ollama", "llamacpp", "lmstudio", "vllm", "sglang", "mlx", "openai", "unknown"]


@dataclass(frozen=True)
class ServerKindRow:
    """`label`: what users call the kind. `default_port`: where it listens out of the box (a scan
    tries it on loopback); None: no default. `openai_compatible`: read through the OpenAI-compatible
    API alone (/v1/models, /metrics), with no native API that names a model's file, so its probe
    gets no facts loader. `context_flag`: how the server's own settings name the context size of a
    request (None: it has no such setting of one word). `other_ports`: further ports the kind is
    found on out of the box (a new default upstream, a companion app's), scanned beside
    `default_port`. `engine`: what its builds are builds of, when not its label ("llama.cpp").
    `rate_from_proxy`: the server shows nothing while it generates (no slots, no token counters), so
    its live rate is the recording proxy's count of the tokens it streams (core/proxied_streams.py).
    `request_rates`: each finished request's own decode rate is seen without the proxy's help (its
    timings, or its slot polled to its end), or only through the proxy, which records every request:
    `regression` judges those, not the polled ticks between. `idle_connections_free`: its HTTP server
    serves connections on an event loop (uvicorn: vLLM, SGLang; Go's net/http: Ollama), so a kept-alive
    connection waiting for a request holds no thread of it and is closed after no set number of
    requests: the recording proxy keeps many of them for clients that connect per request
    (services/proxy/limits.py `upstream_reuse`)."""

    label: str
    default_port: int | None
    openai_compatible: bool
    context_flag: str | None = None
    other_ports: tuple[int, ...] = ()
    engine: str | None = None
    rate_from_proxy: bool = False
    request_rates: bool = False
    idle_connections_free: bool = False


SERVER_KINDS: dict[ServerKindName, ServerKindRow] = {
    "ollama": ServerKindRow(
        "Ollama", 11434, openai_compatible=False, context_flag="num_ctx", idle_connections_free=True
    ),
    # 9931: upstream llama.cpp's new default port (and the ggml-org menu-bar app's); builds up to
    # b11434 still listen on 8080.
    "llamacpp": ServerKindRow(
        "llama-server",
        8080,
        openai_compatible=False,
        context_flag="-c",
        other_ports=(9931,),
        engine="llama.cpp",
        request_rates=True,
    ),
    "lmstudio": ServerKindRow("LM Studio", 1234, openai_compatible=False, request_rates=True),
    "vllm": ServerKindRow(
        "vLLM", 8000, openai_compatible=True, context_flag="--max-model-len", idle_connections_free=True
    ),
    "sglang": ServerKindRow(
        "SGLang", 30000, openai_compatible=True, context_flag="--context-length", idle_connections_free=True
    ),
    "mlx": ServerKindRow(  # on llama-server's port
        "MLX-LM", 8080, openai_compatible=True, rate_from_proxy=True, request_rates=True
    ),
    "openai": ServerKindRow(
        "OpenAI-compatible server", None, openai_compatible=True, rate_from_proxy=True, request_rates=True
    ),
    "unknown": ServerKindRow("server", None, openai_compatible=False),  # a server not identified (yet)
}

# The kinds a user may name (`unknown` is what a reading says when identification failed).
USER_SERVER_KINDS: tuple[ServerKindName, ...] = tuple(kind for kind in SERVER_KINDS if kind != "unknown")


def server_kind_row(kind: str) -> ServerKindRow | None:
    """The row of `kind`; None for a name that is no server kind (e.g. "llamacpp-router")."""
    return next((row for name, row in SERVER_KINDS.items() if name == kind), None)


def server_label(kind: str) -> str:
    """What users call a kind of server: "llama-server", "LM Studio", "OpenAI-compatible server"."""
    row = server_kind_row(kind)
    return row.label if row is not None else kind


def judged_by_request(kind: str) -> bool:
    """Whether each finished request's own decode rate is seen for servers of `kind` (`request_rates`)."""
    row = server_kind_row(kind)
    return row is not None and row.request_rates


def engine_label(kind: str) -> str:
    """What a kind's version or build is of: "llama.cpp" (b11434), "Ollama" (0.32.15), "vLLM"."""
    row = server_kind_row(kind)
    if row is None:
        return kind
    return row.engine or row.label


def default_ports() -> list[int]:
    """Every kind's default and other out-of-the-box ports, each once, ascending: the loopback ports
    a scan tries."""
    ports = {port for row in SERVER_KINDS.values() for port in row.other_ports}
    return sorted(ports | {row.default_port for row in SERVER_KINDS.values() if row.default_port is not None})


def context_flag(kind: str) -> str | None:
    """How a kind of server names a request's context size: 'num_ctx', '-c'; None when it has no flag."""
    row = server_kind_row(kind)
    return row.context_flag if row is not None else None
