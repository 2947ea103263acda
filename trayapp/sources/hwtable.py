"""The shipped bandwidth table (`trayapp/data/bandwidth.csv`) and spec lookups.

`lookup_gpu()` finds a device by the name a driver or a user gives it. Names
match despite vendor words, "GeForce", spacing and case ("NVIDIA GeForce RTX
4090" = "RTX 4090" = "rtx4090"), but never a different part: every word that
distinguishes a part ("Laptop", "Ti", "Super", "PCIe", "NVL", "Max"...) must
agree. Memory sizes, memory types and the words in a model's parentheses are
optional hints that pick between variants. SXM is optional too: NVML names the
SXM boards without it ("NVIDIA H100 80GB HBM3").

When a name still leaves several variants (an M4 Max without a GPU core
count, an "RTX 3080" without its memory size), the fastest one is returned
with `exact=False`: the table feeds a ceiling, an upper bound.

Capacity: the CSV's `vram_gb` is the marketing figure. Cards sold as "24 GB"
carry 24 GiB, so `vram_bytes = vram_gb × 2**30`. For SoCs with configurable
memory (Apple, Qualcomm, AMD/Intel APUs) the column is the *largest*
configuration; `gpu_lookup()` then reports no capacity, and the Apple probe
uses the machine's own `hw.memsize`.

`ram_spec_bandwidth_gbps()` computes the spec RAM bandwidth from the SMBIOS
memory devices that systemd's `memory_id` exports as udev properties (no root
needed); None when they are not available.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path

_NOISE_WORDS = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "amd",
        "ati",
        "radeon",
        "instinct",
        "intel",
        "apple",
        "qualcomm",
        "gpu",
        "graphics",
        "generation",
        "edition",
        "tm",
        "r",
    }
)
# Fused forms such as "rtx4090", "rx7900xtx", "3060ti", "4090laptop".
_PREFIX_RE = re.compile(r"^(rtx|gtx|rx|arc)(\d.*)$")
_SUFFIX_RE = re.compile(r"^(\d+)(ti|super|xtx|xt|gre|d|laptop)$")
_SIZE_RE = re.compile(r"^(\d+)gb?$")
_MEMORY_TYPE_RE = re.compile(r"^(gddr\d+x?|hbm\d+e?|lpddr\d+x?|ddr\d+)$")
_SXM_RE = re.compile(r"^sxm\d*$")
_CORES_RE = re.compile(r"(\d+)(?:/(\d+))?-core gpu", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One row of the table (vendor names as the CSV spells them: "NVIDIA", "AMD", "Apple"...)."""

    vendor: str
    family: str
    model: str
    memory_type: str
    bus_width_bits: int | None
    bandwidth_gbps: float
    vram_bytes: int | None  # vram_gb × 2**30; for configurable SoCs the largest configuration
    source: str
    unified_memory: bool = False  # the GPU shares system memory (SoC / APU)
    exact: bool = True  # False when the name left several variants and the fastest was taken


@dataclasses.dataclass(frozen=True)
class _Entry:
    spec: GpuSpec
    aliases: tuple[frozenset[str], ...]  # required words, one set per alternative name
    optional: frozenset[str]  # hint words that may appear in a query
    gpu_cores: frozenset[int]  # Apple binned chips: GPU core counts of this row


# --------------------------------------------------------------------------- names


def _words(text: str) -> list[str]:
    """Lower-case words with trademark marks, punctuation and fused forms split apart."""
    text = text.lower().replace("(tm)", " ").replace("(r)", " ").replace("™", " ").replace("®", " ")
    text = re.sub(r"(\d+)/(\d+)\s*gb", r"\1gb \2gb", text)  # "16/32GB" names two sizes
    words: list[str] = []
    for raw in re.split(r"[^a-z0-9]+", text):
        if not raw:
            continue
        prefix = _PREFIX_RE.match(raw)
        parts = [prefix.group(1), prefix.group(2)] if prefix else [raw]
        for part in parts:
            suffix = _SUFFIX_RE.match(part)
            words.extend([suffix.group(1), suffix.group(2)] if suffix else [part])
    return [_canonical(w) for w in words if w not in _NOISE_WORDS]


def _canonical(word: str) -> str:
    size = _SIZE_RE.match(word)
    if size:
        return f"{size.group(1)}gb"
    if _SXM_RE.match(word):
        return "sxm"
    return word


