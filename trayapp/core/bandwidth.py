"""When a live decode rate proves the measured RAM bandwidth too low.

Every decoded token reads at least the model's weight bytes per token from the
memory that holds them, so for a model that runs on the CPU

    decode_tok_s × bytes_per_token  ≤  RAM bandwidth.

A rate above that bound means the figure was measured badly (a busy machine,
a throttled moment), not that the model beats physics: the figure is suspect.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from trayapp.core.hardware_readings import HostReading
from trayapp.core.loopback import is_this_machine_url
from trayapp.core.model import ModelStatus, Snapshot
from trayapp.core.units import GB

# A measured rate may exceed the bound by a little (rate noise, a figure read a few % low).
CONTRADICTION_TOLERANCE = 1.10


def bandwidth_contradicted(
    decode_tok_s: float | None,
    bytes_per_token: float | None,
    bandwidth_gbps: float | None,
    tolerance: float = CONTRADICTION_TOLERANCE,
) -> bool:
    """True when decoding at `decode_tok_s` needs more than `bandwidth_gbps` × `tolerance`."""
    values = (decode_tok_s, bytes_per_token, bandwidth_gbps)
    if any(v is None or not math.isfinite(v) or v <= 0 for v in values):
        return False
    assert decode_tok_s is not None and bytes_per_token is not None and bandwidth_gbps is not None
    return decode_tok_s * bytes_per_token / GB > bandwidth_gbps * tolerance


def contradicting_model(snapshot: Snapshot, bandwidth_gbps: float | None) -> ModelStatus | None:
    """The first local, CPU-resident model whose decode rate contradicts `bandwidth_gbps`, if any.

    Only evidence that is a true lower bound counts: exact bytes per token (an
    estimate from the file size overstates a MoE), no speculative decoding
    (several tokens per weight read), a server on this machine, and a model
    wholly on the CPU (gpu_fraction 0, or no GPU at all).
    """
    has_gpu = bool(snapshot.hardware.gpus)
    for server in snapshot.servers:
        if server.pid is None and not is_this_machine_url(server.url):
            continue
        for model in server.models:
            on_cpu = model.gpu_fraction == 0 or not has_gpu
            if not on_cpu or not model.bytes_per_token_exact or model.draft_acceptance is not None:
                continue
            rate = model.decode_tok_s if model.decode_tok_s is not None else model.last_decode_tok_s
            if bandwidth_contradicted(rate, model.bytes_per_token, bandwidth_gbps):
                return model
    return None


_CONFIDENCE_NOTES = {
    "quiet": "quiet",
    "provisional": "provisional: the machine was busy",
    "suspect": "suspect: a CPU decode rate exceeds it",
}


def ram_bandwidth_note(host: HostReading) -> str:
    """Where the RAM bandwidth comes from, for humans: 'measured 2026-11-30 09:16 UTC, quiet' or 'given'."""
    if host.ram_bandwidth_measured_wall_s is None:
        return host.ram_bandwidth_source
    measured = datetime.fromtimestamp(host.ram_bandwidth_measured_wall_s, tz=timezone.utc)
    when = measured.strftime("%Y-%m-%d %H:%M")
    note = f"{host.ram_bandwidth_source} {when} UTC"
    confidence = host.ram_bandwidth_confidence
    return f"{note}, {_CONFIDENCE_NOTES.get(confidence, confidence)}" if confidence else note
