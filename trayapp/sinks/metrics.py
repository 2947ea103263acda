"""Prometheus exporter: a custom Collector over the latest Snapshot, in its own registry.

`MetricsState.observe(snapshot)` is called by the monitor once per tick; the HTTP
server thread only reads what it left (an immutable Snapshot and a copy of the
counters). Nothing is registered in prometheus_client's global registry, and the
listener binds 127.0.0.1 unless told otherwise. The `server` label is the URL with any
password or query-string value masked, as in the store.

Counters and histograms (each finished request is in exactly one snapshot's `requests`, so
each is counted and observed once):

* `llm_tray_requests_total{server,kind,model,source,outcome}`: finished requests from
  `snapshot.requests`; `outcome` is "error" (HTTP status >= 400), "aborted" or "ok".
* `llm_tray_request_ttft_seconds{server,kind,model}`: histogram of time to first token, for
  requests that report it (OpenTelemetry's `gen_ai.server.time_to_first_token`).
* `llm_tray_request_time_per_output_token_seconds{server,kind,model}`: histogram of 1 / decode
  tok/s per request, i.e. time per output token after the first
  (OpenTelemetry's `gen_ai.server.time_per_output_token`). Error outcomes observe neither.
* `llm_tray_request_queue_wait_seconds{server,kind,model}`: histogram of the time a proxied request
  waited before the server began reading its prompt (a busy slot, a model loading; #22).
* `llm_tray_decoded_tokens_total{server,kind,model}`: decoded tokens. Live: the polled
  total decode rate integrated over each tick interval (estimated). When a finished-request
  record arrives, only the tokens the live estimate has not already counted are added, so a
  request is never counted twice, and servers that report only finished requests (LM Studio)
  are counted from their records.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from trayapp.core.loopback import is_loopback
from trayapp.core.model import ModelStatus, RequestRecord, Snapshot
from trayapp.core.redact import redact_url
from trayapp.sinks.listener import GuardedHandler, GuardedServer, normal_host
from trayapp.sinks.metrics_energy import EnergyHistograms, machine_energy_families, request_energy_families
from trayapp.sinks.prom_histogram import Histogram

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9464
MAX_ESTIMATE_INTERVAL_S = 10.0  # a longer gap (suspend, stall) adds no estimated tokens

MODEL_LABELS = ["server", "kind", "model"]
REQUEST_LABELS = [*MODEL_LABELS, "source", "outcome"]
_Key = tuple[str, str, str]
_RequestKey = tuple[str, str, str, str, str]

# Upper bounds (le, seconds) for local LLMs: TTFT from a cached prompt on a GPU (50 ms) to a long
# prompt read on a CPU (2 min); time per output token from 1000 tok/s (1 ms) to 0.5 tok/s (2 s).
TTFT_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip

# metric name, ModelStatus attribute, help
_MODEL_GAUGES: list[tuple[str, str, str]] = [
    ("llm_tray_decode_tokens_per_second", "decode_tok_s", "Decode rate per stream (mean of streams)."),
    ("llm_tray_decode_total_tokens_per_second", "decode_total_tok_s", "Decode rate summed over streams."),
    ("llm_tray_prompt_tokens_per_second", "prompt_tok_s", "Prompt processing (prefill) rate."),
    ("llm_tray_ceiling_tokens_per_second", "ceiling_tok_s",
     "Memory-bandwidth decode ceiling at the live context depth and offload split."),
    ("llm_tray_full_gpu_ceiling_tokens_per_second", "full_gpu_ceiling_tok_s",
     "Decode ceiling with everything in GPU memory."),
    ("llm_tray_efficiency_ratio", "efficiency", "Decode rate as a share of the ceiling."),
    ("llm_tray_gpu_fraction_ratio", "gpu_fraction", "Share of the model held in GPU memory (0..1)."),
    ("llm_tray_context_tokens", "context_tokens", "Deepest active context depth."),
    ("llm_tray_context_size_tokens", "context_length", "Context size per slot."),
    ("llm_tray_vram_bytes", "vram_bytes", "GPU memory held for the model."),
    ("llm_tray_model_size_bytes", "size_bytes", "Memory the server holds for the model."),
    ("llm_tray_ttft_seconds", "ttft_s", "Time to first token of the latest request."),
    ("llm_tray_draft_acceptance_ratio", "draft_acceptance", "Speculative-decoding draft acceptance (0..1)."),
    ("llm_tray_active_streams", "active_streams", "Requests decoding at once."),
    ("llm_tray_queued_requests", "queued_requests", "Requests waiting for a slot (the server's own count)."),
    ("llm_tray_decode_exact", "decode_exact",
     "1 when the decode rate is server-reported, 0 when estimated from polling."),
    ("llm_tray_prefill_tokens_done", "prefill.tokens_done",
     "Prompt tokens in place (evaluated + cached) of the prompts being read now."),
    ("llm_tray_prefill_tokens_total", "prefill.tokens_total",
     "Whole length of the prompts being read now."),
    ("llm_tray_prefill_cached_tokens", "prefill.cached_tokens",
     "Prompt tokens being read now reused from the cache."),
    ("llm_tray_prefill_tokens_per_second", "prefill.tok_s",
     "Evaluation speed of the prompts being read now."),
    ("llm_tray_prefill_eta_seconds", "prefill.eta_s",
     "Estimated seconds until the prompts being read are done."),
]  # fmt: skip


@dataclass(frozen=True)
class _Observed:
    snapshot: Snapshot | None
    decoded: dict[_Key, float]
    requests: dict[_RequestKey, float]
    ttft: dict[_Key, Histogram]
    tpot: dict[_Key, Histogram]
    queue_wait: dict[_Key, Histogram]
    energy: EnergyHistograms


def request_outcome(record: RequestRecord) -> str:
    """The `outcome` label: error (HTTP status >= 400), else aborted (ended early), else ok."""
    if record.http_status is not None and record.http_status >= 400:
        return "error"
    return "aborted" if record.aborted else "ok"


class MetricsState:
    """The latest snapshot and the counters accumulated over all snapshots seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._decoded: dict[_Key, float] = {}
        self._pending: dict[tuple[str, str], float] = {}  # estimated tokens no record has confirmed yet
        self._requests: dict[_RequestKey, float] = {}
        self._ttft: dict[_Key, Histogram] = {}  # keyed by the redacted server label
        self._tpot: dict[_Key, Histogram] = {}
        self._queue_wait: dict[_Key, Histogram] = {}
        self._energy = EnergyHistograms()  # per-request energy (sinks/metrics_energy.py)
        self._last_mono_s: float | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self))

    def observe(self, snapshot: Snapshot) -> None:
        """Take a new snapshot: swap it in and add its requests and decoded tokens to the counters.

        `snapshot.requests` holds the requests finished since the previous snapshot: each is
        counted once here.
        """
        with self._lock:
            kinds = {s.url: s.kind for s in snapshot.servers}
            for record in snapshot.requests:
                key = (record.server, kinds.get(record.server, record.server_kind), record.model)
                self._observe_request(record, (_server_label(key[0]), key[1], key[2]))
                if record.decode_tokens:
                    pending = self._pending.get((record.server, record.model), 0.0)
                    unseen = max(0.0, record.decode_tokens - pending)
                    self._pending[(record.server, record.model)] = max(0.0, pending - record.decode_tokens)
                    self._decoded[key] = self._decoded.get(key, 0.0) + unseen
            dt = None if self._last_mono_s is None else snapshot.t_mono_s - self._last_mono_s
            if dt is not None and 0.0 < dt <= MAX_ESTIMATE_INTERVAL_S:
                for server, model in snapshot.models():
                    rate = model.decode_total_tok_s
                    if rate is None or rate <= 0:
                        continue
                    key = (server.url, server.kind, model.name)
                    self._decoded[key] = self._decoded.get(key, 0.0) + rate * dt
                    pkey = (server.url, model.name)
                    self._pending[pkey] = self._pending.get(pkey, 0.0) + rate * dt
            self._last_mono_s = snapshot.t_mono_s
            self._snapshot = snapshot

    def _observe_request(self, record: RequestRecord, key: _Key) -> None:
        outcome = request_outcome(record)
        rkey = (*key, record.source, outcome)
        self._requests[rkey] = self._requests.get(rkey, 0.0) + 1.0
        if outcome == "error":
            return
        self._energy.add(record, key)
        if record.ttft_s is not None and record.ttft_s >= 0:
            self._ttft[key] = self._ttft.get(key, Histogram.empty(TTFT_BUCKETS_S)).add(
                TTFT_BUCKETS_S, record.ttft_s
            )
        if record.decode_tok_s is not None and record.decode_tok_s > 0:
            self._tpot[key] = self._tpot.get(key, Histogram.empty(TPOT_BUCKETS_S)).add(
                TPOT_BUCKETS_S, 1.0 / record.decode_tok_s
            )
        if record.queue_wait_s is not None and record.queue_wait_s >= 0:
            self._queue_wait[key] = self._queue_wait.get(key, Histogram.empty(TTFT_BUCKETS_S)).add(
                TTFT_BUCKETS_S, record.queue_wait_s
            )

    def observed(self) -> _Observed:
        with self._lock:
            return _Observed(
                self._snapshot,
                dict(self._decoded),
                dict(self._requests),
                dict(self._ttft),
                dict(self._tpot),
                dict(self._queue_wait),
                self._energy.copy(),
            )