def _is_hint(word: str) -> bool:
    """Words that only choose between variants: sizes, memory types, the SXM form factor."""
    return bool(_SIZE_RE.match(word) or _MEMORY_TYPE_RE.match(word) or word == "sxm")


def _split_alternatives(model: str) -> tuple[str, str]:
    """Split a model into its text outside and inside parentheses ("M3 Max (… 30-core GPU)")."""
    inside = " ".join(re.findall(r"\(([^)]*)\)", model))
    outside = re.sub(r"\([^)]*\)", " ", model)
    return outside, inside


def _entry(row: Mapping[str, str]) -> _Entry:
    model = row["model"].strip()
    vendor = row["vendor"].strip()
    family = row["family"].strip()
    outside, inside = _split_alternatives(model)
    optional = set(_words(inside)) | set(_words(row["memory_type"]))
    aliases: list[frozenset[str]] = []
    first: list[str] = []
    for alternative in outside.split(" / "):
        words = _words(alternative)
        if not words:
            continue
        if first and words[0] in first and words[0] != first[0]:
            # "Ryzen AI Max+ 395 / Max 390": the later names drop the shared prefix.
            words = first[: first.index(words[0])] + words
        if not first:
            first = words
        optional |= {w for w in words if _is_hint(w)}
        aliases.append(frozenset(w for w in words if not _is_hint(w)))
    cores: set[int] = set()
    for match in _CORES_RE.finditer(model):
        cores.update(int(g) for g in match.groups() if g)
    unified = (
        vendor in ("Apple", "Qualcomm")
        or "APU" in family
        or "iGPU" in family
        or family.startswith(("Jetson", "Desktop AI"))
    )
    vram_gb = row["vram_gb"].strip()
    bus = row["bus_width_bits"].strip()
    spec = GpuSpec(
        vendor=vendor,
        family=family,
        model=model,
        memory_type=row["memory_type"].strip(),
        bus_width_bits=int(bus) if bus else None,
        bandwidth_gbps=float(row["bandwidth_gbs"]),
        vram_bytes=round(float(vram_gb) * 2**30) if vram_gb else None,
        source=row["source"].strip(),
        unified_memory=unified,
    )
    return _Entry(spec, tuple(aliases), frozenset(optional), frozenset(cores))


@functools.lru_cache(maxsize=1)
def _entries() -> tuple[_Entry, ...]:
    text = resources.files("trayapp").joinpath("data", "bandwidth.csv").read_text(encoding="utf-8")
    seen: set[tuple[str, str]] = set()
    entries: list[_Entry] = []
    for row in csv.DictReader(io.StringIO(text)):
        key = (row["vendor"].strip(), row["model"].strip())
        if key in seen or key[0] == "Generic":  # the Apple rows appear twice; RAM rows are no GPUs
            continue
        seen.add(key)
        entries.append(_entry(row))
    return tuple(entries)


def load_table() -> tuple[GpuSpec, ...]:
    """Every device row of the shipped table, duplicates removed (loaded once)."""
    return tuple(e.spec for e in _entries())


def lookup_gpu(name: str, gpu_cores: int | None = None, vram_bytes: int | None = None) -> GpuSpec | None:
    """The table row for a device name, or None when no row is that part.

    `gpu_cores` separates Apple's binned chips (M4 Max 32- vs 40-core GPU);
    `vram_bytes` (e.g. from NVML) separates memory-size variants whose name
    does not say the size. Without them the fastest variant is returned with
    `exact=False`.
    """
    query = _words(name)
    if not query:
        return None
    query_set = set(query)
    sizes = {w for w in query_set if _SIZE_RE.match(w)}
    words = query_set - sizes  # a size only chooses between variants (NVML says "GH200 480GB")
    candidates = [
        e for e in _entries() if any(alias <= words and words <= alias | e.optional for alias in e.aliases)
    ]
    if not candidates:
        return None
    candidates = _narrow(candidates, lambda e: bool(sizes & e.optional)) if sizes else candidates
    if gpu_cores is not None:
        candidates = _narrow(candidates, lambda e: gpu_cores in e.gpu_cores)
    if vram_bytes and not sizes:
        candidates = _narrow(candidates, lambda e: _close(e.spec.vram_bytes, vram_bytes))
    best = max(candidates, key=lambda e: e.spec.bandwidth_gbps).spec
    if len({e.spec.bandwidth_gbps for e in candidates}) == 1:
        return best  # one part, or variants that differ only in size: the bandwidth is certain
    return dataclasses.replace(best, exact=False)


