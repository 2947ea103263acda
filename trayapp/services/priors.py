"""What the store knows that a tick compares with (the pipeline's `Priors`): the baselines of the models
decoding at the last tick, and the bench calibrations and rates of every local model."""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

from trayapp.config.bugs import BugLog
from trayapp.core.machine import Machine
from trayapp.core.model import Baseline, Snapshot
from trayapp.core.pipeline import hardware_label

if TYPE_CHECKING:
    from trayapp.sinks.store import Store

log = logging.getLogger(__name__)


def stored_baselines(
    store: Store | None,
    last_snapshot: Snapshot | None,
    machines: dict[str, Machine],
    default: Machine,
    now_wall_s: float,
    bugs: BugLog,
) -> tuple[dict[tuple[str, str], Baseline], dict[tuple[str, str], Baseline]]:
    """The store's baselines of every model that was decoding at the last tick (the store caches
    them): the comparable one (same speculative decoding) and, for a model decoding with
    speculative decoding, the plain-decode one its speed-up is measured against."""
    comparable: dict[tuple[str, str], Baseline] = {}
    plain: dict[tuple[str, str], Baseline] = {}
    if store is None or last_snapshot is None:
        return comparable, plain
    for server, model in last_snapshot.models():
        if model.phase != "decoding" or model.session_id is None or server.machine is not None:
            continue
        key = (server.url, model.name)
        label = hardware_label(machines.get(server.url, default))
        kinds = (model.spec_type, None) if model.spec_type else (None,)
        for spec_type in kinds:
            try:
                baseline = store.baseline(
                    model=model.name,
                    quantization=model.quantization,
                    hardware=label,
                    context_tokens=model.context_tokens,
                    before_wall_s=now_wall_s,
                    exclude_session=model.session_id,
                    spec_type=spec_type,
                )
            except sqlite3.Error as exc:  # a store problem must not stop monitoring
                log.warning("baseline lookup failed: %s", exc)
                continue
            except Exception as exc:
                bugs.report(exc, "store: baseline lookup")
                continue
            if baseline is None:
                continue
            if spec_type == model.spec_type:
                comparable[key] = baseline
            if spec_type is None:
                plain[key] = baseline
    return comparable, plain


def stored_bench_priors(
    store: Store | None,
    last_snapshot: Snapshot | None,
    machines: dict[str, Machine],
    default: Machine,
    now_wall_s: float,
    bugs: BugLog,
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Every local model's calibration (its benched efficiency on this hardware) and bench
    decode rate at depth 0, where it was benched: the dashboard's band and bench line, and
    `low_efficiency`'s floor. The store caches them."""
    calibrations: dict[tuple[str, str], float] = {}
    rates: dict[tuple[str, str], float] = {}
    if store is None or last_snapshot is None:
        return calibrations, rates
    for server, model in last_snapshot.models():
        if server.machine is not None:
            continue
        key = (server.url, model.name)
        label = hardware_label(machines.get(server.url, default))
        try:
            calibration = store.calibration(model=model.name, hardware=label, before_wall_s=now_wall_s)
            rate = store.bench_rate(
                model=model.name, quantization=model.quantization, hardware=label, before_wall_s=now_wall_s
            )
        except sqlite3.Error as exc:  # a store problem must not stop monitoring
            log.warning("bench lookup failed: %s", exc)
            continue
        except Exception as exc:
            bugs.report(exc, "store: bench lookup")
            continue
        if calibration is not None:
            calibrations[key] = calibration
        if rate is not None:
            rates[key] = rate
    return calibrations, rates
