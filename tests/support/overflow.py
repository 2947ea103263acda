"""A real llama-server with a context too small (#20), as the overflow tests drive it: the prompts,
one request, and the sampler's loop until the alert shows."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import Alert, Snapshot
from trayapp.services.monitor import Monitor

N_CTX = 256
ALERT_WITHIN_S = 2.0
PROFILE = HardwareProfile(ram_bandwidth_gbps=30.0)  # given: no RAM benchmark competes for the cores
LONG_PROMPT = "word " * 400  # ~400 tokens: more than 256
FILLING_PROMPT = "word " * 200  # ~200 tokens: leaves ~55 for the answer


def post_completion(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST /completion: (HTTP status, the JSON body)."""
    with httpx.Client(trust_env=False, timeout=240) as client:
        response = client.post(url + "/completion", json=body)
    return response.status_code, response.json()


def overflow_alerts(snapshot: Snapshot) -> list[Alert]:
    return [a for a in snapshot.alerts if a.kind == "context_overflow"]


def tick_until_alert(monitor: Monitor, answered_mono_s: float, limit_s: float = 10.0) -> list[Snapshot]:
    """The sampler's loop (a tick a second) until the alert shows (bounded)."""
    snapshots: list[Snapshot] = []
    pace = threading.Event()
    while time.monotonic() - answered_mono_s < limit_s:
        snapshots.append(monitor.tick())
        if overflow_alerts(snapshots[-1]):
            break
        pace.wait(1.0)
    return snapshots
