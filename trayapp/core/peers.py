"""Peers: published decode results of other machines, as shares of their bandwidth ceiling (#23).

The table (`trayapp/data/peers.json`, loaded by `sources/peers_table.py`, rebuilt by
`bench/peers_build.py`) holds results as published: hardware, bandwidth, engine, model, quantization,
decode tok/s and the URL each row came from. This module is the physics on top of it, pure:

* **one bytes-per-token rule for every row**: active parameters × the whole-file bits per weight of
  its quantization (`core/quants.EFFECTIVE_BPW`) ÷ 8, the rule `llm-tray ceiling --params --quant`
  uses; only a quantization that table does not know (Unsloth's "Q4_K_XL") falls back to the file
  size the row publishes. Llama 2 7B Q4_0: 6.74 B × 4.60 ÷ 8 = 3.88 GB (its file: 3.56 GiB = 3.82 GB);
* **share** = decode tok/s × bytes per token ÷ bandwidth, so an M2 Max compares with an M4 Max and
  a Q4_0 with a Q4_K_M;
* **bands** per hardware class and quantization group: the median and the interquartile range of the
  shares, from the nearest scope that has enough rows (this chip, its class, its family);
* what usually explains a machine far below its peers, and what to try first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import median
from typing import Literal, get_args

from trayapp.core.quants import EFFECTIVE_BPW, normalize_quant_name
from trayapp.core.server_kinds import SERVER_KINDS
from trayapp.core.units import GB

PEERS_SCHEMA = "llm-tray-peers"
PEERS_VERSION = 1

Family = Literal["apple", "nvidia", "amd", "intel", "cpu"]
FAMILIES: tuple[Family, ...] = ("apple", "nvidia", "amd", "intel", "cpu")
FAMILY_LABELS: dict[Family, str] = {
    "apple": "Apple",
    "nvidia": "NVIDIA",
    "amd": "AMD",
    "intel": "Intel",
    "cpu": "CPU",
}
BACKENDS = ("metal", "cuda", "vulkan", "rocm", "cpu", "mlx")
# llama.cpp itself (llama-bench, llama-cli) or a server kind (core/server_kinds.py) that ran the model.
ENGINES: tuple[str, ...] = ("llama.cpp", *SERVER_KINDS)

MIN_PEERS = 3  # fewer rows than this in every scope: "too few peers to judge"
SHORT_CONTEXT_TOKENS = 4096  # bands use results at this depth or less (deeper ones read the KV cache too)

# Human names of the hardware classes (`hardware_class`), for labels and `llm-tray peers`.
CLASS_LABELS: dict[str, str] = {
    "apple-base": "Apple base chips (M1–M5)",
    "apple-pro": "Apple Pro chips",
    "apple-max": "Apple Max chips",
    "apple-ultra": "Apple Ultra chips",
    "nvidia-turing": "NVIDIA Turing (RTX 20)",
    "nvidia-ampere": "NVIDIA Ampere (RTX 30, A-series)",
    "nvidia-ada": "NVIDIA Ada (RTX 40, L40)",
    "nvidia-hopper": "NVIDIA Hopper (H100)",
    "nvidia-blackwell": "NVIDIA Blackwell (RTX 50, RTX PRO, GB10)",
    "nvidia-other": "NVIDIA (other)",
    "amd-gpu": "AMD Radeon GPUs",
    "amd-apu": "AMD APUs (Strix Halo)",
    "intel-arc": "Intel Arc GPUs",
    "cpu": "CPUs (against measured bandwidth)",
}

# Quantization groups a band is drawn for ("Q4": Q4_0, Q4_K_M, IQ4_NL, MXFP4 …).
QUANT_GROUPS = ("F16", "Q8", "Q5-Q6", "Q4", "Q2-Q3")


@dataclass(frozen=True)
class PeerRow:
    """One published result, as published (units in the names; GB = 10^9 bytes)."""

    hardware: str  # "Apple M2 Max", "RTX 4090"
    hw_key: str  # the bandwidth table's name of the part ("M2 Max", "RTX 4090"); "" when not in it
    family: Family
    hw_class: str  # a key of CLASS_LABELS
    gpu_cores: int | None
    bandwidth_gbps: float
    bandwidth_basis: str  # "spec" or "measured"
    engine: str
    backend: str
    build: str | None
    model: str
    arch: str
    params_b: float  # total parameters, billions
    active_params_b: float  # read per token (MoE: the routed experts); = params_b for a dense model
    moe: bool
    quant: str
    file_gb: float | None  # the model file's size as published, GB
    context_tokens: int  # context depth the decode was measured at
    threads: int | None
    decode_tok_s: float
    prompt_tok_s: float | None
    date: str  # YYYY-MM-DD: published (or, for a thread's summary table, the thread's start)
    source_url: str
    verified: bool  # the figures were read in the original source (False: a secondary transcription)
    note: str = ""


ROW_FIELDS: tuple[str, ...] = tuple(PeerRow.__dataclass_fields__)


class PeerTableError(ValueError):
    """The peer table does not match its schema."""


def parse_table(doc: Mapping[str, object]) -> tuple[PeerRow, ...]:
    """Rows of a peer-table document (`{"schema", "version", "rows"}`); PeerTableError when it does
    not match the schema or a row is implausible (`row_problems`)."""
    if doc.get("schema") != PEERS_SCHEMA or doc.get("version") != PEERS_VERSION:
        raise PeerTableError(f"not a {PEERS_SCHEMA} v{PEERS_VERSION} document")
    raw = doc.get("rows")
    if not isinstance(raw, list):
        raise PeerTableError("rows must be a list")
    rows: list[PeerRow] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != set(ROW_FIELDS):
            raise PeerTableError(f"row {index}: fields must be exactly {', '.join(ROW_FIELDS)}")
        row = PeerRow(**item)
        problems = row_problems(row)
        if problems:
            raise PeerTableError(
                f"row {index} ({row.hardware}, {row.model} {row.quant}): {'; '.join(problems)}"
            )
        rows.append(row)
    return tuple(rows)


_DATE_RE = re.compile(r"^20\d\d-[01]\d-[0-3]\d$")


def row_problems(row: PeerRow) -> list[str]:
    """What is wrong with a row: types, units and plausible ranges (empty: none)."""
    problems: list[str] = []

    def number(name: str, value: object, low: float, high: float, optional: bool = False) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"{name} is not a number")
        elif not low <= value <= high:
            problems.append(f"{name} {value} outside {low}–{high}")

    for name in ("hardware", "engine", "backend", "model", "arch", "quant", "date", "source_url"):
        if not isinstance(getattr(row, name), str) or not getattr(row, name):
            problems.append(f"{name} is empty")
    if row.family not in FAMILIES:
        problems.append(f"family {row.family!r} unknown")
    if row.hw_class not in CLASS_LABELS:
        problems.append(f"hw_class {row.hw_class!r} unknown")
    if row.engine not in ENGINES:
        problems.append(f"engine {row.engine!r} unknown")
    if row.backend not in BACKENDS:
        problems.append(f"backend {row.backend!r} unknown")
    if row.bandwidth_basis not in ("spec", "measured"):
        problems.append("bandwidth_basis must be spec or measured")
    number("bandwidth_gbps", row.bandwidth_gbps, 5, 10_000)
    number("params_b", row.params_b, 0.1, 2_000)
    number("active_params_b", row.active_params_b, 0.1, 2_000)
    number("decode_tok_s", row.decode_tok_s, 0.1, 2_000)
    number("prompt_tok_s", row.prompt_tok_s, 1, 100_000, optional=True)
    number("file_gb", row.file_gb, 0.05, 2_000, optional=True)
    number("gpu_cores", row.gpu_cores, 1, 1_000, optional=True)
    number("threads", row.threads, 1, 1_024, optional=True)
    number("context_tokens", row.context_tokens, 0, 1_048_576)
    if isinstance(row.active_params_b, (int, float)) and isinstance(row.params_b, (int, float)):
        if row.active_params_b > row.params_b:
            problems.append("active_params_b exceeds params_b")
        if not row.moe and row.active_params_b != row.params_b:
            problems.append("a dense model reads all its parameters")
    if isinstance(row.date, str) and not _DATE_RE.match(row.date):
        problems.append(f"date {row.date!r} is not YYYY-MM-DD")
    if isinstance(row.source_url, str) and not row.source_url.startswith("https://"):
        problems.append("source_url is not an https URL")
    if not problems:
        share = bandwidth_share(row)
        if share is None:
            problems.append("no bytes per token: quantization unknown and no file size")
        elif not 0.02 <= share <= 1.05:
            problems.append(f"share of bandwidth {share:.2f} is not physical")
    return problems


# --------------------------------------------------------------------------- the physics


def peer_bytes_per_token(row: PeerRow) -> float | None:
    """Weight bytes one decoded token reads: active parameters × bits per weight ÷ 8 (core/quants),
    or the published file size (× the active share) when the quantization has no bits-per-weight figure."""
    bpw = EFFECTIVE_BPW.get(normalize_quant_name(row.quant) or "")
    if bpw is not None:
        return row.active_params_b * GB * bpw / 8
    if row.file_gb:
        return row.file_gb * GB * row.active_params_b / row.params_b
    return None


def bandwidth_share(row: PeerRow) -> float | None:
    """The row's decode as a share of its ceiling: tok/s × bytes per token ÷ bandwidth."""
    n_bytes = peer_bytes_per_token(row)
    if n_bytes is None or row.bandwidth_gbps <= 0:
        return None
    return row.decode_tok_s * n_bytes / (row.bandwidth_gbps * GB)