def _attribute(model: ModelStatus, path: str) -> float | None:
    """`model.a` or `model.a.b` as a number (None when a part is missing)."""
    value: object = model
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return float(value) if isinstance(value, (int, float)) else None


@functools.lru_cache(maxsize=256)
def _server_label(url: str) -> str:
    """The server URL as a label, with any password or query-string value masked (as in the store)."""
    return redact_url(url)


def _histogram_family(
    name: str, help_text: str, bounds: tuple[float, ...], histograms: dict[_Key, Histogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=MODEL_LABELS)
    for key, histogram in sorted(histograms.items()):
        family.add_metric(list(key), histogram.cumulative(bounds), histogram.total)
    return family


def _model_labels(server_url: str, kind: str, model: ModelStatus) -> list[str]:
    return [_server_label(server_url), kind, model.name]


class SnapshotCollector(Collector):
    """Metric families built fresh from the latest snapshot at each scrape."""

    def __init__(self, state: MetricsState) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []  # names are dynamic; don't make the registry call collect() at registration

    def collect(self) -> Iterator[Metric]:
        observed = self._state.observed()
        snapshot = observed.snapshot
        requests = CounterMetricFamily(
            "llm_tray_requests", "Finished requests seen, by source and outcome (ok, aborted, error).",
            labels=REQUEST_LABELS,
        )  # fmt: skip
        for key, value in sorted(observed.requests.items()):
            requests.add_metric(list(key), value)
        decoded = CounterMetricFamily(
            "llm_tray_decoded_tokens",
            "Decoded tokens: polled decode rate x interval, topped up from finished-request records.",
            labels=MODEL_LABELS,
        )
        for dkey, value in sorted(observed.decoded.items()):
            decoded.add_metric([_server_label(dkey[0]), *dkey[1:]], value)
        yield requests
        yield decoded
        yield _histogram_family(
            "llm_tray_request_ttft_seconds",
            "Time to first token per finished request (gen_ai.server.time_to_first_token).",
            TTFT_BUCKETS_S, observed.ttft,
        )  # fmt: skip
        yield _histogram_family(
            "llm_tray_request_time_per_output_token_seconds",
            "Time per output token after the first, 1 / decode tok/s, per finished request "
            "(gen_ai.server.time_per_output_token).",
            TPOT_BUCKETS_S, observed.tpot,
        )  # fmt: skip
        yield _histogram_family(
            "llm_tray_request_queue_wait_seconds",
            "Time a proxied request waited before the server began reading its prompt (a busy slot, "
            "a model loading).",
            TTFT_BUCKETS_S, observed.queue_wait,
        )  # fmt: skip
        yield from request_energy_families(observed.energy)
        if snapshot is None:
            return
        yield from self._snapshot_metrics(snapshot)
        yield from machine_energy_families(snapshot)

    @staticmethod
    def _snapshot_metrics(snapshot: Snapshot) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llm_tray_snapshot_timestamp_seconds",
            "Wall time of the latest snapshot.",
            value=snapshot.t_wall_s,
        )
        up = GaugeMetricFamily("llm_tray_server_up", "1 when the server answers (ok or loading).",
                               labels=["server", "kind"])  # fmt: skip
        for server in snapshot.servers:
            up.add_metric(
                [_server_label(server.url), server.kind], 1.0 if server.status in ("ok", "loading") else 0.0
            )
        yield up

        for name, attribute, help_text in _MODEL_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=MODEL_LABELS)
            for server, model in snapshot.models():
                value = _attribute(model, attribute)
                if value is not None:
                    family.add_metric(_model_labels(server.url, server.kind, model), value)
            yield family

        alerts = GaugeMetricFamily("llm_tray_alerts_active", "Active alerts.",
                                   labels=["kind", "severity", "server", "model"])  # fmt: skip
        counts: dict[tuple[str, str, str, str], int] = {}
        for alert in snapshot.alerts:
            key = (alert.kind, str(alert.severity), _server_label(alert.server), alert.model or "")
            counts[key] = counts.get(key, 0) + 1
        for alert_labels, count in sorted(counts.items()):
            alerts.add_metric(list(alert_labels), float(count))
        yield alerts

        gpu_labels = ["gpu", "name"]
        used = GaugeMetricFamily("llm_tray_gpu_vram_used_bytes", "GPU memory in use.", labels=gpu_labels)
        total = GaugeMetricFamily("llm_tray_gpu_vram_total_bytes", "GPU memory size.", labels=gpu_labels)
        bandwidth = GaugeMetricFamily(
            "llm_tray_gpu_bandwidth_gigabytes_per_second", "GPU memory bandwidth (GB = 10^9 bytes).",
            labels=gpu_labels,
        )  # fmt: skip
        for gpu in snapshot.hardware.gpus:
            labels = [str(gpu.index), gpu.name]
            for family, value in ((used, gpu.vram_used_bytes), (total, gpu.vram_total_bytes),
                                  (bandwidth, gpu.bandwidth_gbps)):  # fmt: skip
                if value is not None:
                    family.add_metric(labels, float(value))
        yield used
        yield total
        yield bandwidth

        host = snapshot.hardware.host
        for name, help_text, value in (
            ("llm_tray_ram_total_bytes", "System RAM size.", host.ram_total_bytes),
            ("llm_tray_ram_available_bytes", "System RAM available.", host.ram_available_bytes),
            ("llm_tray_ram_bandwidth_gigabytes_per_second", "System RAM read bandwidth (GB = 10^9 bytes).",
             host.ram_bandwidth_gbps),
        ):  # fmt: skip
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=float(value))