def _narrow(entries: list[_Entry], keep: Callable[[_Entry], bool]) -> list[_Entry]:
    """The entries that pass `keep`, or all of them when none does (a hint never hides a part)."""
    kept = [e for e in entries if keep(e)]
    return kept or entries


def _close(table_bytes: int | None, measured_bytes: int) -> bool:
    return table_bytes is not None and abs(table_bytes - measured_bytes) <= 0.08 * table_bytes


def gpu_lookup(name: str) -> tuple[float, int | None] | None:
    """(bandwidth_gbps, vram_bytes) for `trayapp.core.machine.resolve_machine`.

    Capacity is None for SoCs whose memory size is chosen at purchase (Apple,
    Qualcomm, AMD/Intel APUs): the table only knows the largest configuration.
    """
    spec = lookup_gpu(name)
    if spec is None:
        return None
    fixed_size = not spec.unified_memory or spec.vendor == "NVIDIA"  # GB10 / Jetson ship one size
    return spec.bandwidth_gbps, spec.vram_bytes if fixed_size else None


# --------------------------------------------------------------------------- system RAM

UDEV_DMI_DB = Path("/run/udev/data/+dmi:id")
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def parse_udev_properties(lines: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` lines (udevadm output) or `E:KEY=VALUE` lines (the udev database)."""
    props: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if line.startswith("E:"):
            line = line[2:]
        key, sep, value = line.partition("=")
        if sep and key:
            props[key] = value
    return props


def read_memory_properties(
    udev_db: Path = UDEV_DMI_DB, run: Runner = subprocess.run
) -> dict[str, str] | None:
    """systemd `memory_id` properties of the DMI device, or None where they are not exported."""
    try:
        props = parse_udev_properties(udev_db.read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        props = {}
    if not any(k.startswith("MEMORY_DEVICE_") for k in props):
        try:
            done = run(
                ["udevadm", "info", "-q", "property", "-p", "/sys/devices/virtual/dmi/id"],
                capture_output=True,
                text=True,
                timeout=3,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        props = parse_udev_properties(done.stdout.splitlines())
    return props if any(k.startswith("MEMORY_DEVICE_") for k in props) else None


def ram_spec_bandwidth_gbps(
    properties: Mapping[str, str] | None = None,
    read: Callable[[], Mapping[str, str] | None] = read_memory_properties,
) -> float | None:
    """Theoretical RAM bandwidth from SMBIOS memory devices, or None when unknown.

    DDR: `channels × 64 bit × MT/s / 8`, with up to 4 DIMMs counted as dual
    channel (1 DIMM: single) and more than 4 assumed two per channel, which
    under-counts servers with one DIMM per channel (a safe lower bound).
    LPDDR (soldered): the sum of the devices' data widths × MT/s / 8.
    """
    props = properties if properties is not None else read()
    if not props:
        return None
    devices = sorted(
        {int(m.group(1)) for k in props if (m := re.match(r"^MEMORY_DEVICE_(\d+)_", k))},
    )
    kinds: list[str] = []
    speeds: list[int] = []
    widths: list[int] = []
    for n in devices:
        prefix = f"MEMORY_DEVICE_{n}_"
        if props.get(prefix + "PRESENT") == "0" or _int(props.get(prefix + "SIZE")) in (None, 0):
            continue
        speed = _int(props.get(prefix + "CONFIGURED_SPEED_MTS")) or _int(props.get(prefix + "SPEED_MTS"))
        if not speed:
            continue
        kinds.append(props.get(prefix + "TYPE", "").upper())
        speeds.append(speed)
        widths.append(_int(props.get(prefix + "DATA_WIDTH")) or 0)
    if not speeds:
        return None
    if kinds[0].startswith("LPDDR"):
        bus_bits = sum(widths)
        if not bus_bits:
            return None
    else:
        populated = len(speeds)
        channels = 1 if populated == 1 else 2 if populated <= 4 else populated // 2
        bus_bits = channels * 64
    return bus_bits * min(speeds) / 8 / 1000


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