def quant_group(quant: str | None) -> str | None:
    """The group a quantization is banded in ("Q4_K_M" -> "Q4"); None when unknown."""
    if not quant:
        return None
    name = quant.strip().upper()
    if name in ("F16", "BF16", "F32", "FP16"):
        return "F16"
    if name.startswith(("Q8", "MLX_8")):
        return "Q8"
    if name.startswith(("Q5", "Q6", "MLX_6")):
        return "Q5-Q6"
    if name.startswith(("Q4", "IQ4", "MXFP4", "NVFP4", "MLX_4")):
        return "Q4"
    if name.startswith(("Q2", "Q3", "IQ2", "IQ3", "IQ1", "TQ", "MLX_3")):
        return "Q2-Q3"
    return None


def hardware_class(vendor: str, family: str, name: str) -> tuple[Family, str]:
    """(family, class) of a part from its vendor, its bandwidth-table family and its name."""
    text = f"{vendor} {family} {name}".lower()
    if "apple" in text or re.search(r"\bm[1-9]\b", text):
        for tier in ("ultra", "max", "pro"):
            if tier in name.lower():
                return "apple", f"apple-{tier}"
        return "apple", "apple-base"
    if "nvidia" in text:
        for keys, cls in (
            (("blackwell", "rtx 50", "gb10", "b200"), "nvidia-blackwell"),
            (("hopper", "h100", "h200", "gh200"), "nvidia-hopper"),
            (("ada", "rtx 40", "l40", "l4 "), "nvidia-ada"),
            (("ampere", "rtx 30", "a100", "a40", "a6000", "a4000", "a2000", "a5000"), "nvidia-ampere"),
            (("turing", "rtx 20", "t4"), "nvidia-turing"),
        ):
            if any(k in text for k in keys):
                return "nvidia", cls
        return "nvidia", "nvidia-other"
    if "amd" in text or "radeon" in text:
        return "amd", ("amd-apu" if any(k in text for k in ("apu", "strix", "ryzen ai")) else "amd-gpu")
    if "intel" in text and "arc" in text:
        return "intel", "intel-arc"
    return "cpu", "cpu"


