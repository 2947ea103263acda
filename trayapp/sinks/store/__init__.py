"""SQLite session log: samples, finished requests, sessions, hardware snapshots and alerts.

schema.py     tables, migrations (`PRAGMA user_version`), named-placeholder SQL, errors
lock.py       the one-writer lock on `<db>.lock`
rows.py       core records → rows (column → value dicts)
writer.py     `Store`: `record()` (one transaction a tick), retention
opening.py    `Store`'s opening: the writer's lock and private files, checks, recovery; reader fallbacks
reader.py     queries: rows for export, sessions, hardware and alerts in force
baselines.py  `Store.baseline()`: the best comparable earlier session, cached
"""

from __future__ import annotations

from trayapp.core.model import Baseline
from trayapp.sinks.store.baselines import BASELINE_CACHE_S
from trayapp.sinks.store.schema import (
    BOOL_COLUMNS,
    MIGRATIONS,
    TABLES,
    TIME_COLUMNS,
    Migration,
    StoreError,
    StoreLockedError,
    schema_version,
)
from trayapp.sinks.store.writer import HARDWARE_INTERVAL_S, PRUNE_INTERVAL_S, Store

__all__ = [
    "BASELINE_CACHE_S",
    "BOOL_COLUMNS",
    "HARDWARE_INTERVAL_S",
    "MIGRATIONS",
    "PRUNE_INTERVAL_S",
    "TABLES",
    "TIME_COLUMNS",
    "Baseline",
    "Migration",
    "Store",
    "StoreError",
    "StoreLockedError",
    "schema_version",
]
