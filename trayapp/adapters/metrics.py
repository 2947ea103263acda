"""Prometheus exporter: a custom Collector over the latest Snapshot, in its own registry.

`MetricsState.observe(snapshot)` is called by the monitor once per tick; the HTTP
server thread only reads what it left (an immutable Snapshot and a copy of the
counters). Nothing is registered in prometheus_client's global registry, and the
listener binds 127.0.0.1 unless told otherwise. The `server` label is the URL with any
password or query-string value masked, as in the store.

Counters:

* `llm_tray_requests_total{server,kind,model}`: finished requests from `snapshot.requests`.
* `llm_tray_decoded_tokens_total{server,kind,model}`: decoded tokens. Live: the polled
  total decode rate integrated over each tick interval (estimated). When a finished-request
  record arrives, only the tokens the live estimate has not already counted are added, so a
  request is never counted twice, and servers that report only finished requests (LM Studio)
  are counted from their records.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trayapp.core.model import ModelStatus, Snapshot
from trayapp.core.redact import redact_url

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9464
MAX_ESTIMATE_INTERVAL_S = 10.0  # a longer gap (suspend, stall) adds no estimated tokens

MODEL_LABELS = ["server", "kind", "model"]
_Key = tuple[str, str, str]

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
    requests: dict[_Key, float]


class MetricsState:
    """The latest snapshot and the counters accumulated over all snapshots seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._decoded: dict[_Key, float] = {}
        self._pending: dict[tuple[str, str], float] = {}  # estimated tokens no record has confirmed yet
        self._requests: dict[_Key, float] = {}
        self._last_mono_s: float | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self))

    def observe(self, snapshot: Snapshot) -> None:
        """Take a new snapshot: swap it in and add its requests and decoded tokens to the counters."""
        with self._lock:
            kinds = {s.url: s.kind for s in snapshot.servers}
            for record in snapshot.requests:
                key = (record.server, kinds.get(record.server, record.server_kind), record.model)
                self._requests[key] = self._requests.get(key, 0.0) + 1.0
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

    def observed(self) -> _Observed:
        with self._lock:
            return _Observed(self._snapshot, dict(self._decoded), dict(self._requests))


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
        requests = CounterMetricFamily("llm_tray_requests", "Finished requests seen.", labels=MODEL_LABELS)
        for key, value in sorted(observed.requests.items()):
            requests.add_metric([_server_label(key[0]), *key[1:]], value)
        decoded = CounterMetricFamily(
            "llm_tray_decoded_tokens",
            "Decoded tokens: polled decode rate x interval, topped up from finished-request records.",
            labels=MODEL_LABELS,
        )
        for dkey, value in sorted(observed.decoded.items()):
            decoded.add_metric([_server_label(dkey[0]), *dkey[1:]], value)
        yield requests
        yield decoded
        if snapshot is None:
            return
        yield from self._snapshot_metrics(snapshot)

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
        for key, count in sorted(counts.items()):
            alerts.add_metric(list(key), float(count))
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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class Exporter:
    """A running /metrics listener; `port` is the bound port (useful with port 0)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
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


def start_exporter(state: MetricsState, address: str = DEFAULT_ADDRESS, port: int = DEFAULT_PORT) -> Exporter:
    """Serve `state.registry` on http://address:port/metrics from a daemon thread.

    Binds 127.0.0.1 by default; `port=0` picks a free port (see `Exporter.port`).
    Raises OSError when the port is taken.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(_Server):
        address_family = family

    server = make_server(address, port, make_wsgi_app(state.registry), server_class=Server,
                         handler_class=_QuietHandler)  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, name="llm-tray-metrics", daemon=True)
    thread.start()
    return Exporter(server, thread)