# --------------------------------------------------------------------------- bands


PeerScope = Literal["hardware", "class", "family"]
PEER_SCOPES: tuple[PeerScope, ...] = get_args(PeerScope)


@dataclass(frozen=True)
class PeerBand:
    """The shares of the nearest peers with enough results: median, interquartile band, range."""

    basis: str  # what the peers are: "M2 Max, Q4", "Apple Max chips, Q4", "CPUs, any quantization"
    scope: PeerScope
    quant_group: str | None  # None: every quantization
    n: int
    median_share: float
    low_share: float  # 25th percentile
    high_share: float  # 75th percentile
    min_share: float
    max_share: float
    causes: tuple[str, ...] = ()  # what usually explains a machine far below them (`likely_causes`)

    @property
    def label(self) -> str:
        """ "peers on M2 Max, Q4: 52–62 %, n=14" """
        return f"peers on {self.basis}: {self.low_share * 100:.0f}–{self.high_share * 100:.0f} %, n={self.n}"


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def band_of(rows: Iterable[PeerRow], basis: str, scope: PeerScope, group: str | None) -> PeerBand | None:
    """The band of these rows' shares (None when there are none)."""
    shares = sorted(s for s in (bandwidth_share(r) for r in rows) if s is not None)
    if not shares:
        return None
    return PeerBand(
        basis=basis,
        scope=scope,
        quant_group=group,
        n=len(shares),
        median_share=median(shares),
        low_share=_quantile(shares, 0.25),
        high_share=_quantile(shares, 0.75),
        min_share=shares[0],
        max_share=shares[-1],
    )


