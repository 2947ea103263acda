"""llama-server's speculative decoding kinds (`--spec-type`, build 11434) and how a model card names them.

`ModelStatus.spec_type` is the server's own comma-separated list ("draft-simple,ngram-map-k"); each
kind is named by what it drafts with. A kind this table does not know is shown as the server spells it.
"""

from __future__ import annotations

from collections.abc import Sequence

from trayapp.core.units import format_pct

# every kind `llama-server --help` lists in build 11434, besides `none`
SPEC_TYPE_LABELS: dict[str, str] = {
    "draft-simple": "draft model",
    "draft-eagle3": "EAGLE-3 head",
    "draft-mtp": "multi-token prediction head",
    "draft-dflash": "DFlash drafter",
    "draft-dspark": "DSpark drafter",
    "ngram-simple": "n-gram",
    "ngram-map-k": "n-gram map",
    "ngram-map-k4v": "n-gram map",
    "ngram-mod": "n-gram",
    "ngram-cache": "n-gram cache",
}


def spec_type_names(spec_type: str | None) -> list[str]:
    """'draft-eagle3,ngram-mod' → ['draft-eagle3 (EAGLE-3 head)', 'ngram-mod (n-gram)']."""
    kinds = [kind.strip() for kind in (spec_type or "").split(",") if kind.strip() and kind.strip() != "none"]
    return [f"{kind} ({SPEC_TYPE_LABELS[kind]})" if kind in SPEC_TYPE_LABELS else kind for kind in kinds]


def speculative_text(
    spec_type: str | None, acceptance: float | None, by_position: Sequence[float] = ()
) -> str | None:
    """'speculative: draft-simple (draft model) · acceptance 74 % · by position 92 · 67 · 58 %';
    None without speculative decoding (or anything measured of it)."""
    parts = []
    names = spec_type_names(spec_type)
    if names:
        parts.append("speculative: " + ", ".join(names))
    if acceptance is not None:
        parts.append(f"{'acceptance' if names else 'draft acceptance'} {format_pct(acceptance)}")
    if by_position:
        shares = [f"{share * 100:.0f}" for share in by_position]
        parts.append("by position " + " · ".join(shares) + " %")
    return " · ".join(parts) or None
