"""Immutable data types shared by every layer.

Two families:

* *Readings* are what sources (trayapp/sources) return from one poll of the outside world
  (a server, a GPU, the host). They hold raw counters and facts, no rates.
* *Status* types are what the pipeline computes from a series of readings
  (rates, phases, ceilings) and hands to the UI, the CLI, the store and the
  exporter as one `Snapshot` per tick.

Units are in the names (`_bytes`, `_s`, `_tok_s`, `_gbps`). `None` means
"unknown"; where it matters a `reason` string says why.

The hardware's readings (GPUs, the host, `HardwareSnapshot`) are in core/hardware_readings.py; the
phases and what each means in core/phases.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from trayapp.core.alert_kinds import AlertKindName
from trayapp.core.energy_types import EnergyStatus
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.peers import PeerBand
from trayapp.core.phases import Phase

ServerState = Literal["ok", "loading", "unreachable", "unauthorized", "error"]
Severity = Literal["info", "warning", "critical"]
BaselineSource = Literal["bench", "session"]
ModelKey = tuple[str, str]  # (server url, model name): one model on one server

SERVER_STATES: tuple[ServerState, ...] = get_args(ServerState)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)  # ascending: the last is the worst


# --------------------------------------------------------------------------- model facts


@dataclass(frozen=True)
class KvLayout:
    """How many KV-cache elements one token of context adds, split by layer kind.

    `full_elems_per_token` sums n_head_kv × (key_length + value_length) over the
    full-attention layers; `swa_elems_per_token` does the same over the
    sliding-window layers, whose cache is capped at `sliding_window` tokens.
    """

    full_elems_per_token: int
    swa_elems_per_token: int = 0
    sliding_window: int | None = None
    n_layers: int | None = None


@dataclass(frozen=True)
class ModelFacts:
    """What we know about a model's weights: exact (from a GGUF) or estimated."""

    weights_bytes: int  # all tensor bytes (what sits in memory)
    bytes_per_token: int  # weight bytes read per decoded token (batch 1)
    exact: bool  # True when summed from real tensor infos
    source: str  # "gguf", "ollama-show", "estimate", ...
    architecture: str | None = None
    quantization: str | None = None  # file type name, e.g. "Q4_K_M"
    parameter_count: int | None = None
    active_parameter_count: int | None = None
    expert_count: int | None = None
    expert_used_count: int | None = None
    tied_embeddings: bool | None = None
    context_train: int | None = None
    kv: KvLayout | None = None


# --------------------------------------------------------------------------- server readings


@dataclass(frozen=True)
class SlotReading:
    """One decoding stream as a server reports it (a llama-server slot)."""

    slot_id: int
    is_processing: bool
    task_id: int | None = None
    n_decoded: int | None = None  # tokens generated so far by the current/last task
    context_tokens: int | None = None  # tokens in this slot's KV cache (prompt + generated)
    prompt_tokens_processed: int | None = None
    prompt_tokens_cached: int | None = None
    prompt_tokens_total: int | None = None  # the whole prompt, where a server says (llama-server does not)
    n_ctx: int | None = None
    speculative: bool = False
    spec_type: str | None = None  # the speculative decoding kinds of its last task, e.g. "draft-simple"


@dataclass(frozen=True)
class CounterReading:
    """Cumulative server counters (Prometheus /metrics). Any field may be None."""

    tokens_predicted_total: float | None = None
    tokens_predicted_seconds_total: float | None = None
    prompt_tokens_total: float | None = None
    prompt_seconds_total: float | None = None
    requests_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    spec_drafts_total: float | None = None
    spec_accept_rate: float | None = None  # a server's own recent acceptance gauge (SGLang), 0..1
    # draft tokens accepted at each draft position 0, 1, … (llama-server's `…_per_pos_total{position}`)
    spec_accepted_per_position: tuple[float, ...] = ()
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_usage_ratio: float | None = None  # vLLM / SGLang KV pool fill 0..1
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    process_start_s: float | None = None  # llama-server Process-Start-Time-Unix header


# Records read from a server's own log lines: a request's context numbers, no rates. Where a recording
# proxy also records the server's requests, they only inform the diagnosis (the proxy's record is the
# request's row).
LOG_SOURCES = frozenset({"ollama-log", "llamacpp-log"})

# Why an answer ended: "stop" (the model ended it, or a stop word), "length" (a length limit: the
# client's max_tokens, or the context; `max_tokens_requested` and the context size tell which),
# "context" (the server says it ran out of context: llama-server's `truncated`), "other".
StopReason = Literal["stop", "length", "context", "other"]


QUEUE_WAIT_NOTED_S = 0.1  # a shorter wait before the server reads a prompt is the hop, not a queue


