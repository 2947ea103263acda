"""Each threshold's facts in one place (core/thresholds.py): its default, range, label and unit;
the config parser's range check reads that range."""

from __future__ import annotations

import sys
from dataclasses import fields

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from trayapp.config.settings import parse_settings
from trayapp.core.thresholds import THRESHOLD_INFO, Thresholds


def test_every_field_has_a_label_and_a_range_holding_its_default() -> None:
    assert list(THRESHOLD_INFO) == [f.name for f in fields(Thresholds)]
    for name, info in THRESHOLD_INFO.items():
        assert info.label.strip(), name
        assert info.low < info.high, name
        assert info.low <= getattr(Thresholds(), name) <= info.high, name


def test_the_unit_agrees_with_the_name() -> None:
    for name, info in THRESHOLD_INFO.items():
        if name.endswith("_tok_s"):
            assert info.unit == "tok/s", name
        elif name.endswith("_s"):
            assert info.unit == "s", name
        elif name.endswith("_pct"):
            assert info.unit == "%", name


def test_captions() -> None:
    assert THRESHOLD_INFO["below_floor_tok_s"].caption == "Floor (tok/s)"
    assert THRESHOLD_INFO["kv_slowdown_pct"].caption == "KV slowdown (%)"
    assert THRESHOLD_INFO["draft_acceptance_min"].caption == "Minimum draft acceptance"  # a share: no unit


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("kv_slowdown_pct = 96", "thresholds.kv_slowdown_pct: 96 is out of range (1 to 95)"),
        ("kv_slowdown_pct = 0.5", "thresholds.kv_slowdown_pct: 0.5 is out of range (1 to 95)"),
        ("offload_gpu_fraction = 0.4", "thresholds.offload_gpu_fraction: 0.4 is out of range (0.5 to 1)"),
        ("cold_load_min_s = 3601", "thresholds.cold_load_min_s: 3601 is out of range (0 to 3600)"),
        ("spec_min_speedup = 0.05", "thresholds.spec_min_speedup: 0.05 is out of range (0.1 to 10)"),
    ],
)
def test_a_value_out_of_range_is_refused_with_the_range(line: str, error: str) -> None:
    settings, errors = parse_settings(tomllib.loads(f"[thresholds]\n{line}\n"))
    assert errors == [error]
    assert settings.thresholds == Thresholds()  # the section falls back to the defaults


def test_the_range_ends_are_accepted() -> None:
    settings, errors = parse_settings({"thresholds": {"kv_slowdown_pct": 95, "offload_gpu_fraction": 0.5}})
    assert errors == []
    assert (settings.thresholds.kv_slowdown_pct, settings.thresholds.offload_gpu_fraction) == (95.0, 0.5)