@dataclass(frozen=True)
class PeerQuery:
    """The machine and model peers are looked up for."""

    family: Family
    hw_class: str
    hw_key: str = ""  # the bandwidth table's name of the part; "" when unknown
    quant: str | None = None
    hw_label: str = ""  # how to name the part in a label ("M2 Max"); defaults to hw_key


def scopes(
    rows: Sequence[PeerRow], query: PeerQuery
) -> list[tuple[str, PeerScope, str | None, list[PeerRow]]]:
    """Candidate peer sets, nearest first: this part, its class, its family; each with this
    quantization's group, then with any quantization. Short-context results only."""
    short = [r for r in rows if r.context_tokens <= SHORT_CONTEXT_TOKENS]
    group = quant_group(query.quant)
    part = query.hw_label or query.hw_key
    cls = CLASS_LABELS.get(query.hw_class, query.hw_class)
    fam = CLASS_LABELS["cpu"] if query.family == "cpu" else FAMILY_LABELS[query.family]
    levels: list[tuple[str, PeerScope, list[PeerRow]]] = []
    if query.hw_key:
        levels.append((part, "hardware", [r for r in short if r.hw_key == query.hw_key]))
    levels.append((cls, "class", [r for r in short if r.hw_class == query.hw_class]))
    if query.family != "cpu":
        levels.append((fam, "family", [r for r in short if r.family == query.family]))
    out: list[tuple[str, PeerScope, str | None, list[PeerRow]]] = []
    if group is not None:
        for name, scope, members in levels:
            out.append(
                (f"{name}, {group}", scope, group, [r for r in members if quant_group(r.quant) == group])
            )
    for name, scope, members in levels:
        out.append((f"{name}, any quantization", scope, None, members))
    return out


def band_for(rows: Sequence[PeerRow], query: PeerQuery, min_rows: int = MIN_PEERS) -> PeerBand | None:
    """The band of the nearest peer set with at least `min_rows` results; None: too few peers."""
    for basis, scope, group, members in scopes(rows, query):
        if len(members) >= min_rows:
            return band_of(members, basis, scope, group)
    return None


def peer_band_json(band: PeerBand) -> dict[str, object]:
    """A band as JSON (`status --json`, alert evidence, `bench --json`; docs/json.md)."""
    return {
        "basis": band.basis,
        "scope": band.scope,
        "quant_group": band.quant_group,
        "n": band.n,
        "median_share": round(band.median_share, 3),
        "low_share": round(band.low_share, 3),
        "high_share": round(band.high_share, 3),
        "min_share": round(band.min_share, 3),
        "max_share": round(band.max_share, 3),
        "label": band.label,
        "causes": list(band.causes),
    }


def band_with_causes(rows: Sequence[PeerRow], query: PeerQuery) -> PeerBand | None:
    """`band_for`, with what usually explains a machine far below the band (`likely_causes`)."""
    band = band_for(rows, query)
    return None if band is None else replace(band, causes=tuple(likely_causes(rows, query)))


# --------------------------------------------------------------------------- verdicts


Verdict = Literal["above its peers", "normal", "at the low end of its peers", "far below its peers"]


def verdict(share: float, band: PeerBand) -> Verdict:
    """Where a share sits in its peers' band."""
    if share > band.max_share:
        return "above its peers"
    if share >= band.low_share:
        return "normal"
    if share >= band.min_share:
        return "at the low end of its peers"
    return "far below its peers"


def peer_line(share: float | None, band: PeerBand | None) -> str:
    """One line for `bench`: "58 % of bandwidth; peers on M2 Max, Q4: 58 % median, 14 results,
    range 52–63 % — normal", or why there is no comparison."""
    own = "share of bandwidth unknown" if share is None else f"{share * 100:.0f} % of bandwidth"
    if band is None:
        return f"{own}; too few published peers to judge (fewer than {MIN_PEERS} on this hardware class)"
    text = (
        f"{own}; peers on {band.basis}: {band.median_share * 100:.0f} % median, {band.n} results, "
        f"range {band.min_share * 100:.0f}–{band.max_share * 100:.0f} %"
    )
    return text if share is None else f"{text} — {verdict(share, band)}"