@dataclass(frozen=True)
class FinishedRequest:
    """Exact statistics of one finished request, as a server reported them.

    No prompt or completion text, ever.
    """

    model: str
    finished_wall_s: float
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    decode_tokens: int | None = None
    prompt_tok_s: float | None = None
    decode_tok_s: float | None = None
    ttft_s: float | None = None
    load_s: float | None = None
    draft_tokens: int | None = None
    draft_accepted: int | None = None
    context_tokens: int | None = None
    source: str = "server"  # "lms-log", "proxy", "slots", ...
    endpoint: str | None = None  # the API path it was served on (the proxy knows it)
    http_status: int | None = None
    aborted: bool = False  # the client hung up, or the upstream died, before the response ended
    decode_exact: bool = True  # False: decode tok/s from token counts over the proxy's clock
    prompt_rate_upper_bound: bool = False  # cached tokens unknown (Ollama): prompt tok/s may be high
    # Did the prompt and the answer fit the context? (#20; counts only, never text)
    prompt_tokens_sent: int | None = None  # the prompt as the client sent it, in tokens
    prompt_sent_exact: bool = False  # counted by the server's own tokenizer (or its log); False: estimated
    context_limit_tokens: int | None = None  # the context size the server named when it refused or cut
    stop_reason: StopReason | None = None  # why the answer ended (a fixed vocabulary, never server text)
    max_tokens_requested: int | None = None  # the answer's length limit the client asked for
    # Who asked and how long it waited (#22; the proxy knows both): the time before the server began
    # reading the prompt (a slot busy with other requests, or a model loading), from the proxy's clock
    # less the server's own prompt and decode times; the client's process (loopback) or User-Agent.
    queue_wait_s: float | None = None
    client_name: str | None = None  # "aider", "code", "python"; else the User-Agent's product token
    client_pid: int | None = None  # the client's process, on this machine


@dataclass(frozen=True)
class ModelReading:
    """One loaded (or loading) model on one server, at one poll."""

    name: str
    loaded: bool = True  # False: listed but not in memory (a router's unloaded or evicted model)
    loading: bool = False
    sleeping: bool = False  # the server freed it after an idle time; the next request loads it again
    spec_type: str | None = None  # speculative decoding in use: "draft-simple", "draft-mtp", "ngram-cache", …
    size_bytes: int | None = None  # what the server holds for it (Ollama: weights + KV + buffers)
    vram_bytes: int | None = None  # the part of size_bytes in GPU memory
    weights_bytes: int | None = None
    context_length: int | None = None  # per-slot context size
    quantization: str | None = None
    parameter_count: int | None = None
    architecture: str | None = None
    model_path: str | None = None  # local file when known (llama-server /props)
    facts: ModelFacts | None = None
    slots: tuple[SlotReading, ...] = ()
    counters: CounterReading | None = None
    busy: bool | None = None  # server says it is generating (LM Studio `lms ps`)
    queued_requests: int | None = None  # requests waiting for a slot, where the server lists them (`lms ps`)
    live_rate_reason: str | None = None  # why no live rate can be measured, when that is so
    server_pid: int | None = None  # process serving this model, when found
    expires_at: str | None = None
    # why a prompt this server cuts silently (Ollama) would go unseen here: its log cannot be read
    # (None: the log shows cuts, or the server does not cut prompts silently); a proxy in front sees them
    unseen_cuts_reason: str | None = None


@dataclass(frozen=True)
class ServerReading:
    kind: str
    url: str
    status: ServerState
    reason: str | None = None
    version: str | None = None
    models: tuple[ModelReading, ...] = ()
    finished: tuple[FinishedRequest, ...] = ()  # requests that finished since the last poll
    elapsed_s: float | None = None  # how long the poll took
    pid: int | None = None  # the server process, when found
    age_s: float | None = None  # set when this is an earlier reading repeated (the poll is still running)
    t_mono_s: float | None = None  # when the answers arrived (monotonic); rates use it when set
    proxied: bool = False  # a recording proxy is in front: its records are this server's requests
    router: bool = False  # a llama-server router (one child per model, settings in its --models-preset)


# --------------------------------------------------------------------------- computed status


@dataclass(frozen=True)
class PrefillProgress:
    """Prompts being read right now, summed over the streams in prefill."""

    tokens_done: int  # prompt tokens in place: evaluated so far plus those reused from the cache
    cached_tokens: int  # of those, reused from the cache (no work)
    tokens_total: int | None = None  # the whole prompts, where the server says (llama-server does not)
    tok_s: float | None = None  # evaluation speed of these prompts so far (cache excluded)
    eta_s: float | None = None  # (total − done) ÷ tok_s, when both are known

    @property
    def share(self) -> float | None:
        """Share of the prompts in place (0..1), when the total is known."""
        if not self.tokens_total:
            return None
        return min(self.tokens_done / self.tokens_total, 1.0)

    @property
    def mostly_cached(self) -> bool:
        return self.tokens_done > 0 and self.cached_tokens >= 0.5 * self.tokens_done


