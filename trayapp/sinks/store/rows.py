"""Core records → store rows: one column → value mapping per table, in this module only.

Every row is a dict keyed by column name and written with named placeholders
(`schema.write_sql`), so a value can only land in the column that bears its name. Records
whose fields are the table's columns (`RequestRecord`, `SessionRecord`) are mapped field by
field; a field without a column fails the write loudly instead of being dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import fields

from trayapp.core.bench import BenchResult
from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import Alert, ModelStatus, RequestRecord, ServerStatus, SessionRecord
from trayapp.core.redact import redact_url

Row = dict[str, object]

# ModelStatus fields a sample stores under their own names (besides time, server and model name).
SAMPLE_FIELDS = (
    "session_id", "phase", "decode_tok_s", "decode_total_tok_s", "active_streams", "decode_exact",
    "prompt_tok_s", "ttft_s", "context_tokens", "context_length", "ceiling_tok_s", "full_gpu_ceiling_tok_s",
    "gpu_fraction", "vram_bytes", "draft_acceptance", "ttft_exact",
)  # fmt: skip


def finite(value: float | None) -> float | None:
    """A finite float or None (SQLite has no NaN; exports must not carry one)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def cell(value: object) -> object:
    """A value as SQLite stores it: bools as 0/1, floats finite or None, the rest unchanged."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return finite(value)
    return value


def _cells(record: object, names: Iterable[str]) -> Row:
    return {name: cell(getattr(record, name)) for name in names}


def _field_names(record: object) -> list[str]:
    return [f.name for f in fields(record)]  # type: ignore[arg-type]


def session_from_row(row: Mapping[str, object]) -> SessionRecord:
    """The `SessionRecord` a `sessions` row holds: the inverse of `session_row`."""
    values = {name: row[name] for name in _field_names(SessionRecord) if name not in ("id", "alerts")}
    alerts = tuple(kind for kind in str(row["alerts"] or "").split(",") if kind)
    return SessionRecord(id=str(row["session_id"]), alerts=alerts, **values)  # type: ignore[arg-type]


def sample_row(t_wall_s: float, server: ServerStatus, model: ModelStatus) -> Row:
    """A `samples` row: one model's live state at one tick."""
    return {
        "t_wall_s": t_wall_s,
        "server": redact_url(server.url),
        "server_kind": server.kind,
        "model": model.name,
        **_cells(model, SAMPLE_FIELDS),
    }


def request_row(record: RequestRecord) -> Row:
    """A `requests` row: every field under its own name, the server URL redacted."""
    row = _cells(record, _field_names(record))
    row["server"] = redact_url(record.server)
    return row


def session_row(record: SessionRecord) -> Row:
    """A `sessions` row: `id` as `session_id`, alert kinds comma-joined, the server URL redacted."""
    row: Row = {"session_id": record.id}
    row.update(_cells(record, (name for name in _field_names(record) if name != "id")))
    row["server"] = redact_url(record.server)
    row["alerts"] = ",".join(record.alerts)
    return row


def alert_row(alert: Alert) -> Row:
    """An `alerts` row: one episode; the evidence as compact, sorted JSON."""
    evidence = json.dumps(dict(alert.evidence), default=str, sort_keys=True, separators=(",", ":"))
    return {
        "alert_id": alert.id,
        "kind": alert.kind,
        "severity": alert.severity,
        "server": redact_url(alert.server),
        "model": alert.model,
        "message": alert.message,
        "fix": alert.fix,
        "cause": alert.cause,
        "started_wall_s": alert.since_wall_s,
        "ended_wall_s": alert.ended_wall_s,
        "peak": finite(alert.peak),
        "evidence_json": evidence,
        "fix_commands_json": json.dumps(list(alert.fix_commands)) if alert.fix_commands else None,
    }


def hardware_row(t_wall_s: float, hw: HardwareSnapshot) -> Row:
    """A `hardware` row: totals, the first GPU's bandwidth, the host, and every GPU as JSON."""
    first = hw.gpus[0] if hw.gpus else None
    gpus = [
        {
            "index": g.index,
            "name": g.name,
            "vendor": g.vendor,
            "vram_total_bytes": g.vram_total_bytes,
            "vram_used_bytes": g.vram_used_bytes,
            "bandwidth_gbps": finite(g.bandwidth_gbps),
            "bandwidth_source": g.bandwidth_source,
            "unified_memory": g.unified_memory,
            "throttle_reasons": list(g.throttle_reasons),
        }
        for g in hw.gpus
    ]
    host = hw.host
    return {
        "t_wall_s": t_wall_s,
        "gpu_names": ",".join(g.name for g in hw.gpus),
        "gpu_count": len(hw.gpus),
        "vram_used_bytes": _sum_known(g.vram_used_bytes for g in hw.gpus),
        "vram_total_bytes": _sum_known(g.vram_total_bytes for g in hw.gpus),
        "gpu_bandwidth_gbps": finite(first.bandwidth_gbps) if first else None,
        "gpu_bandwidth_source": first.bandwidth_source if first else None,
        "ram_total_bytes": host.ram_total_bytes,
        "ram_available_bytes": host.ram_available_bytes,
        "ram_bandwidth_gbps": finite(host.ram_bandwidth_gbps),
        "ram_bandwidth_source": host.ram_bandwidth_source,
        "gpu_reason": hw.gpu_reason,
        "gpus_json": json.dumps(gpus, separators=(",", ":")),
    }


def hardware_signature(hw: HardwareSnapshot) -> tuple[object, ...]:
    """What must change for a hardware row to be written before `HARDWARE_INTERVAL_S` is up."""
    gpus = tuple((g.name, g.vram_total_bytes, g.bandwidth_gbps, g.bandwidth_source) for g in hw.gpus)
    host = hw.host
    return gpus, host.ram_total_bytes, host.ram_bandwidth_gbps, host.ram_bandwidth_source, hw.gpu_reason


def _sum_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def bench_rows(result: BenchResult) -> list[Row]:
    """One `bench` row per measured sweep depth (depth 0: the decode runs), numbers and the key only."""
    t = result.target
    judged = result.healthy.verdict != "not_judged"
    out: list[Row] = []
    for point in result.sweep:
        if point.decode_tok_s is None:
            continue
        ceiling = point.ceiling_tok_s
        row: Row = {
            "started_wall_s": result.started_wall_s,
            "finished_wall_s": result.finished_wall_s,
            "model": t.model,
            "quantization": t.quantization,
            "hardware": t.hardware,
            "server_kind": t.server_kind,
            "server_version": t.server_version,
            "spec_type": t.spec_type,
            "depth_tokens": point.depth_tokens,
            "context_tokens": point.context_tokens,
            "decode_tok_s": point.decode_tok_s,
            "decode_spread_tok_s": point.spread.tok_s,
            "decode_cv": point.spread.cv,
            "decode_exact": result.decode_exact,
            "runs": point.runs,
            "ceiling_tok_s": ceiling,
            "efficiency": point.decode_tok_s / ceiling if ceiling else None,
            "judged": judged,
            "gpu_fraction": t.gpu_fraction,
            "ttft_s": result.ttft_s,
            "prompt_tok_s": result.prompt_tok_s,
        }
        out.append({k: cell(v) for k, v in row.items()})
    return out