def likely_causes(rows: Sequence[PeerRow], query: PeerQuery, backend: str | None = None) -> list[str]:
    """What usually explains a machine far below its peers, from the table, with what to try first:
    a quantization slow on this class of hardware, then the family's usual suspects."""
    causes: list[str] = []
    group = quant_group(query.quant)
    same_class = [
        r for r in rows if r.hw_class == query.hw_class and r.context_tokens <= SHORT_CONTEXT_TOKENS
    ]
    # Like-for-like alternatives: the same quantization group, and MLX's formats only for MLX.
    mlx = (query.quant or "").upper().startswith("MLX_")
    by_quant: dict[str, list[float]] = {}
    for r in same_class:
        share = bandwidth_share(r)
        if share is None or quant_group(r.quant) != group or r.quant.upper().startswith("MLX_") != mlx:
            continue
        by_quant.setdefault(r.quant, []).append(share)
    if query.quant and by_quant:
        own = by_quant.get(normalize_quant_name(query.quant) or query.quant) or by_quant.get(query.quant)
        best_quant, best = max(((q, median(v)) for q, v in by_quant.items()), key=lambda item: item[1])
        if own and median(own) < 0.75 * best:
            causes.append(
                f"{query.quant} runs slow on this hardware class in the published results "
                f"({median(own) * 100:.0f} % of bandwidth against {best * 100:.0f} % for {best_quant}): "
                f"try {best_quant} first"
            )
        elif group == "Q2-Q3" or (query.quant or "").upper().endswith("_XL"):
            causes.append(
                f"{query.quant}'s blocks cost more to unpack than Q4_0/Q4_K_M: compare with a standard Q4"
            )
    if query.family == "cpu":
        causes.append(
            "too few threads, or threads that sleep between tokens: set --threads to the physical cores "
            "and OMP_WAIT_POLICY=active (a Pi 5 in the table lost 7 % to the default)"
        )
    else:
        causes.append(
            "part of the model in system RAM (partial offload): check the GPU share; "
            "a smaller context or a smaller quantization keeps it all on the GPU"
        )
        if query.family in ("nvidia", "amd"):
            causes.append("a power or clock cap, or a hot card: check the power limit and clocks under load")
        if query.family == "apple":
            causes.append("another app holding the GPU, or Low Power Mode: close it, plug in")
    if backend == "vulkan" and query.family == "nvidia":
        causes.append("the Vulkan backend on an NVIDIA card: try the CUDA build")
    return causes


# --------------------------------------------------------------------------- before buying


@dataclass(frozen=True)
class Prediction:
    """Decode tok/s predicted from a peer band × a bandwidth ÷ bytes per token."""

    band: PeerBand
    ceiling_tok_s: float
    low_tok_s: float
    median_tok_s: float
    high_tok_s: float


def predict(band: PeerBand, bandwidth_gbps: float, bytes_per_token: float) -> Prediction | None:
    """What a machine of `bandwidth_gbps` should decode a model of `bytes_per_token` at, by its peers."""
    if bandwidth_gbps <= 0 or bytes_per_token <= 0:
        return None
    ceiling = bandwidth_gbps * GB / bytes_per_token
    return Prediction(
        band, ceiling, ceiling * band.low_share, ceiling * band.median_share, ceiling * band.high_share
    )


def nearest(
    rows: Sequence[PeerRow], query: PeerQuery, params_b: float | None = None, limit: int = 10
) -> list[PeerRow]:
    """The published results nearest a machine and a model: same part, class, family; then the
    same quantization group; then the nearest model size."""
    group = quant_group(query.quant)

    def distance(r: PeerRow) -> tuple[int, int, float, float]:
        where = (
            0
            if query.hw_key and r.hw_key == query.hw_key
            else 1
            if r.hw_class == query.hw_class
            else 2
            if r.family == query.family
            else 3
        )
        quant = 0 if group is not None and quant_group(r.quant) == group else 1
        size = abs(math.log(r.active_params_b / params_b)) if params_b else 0.0
        return (where, quant, size, -(bandwidth_share(r) or 0.0))

    return sorted(rows, key=distance)[:limit]