# --------------------------------------------------------------------------- HTTP

# The listener's limits (sinks/listener.py; docs/security.md). A scrape is one short GET.
REQUEST_TIMEOUT_S = 10.0  # a whole request within this of connecting or of the last answer
SEND_TIMEOUT_S = 10.0  # an answer not taken within this: the connection is dropped
MAX_CONNECTIONS = 32  # connections at once; more get 503 from the accept thread


class _MetricsHandler(GuardedHandler):
    registry: CollectorRegistry
    token: str | None = None
    request_timeout_s = REQUEST_TIMEOUT_S
    send_timeout_s = SEND_TIMEOUT_S

    def reply_error(self, status: int, message: str) -> None:
        body = (message + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="llm-tray"')
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.close_connection = True
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"
        with contextlib.suppress(OSError):
            self.reply_error(code, message or "bad request")

    def do_GET(self) -> None:
        if self.token is not None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                self.reply_error(401, "unauthorized: send Authorization: Bearer <token> (docs/prometheus.md)")
                return
        if urlsplit(self.path).path == "/favicon.ico":
            self.reply_error(404, "not found: /metrics")
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self) -> None:
        self.close_connection = True
        self.reply_error(405, "only GET /metrics")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


class Exporter:
    """A running /metrics listener; `port` is the bound port (useful with port 0)."""

    def __init__(self, server: GuardedServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.address: str = str(server.server_address[0])
        self.port: int = int(server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)


def start_exporter(
    state: MetricsState,
    address: str = DEFAULT_ADDRESS,
    port: int = DEFAULT_PORT,
    *,
    token: str | None = None,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
) -> Exporter:
    """Serve `state.registry` on http://address:port/metrics from a daemon thread.

    Binds 127.0.0.1 by default; `port=0` picks a free port (see `Exporter.port`). The listener rule
    (docs/remote.md): beyond loopback it needs `token`, then asked of every scrape
    (`Authorization: Bearer …`); on loopback no token is asked. Raises ValueError for an address beyond
    loopback without a token, OSError when the port is taken.
    """
    if not is_loopback(address) and not token:
        raise ValueError(
            f"{address} is not a loopback address: /metrics beyond loopback needs a token "
            "(llm-tray agent --new-token, or $LLM_TRAY_TOKEN; docs/prometheus.md)"
        )

    class Handler(_MetricsHandler):
        pass

    Handler.registry = state.registry
    Handler.token = None if is_loopback(address) else token
    Handler.allowed_hosts = frozenset(normal_host(h) for h in allowed_hosts)
    Handler.allowed_origins = frozenset(o.strip().lower() for o in allowed_origins)
    server = GuardedServer((address, port), Handler, max_connections=MAX_CONNECTIONS, name="/metrics")
    thread = threading.Thread(target=server.serve_forever, name="llm-tray-metrics", daemon=True)
    thread.start()
    return Exporter(server, thread)