@dataclass(frozen=True)
class ModelStatus:
    name: str
    phase: Phase
    size_bytes: int | None = None
    weights_bytes: int | None = None
    vram_bytes: int | None = None
    gpu_fraction: float | None = None
    gpu_fraction_source: str | None = None  # "server" (its own sizes) | "nvml"; None when unknown
    context_length: int | None = None  # per request (a llama-server slot's n_ctx)
    parallel_slots: int | None = None  # requests served at once (llama-server slots), when the server says
    context_tokens: int | None = None
    quantization: str | None = None
    parameter_count: int | None = None
    bytes_per_token: int | None = None
    bytes_per_token_exact: bool = False
    ceiling_tok_s: float | None = None  # at the live context and offload split
    full_gpu_ceiling_tok_s: float | None = None  # same context, everything in GPU memory
    decode_tok_s: float | None = None  # per stream, mean over active streams
    decode_total_tok_s: float | None = None
    active_streams: int = 0
    queued_requests: int | None = None  # requests waiting for a slot now, by the server's own count (#22)
    decode_exact: bool | None = None  # True: server-reported timings; False: estimated from polling
    last_decode_tok_s: float | None = None
    last_decode_context_tokens: int | None = None
    prompt_tok_s: float | None = None
    prompt_exact: bool | None = None  # True: server-reported timings; False: estimated from polling
    ttft_s: float | None = None
    ttft_exact: bool | None = None  # True: server-reported; False: prompt tokens ÷ prompt tok/s
    draft_acceptance: float | None = None
    # the share of drafts whose token at position 0, 1, … was accepted (positions never reached left off)
    draft_acceptance_by_position: tuple[float, ...] = ()
    spec_speedup: float | None = None  # decode ÷ the plain-decode baseline (speculative decoding only)
    calibrated_efficiency: float | None = None  # a bench's decode ÷ ceiling at depth 0 on this hardware
    # the published peers' band of shares of the ceiling (same part, class or family; this quantization's
    # group): the healthy band where no bench calibrated this machine (core/peers.py, #23)
    peer_band: PeerBand | None = None
    bench_decode_tok_s: float | None = None  # a bench's decode at depth 0 here (the dashboard's bench line)
    spec_type: str | None = None  # speculative decoding in use ("draft-simple", "draft-mtp", …), when known
    prefill: PrefillProgress | None = None  # prompts being read right now
    session_id: str | None = None
    live_rate_reason: str | None = None
    server_pid: int | None = None
    facts: ModelFacts | None = None
    # why a prompt the server cuts silently would go unseen: neither a proxy nor its log (None: seen)
    unseen_cuts_reason: str | None = None

    @property
    def efficiency(self) -> float | None:
        """Decode rate as a share of the ceiling (0..1+), when both are known."""
        rate = self.decode_tok_s if self.decode_tok_s is not None else None
        if rate is None or not self.ceiling_tok_s:
            return None
        return rate / self.ceiling_tok_s


@dataclass(frozen=True)
class ServerStatus:
    kind: str
    url: str
    status: ServerState
    reason: str | None = None
    version: str | None = None
    models: tuple[ModelStatus, ...] = ()
    pid: int | None = None
    age_s: float | None = None  # the numbers are this old: the server has not answered this tick
    machine: str | None = None  # the remote machine (an `[[agents]]` name) it runs on; None: this one
    router: bool = False  # a llama-server router: a model's settings go in its --models-preset section


@dataclass(frozen=True)
class Finding:
    """A detector's verdict at one instant (before the episode rules)."""

    kind: AlertKindName
    severity: Severity
    server: str
    model: str | None
    message: str
    fix: str
    evidence: Mapping[str, object] = field(default_factory=dict)
    cause: str | None = None
    score: float = 0.0  # how bad, for an episode's peak (kind-specific, larger = worse)
    fix_commands: tuple[str, ...] = ()  # the fix as exact text to copy (flags, env, a command), if any


