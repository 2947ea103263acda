"""Speculative decoding as of llama-server 11434: every `--spec-type` named, and the per-position
draft acceptance from `/metrics` (captured with `-md MODEL --spec-type draft-simple,ngram-map-k`)."""

from __future__ import annotations

from pathlib import Path

from trayapp.core.model import CounterReading
from trayapp.core.rate_helpers import acceptance_by_position
from trayapp.core.spec_types import SPEC_TYPE_LABELS, spec_type_names, speculative_text
from trayapp.sources.servers.llamacpp_parse import parse_metrics

# `llama-server --help` of build 11434: "--spec-type none,draft-simple,draft-eagle3,draft-mtp,…"
HELP_LIST = (
    "none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,draft-dspark,ngram-simple,ngram-map-k,"
    "ngram-map-k4v,ngram-mod,ngram-cache"
)


def test_every_current_spec_type_is_named() -> None:
    kinds = HELP_LIST.split(",")[1:]
    assert list(SPEC_TYPE_LABELS) == kinds
    names = spec_type_names(HELP_LIST)  # as /slots lists them: "none" first
    assert [name.split(" ")[0] for name in names] == kinds
    assert spec_type_names("draft-eagle3") == ["draft-eagle3 (EAGLE-3 head)"]
    assert spec_type_names("draft-future") == ["draft-future"]  # a kind of a later build: as spelt
    assert spec_type_names("none") == [] and spec_type_names(None) == []


def test_per_position_counters_read_from_the_real_metrics(fixtures_dir: Path) -> None:
    """The capture: 12 drafts, 26 of 35 drafted tokens accepted: 11, 8, 7 at positions 0-2, then 0 up
    to position 47 (the draft maximum)."""
    text = (
        fixtures_dir / "llama-server" / "captured" / "metrics_spec_draft_simple_ngram_map_k.txt"
    ).read_text()
    counters = parse_metrics(text)
    assert counters.spec_drafts_total == 12 and counters.spec_accepted_tokens_total == 26
    assert counters.spec_accepted_per_position[:4] == (11.0, 8.0, 7.0, 0.0)
    assert len(counters.spec_accepted_per_position) == 48
    assert sum(counters.spec_accepted_per_position) == counters.spec_accepted_tokens_total
    # by hand: 11/12, 8/12, 7/12; positions never reached left off
    assert acceptance_by_position(None, counters) == (11 / 12, 8 / 12, 7 / 12)


def test_per_position_acceptance_between_two_readings() -> None:
    """By hand: 10 more drafts, 9 / 5 / 0 more accepted at positions 0-2 → 0.9, 0.5, 0.0."""
    before = CounterReading(spec_drafts_total=12, spec_accepted_per_position=(11, 8, 7, 0))
    after = CounterReading(spec_drafts_total=22, spec_accepted_per_position=(20, 13, 7, 0))
    assert acceptance_by_position(before, after) == (0.9, 0.5, 0.0)
    assert acceptance_by_position(after, after) == ()  # no drafts in between
    assert acceptance_by_position(None, CounterReading(spec_drafts_total=5)) == ()  # no positions reported


def test_the_model_cards_line() -> None:
    line = speculative_text("none,draft-simple,ngram-map-k", 26 / 35, (11 / 12, 8 / 12, 7 / 12))
    assert line == (
        "speculative: draft-simple (draft model), ngram-map-k (n-gram map) · acceptance 74 % "
        "· by position 92 · 67 · 58 %"
    )
    assert speculative_text(None, 0.5) == "draft acceptance 50 %"
    assert speculative_text(None, None) is None
