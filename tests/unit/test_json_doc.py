"""docs/json.md documents every field `status --json` / `watch --json` writes for a model."""

from __future__ import annotations

import re

from tests.support import snapshots
from tests.support.paths import TESTS_DIR
from trayapp.core.jsonview import model_json

JSON_DOC = TESTS_DIR.parent / "docs" / "json.md"


def test_every_model_field_is_documented() -> None:
    documented = set(re.findall(r'^\s*"([a-z_]+)":', JSON_DOC.read_text(encoding="utf-8"), flags=re.M))
    written = set(model_json(snapshots.model("qwen3:8b", "idle")))
    assert written - documented == set(), "fields written but not in docs/json.md"


def test_every_hardware_field_is_documented() -> None:
    """The hardware object's keys, the RAM bandwidth's last change (#24) and its keys included."""
    from trayapp.core.hardware_readings import RamBandwidthChange
    from trayapp.core.jsonview import hardware_json

    documented = set(re.findall(r'^\s*"([a-z_]+)":', JSON_DOC.read_text(encoding="utf-8"), flags=re.M))
    change = RamBandwidthChange(28.4, 31.3, 1_764_684_000.0, "first quiet measurement")
    doc = hardware_json(snapshots.hardware_snapshot(ram_bandwidth_change=change))
    written = set(doc) | set(doc["ram_bandwidth_change"])
    assert written - documented == set(), "fields written but not in docs/json.md"