@dataclass(frozen=True)
class Alert:
    """A confirmed finding that lasts: one per episode."""

    id: str
    kind: AlertKindName
    severity: Severity
    server: str
    model: str | None
    message: str
    fix: str
    since_wall_s: float
    evidence: Mapping[str, object] = field(default_factory=dict)
    cause: str | None = None
    peak: float = 0.0
    ended_wall_s: float | None = None
    machine: str | None = None  # raised by that remote machine's agent; None: by this one
    fix_commands: tuple[str, ...] = ()  # the fix as exact text to copy (flags, env, a command), if any


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, as stored and exported (metrics only, never text)."""

    server: str
    server_kind: str
    model: str
    finished_wall_s: float
    session_id: str | None
    exact: bool
    prompt_tokens: int | None = None
    decode_tokens: int | None = None
    context_tokens: int | None = None
    prompt_tok_s: float | None = None
    decode_tok_s: float | None = None
    ttft_s: float | None = None
    load_s: float | None = None
    ceiling_tok_s: float | None = None
    gpu_fraction: float | None = None
    draft_tokens: int | None = None
    draft_accepted: int | None = None
    source: str = "server"
    cached_tokens: int | None = None  # prompt tokens served from the prompt cache (not processed)
    endpoint: str | None = None
    http_status: int | None = None
    aborted: bool = False
    prompt_rate_upper_bound: bool = False
    # Did the prompt and the answer fit the context? (#20; counts only, never text)
    prompt_tokens_sent: int | None = None  # the prompt as the client sent it, in tokens
    prompt_sent_exact: bool = False  # counted by the server's own tokenizer (or its log); False: estimated
    context_limit_tokens: int | None = None  # the context size the server named when it refused or cut
    stop_reason: StopReason | None = None  # why the answer ended (a fixed vocabulary, never server text)
    max_tokens_requested: int | None = None  # the answer's length limit the client asked for
    # Energy above the idle draw over the request's prefill and decode spans (core/energy.py); None:
    # not measured, and energy_reason says why.
    energy_prefill_j: float | None = None
    energy_decode_j: float | None = None
    energy_j_per_token: float | None = None  # decode joules per decoded token
    energy_idle_w: float | None = None  # the idle draw subtracted
    energy_source: str | None = None  # "rapl", "nvml", "nvml+rapl", "macmon", …
    energy_estimated: bool = False  # some of it is power × time (no energy counter)
    energy_reason: str | None = None
    queue_wait_s: float | None = None  # before the server began reading the prompt (FinishedRequest)
    client_name: str | None = None
    client_pid: int | None = None


@dataclass(frozen=True)
class Baseline:
    """What the same model, quant and hardware did before (from the store): a stored bench of it, or
    else its best comparable earlier session."""

    decode_tok_s: float  # median per-stream decode rate at comparable context
    context_tokens: int | None  # median context depth of the rates used
    server_version: str | None
    session_id: str | None
    when_wall_s: float | None = None  # when it was measured (its session's start)
    spec_type: str | None = None  # the baseline session's speculative decoding; None: plain decode
    values: int = 0  # how many rates the median is over
    model: str | None = None
    quantization: str | None = None
    hardware: str | None = None
    source: BaselineSource = "session"  # "bench": measured on purpose by `llm-tray bench`
    exact: bool = False  # True: from server-reported timings (requests, a bench); False: polled estimates


@dataclass(frozen=True)
class RemoteMachine:
    """A machine watched through its `llm-tray agent`: whether its snapshot came, and its hardware."""

    name: str
    url: str  # the agent's base URL
    status: ServerState  # ok | unreachable | unauthorized | error
    reason: str | None = None
    hardware: HardwareSnapshot | None = None  # its GPUs and RAM, as its agent read them
    t_wall_s: float | None = None  # when its agent took the snapshot shown


@dataclass(frozen=True)
class Snapshot:
    t_wall_s: float
    t_mono_s: float
    servers: tuple[ServerStatus, ...]
    hardware: HardwareSnapshot
    alerts: tuple[Alert, ...] = ()
    requests: tuple[RequestRecord, ...] = ()  # finished since the previous snapshot
    ended_alerts: tuple[Alert, ...] = ()  # episodes that ended at this tick
    schema: int = 1
    machines: tuple[RemoteMachine, ...] = ()  # remote agents; their servers and alerts are in the above
    energy: EnergyStatus | None = None  # this machine's power, idle draw and energy totals

    def models(self) -> list[tuple[ServerStatus, ModelStatus]]:
        return [(server, model) for server in self.servers for model in server.models]


@dataclass(frozen=True)
class SessionRecord:
    """One continuous run of activity per (server, model), ended by an idle gap."""

    id: str
    server: str
    server_kind: str
    model: str
    started_wall_s: float
    ended_wall_s: float | None  # None while the session is live
    server_version: str | None = None
    quantization: str | None = None
    hardware: str | None = None  # e.g. "RTX 4090 (1008 GB/s) + 54 GB/s RAM"
    requests: int = 0
    decode_tokens: int = 0
    mean_decode_tok_s: float | None = None
    peak_decode_tok_s: float | None = None
    mean_prompt_tok_s: float | None = None
    mean_ttft_s: float | None = None
    max_context_tokens: int | None = None
    ceiling_tok_s: float | None = None  # at empty context, for the split in force
    gpu_fraction: float | None = None
    alerts: tuple[str, ...] = ()  # kinds raised during the session
    spec_type: str | None = None  # speculative decoding in use ("draft-mtp", "ngram-cache", …); None: plain
