"""Rebuild the peer table (`trayapp/data/peers.json`) from the saved sources in `bench/peers_sources/`.

    python bench/peers_build.py [--sources bench/peers_sources/sources.toml] [--out trayapp/data/peers.json]
                                [--check]

`sources.toml` lists each source: a saved source text (the published tables, figures only), its
parser, its URL and the facts all its rows share (engine, backend, model, build, date). Parsers:

* `rows` — a Markdown table whose columns are row fields (`hardware`, `quant`, `decode_tok_s`, and
  any of `gpu_cores`, `bandwidth_gbps`, `prompt_tok_s`, `file_gb`, `context_tokens`, `build`, `model`,
  `params_b`, `threads`, `date`, `note`); what a row leaves empty comes from the source's entry;
* `xiongjiedai` — the GPU × model tables of XiongjieDai/GPU-Benchmarks-on-LLM-Inference (single
  devices only: a multi-GPU row's bandwidth is not one memory's);
* `geerling` — the per-model "Findings" tables of geerlingguy/ai-benchmarks (Ollama rows; rows run
  with llama.cpp/Vulkan are skipped, their model file is not stated; CPU rows only where a measured
  bandwidth of that board is known).

A part's bandwidth, vendor and family come from the app's own bandwidth table
(`trayapp/sources/hwtable.py`) unless the row gives a (measured) one. Every row is checked with
`trayapp.core.peers.row_problems`; `--check` rebuilds in memory and fails when the shipped file differs.
To extend the table: save the new source's table next to the others, add its entry, rerun.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trayapp.core.peers import PEERS_SCHEMA, PEERS_VERSION, PeerRow, hardware_class, row_problems  # noqa: E402
from trayapp.sources.hwtable import lookup_gpu  # noqa: E402

Fields = dict[str, Any]


def markdown_rows(text: str) -> Iterator[list[str]]:
    """Cells of every Markdown table row in `text` (separator rows skipped)."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or re.fullmatch(r"\|[\s:|-]+\|", line):
            continue
        yield [cell.strip() for cell in line.strip("|").split("|")]


def _number(cell: str) -> float | None:
    cell = cell.replace("*", "").replace(",", "").strip()
    match = re.match(r"^-?\d+(\.\d+)?", cell)
    return float(match.group(0)) if match else None


# --------------------------------------------------------------------------- rows


def _cast(name: str, cell: str) -> object:
    if cell == "":
        return None
    if name in ("gpu_cores", "context_tokens", "threads"):
        return int(float(cell))
    if name in ("bandwidth_gbps", "prompt_tok_s", "decode_tok_s", "file_gb", "params_b", "active_params_b"):
        return float(cell)
    return cell


def parse_rows(text: str, source: Mapping[str, Any]) -> Iterator[Fields]:
    header: list[str] | None = None
    for cells in markdown_rows(text):
        if header is None:
            header = cells
            continue
        row = {name: _cast(name, cell) for name, cell in zip(header, cells, strict=False)}
        yield {k: v for k, v in row.items() if v is not None}


# --------------------------------------------------------------------------- XiongjieDai


def _xd_hardware(name: str) -> tuple[str, int | None]:
    name = name.replace("\u2011", "-").strip()
    cores = re.search(r"(\d+)-Core GPU", name, re.IGNORECASE)
    name = re.sub(r"\s*\d+-Core GPU", "", name, flags=re.IGNORECASE)
    name = re.sub(r"\s+\d+GB$", "", name) if not re.search(r"(PCIe|SXM|3080|A100) \d+GB$", name) else name
    if name[0].isdigit():
        name = "RTX " + name
    return name, int(cores.group(1)) if cores else None


def parse_xiongjiedai(text: str, source: Mapping[str, Any]) -> Iterator[Fields]:
    decode_part, _, prompt_part = text.partition("## prompt")
    tables: list[dict[tuple[str, str], float]] = []
    for part in (decode_part, prompt_part):
        table: dict[tuple[str, str], float] = {}
        header: list[str] | None = None
        for cells in markdown_rows(part):
            if header is None:
                header = cells
                continue
            for column, cell in zip(header[1:], cells[1:], strict=False):
                value = _number(cell)
                if value is not None:
                    table[(cells[0], column)] = value
        tables.append(table)
    decode, prompt = tables
    for (gpu, column), rate in decode.items():
        if "*" in gpu:
            continue  # several GPUs: no one bandwidth
        size, quant = re.split(r"[ _]", column, maxsplit=1)
        model, params = source["models"][size]
        hardware, cores = _xd_hardware(gpu)
        yield {
            "hardware": ("Apple " if hardware.startswith("M") else "") + hardware,
            "gpu_cores": cores,
            "backend": "metal" if hardware.startswith("M") else "cuda",
            "model": model,
            "arch": "llama",
            "params_b": params,
            "quant": quant.upper(),
            "decode_tok_s": rate,
            "prompt_tok_s": prompt.get((gpu, column)),
        }


# --------------------------------------------------------------------------- Geerling

# Section -> (model, arch, params_b, active_params_b, quant): Ollama's default tag of each.
_GEERLING_MODELS = {
    "DeepSeek R1 14b": ("DeepSeek-R1-Distill-Qwen-14B (deepseek-r1:14b)", "qwen2", 14.8, 14.8, "Q4_K_M"),
    "DeepSeek R1 671b": ("DeepSeek-R1 671B (deepseek-r1:671b)", "deepseek2", 671.0, 37.0, "Q4_K_M"),
    "gpt-oss 20b": ("gpt-oss-20b (gpt-oss:20b)", "gpt-oss", 20.9, 3.6, "MXFP4_MOE"),
    "Llama 3.2:3b": ("Llama 3.2 3B (llama3.2:3b)", "llama", 3.21, 3.21, "Q4_K_M"),
    "Llama 3.1:70b": ("Llama 3.1 70B (llama3.1:70b)", "llama", 70.6, 70.6, "Q4_K_M"),
    "Llama 3.1:405b": ("Llama 3.1 405B (llama3.1:405b)", "llama", 405.0, 405.0, "Q4_K_M"),
}
_GEERLING_GPU_WORDS = (
    (r"Nvidia (?:RTX )?(\d{4}(?: Ti)?(?: Super)?)\b", "RTX {}"),
    (r"Nvidia (?:RTX )?(A\d{4})\b", "RTX {}"),
    (r"Nvidia Spark", "GB10"),
    (r"AMD (?:Radeon )?AI Pro (R9700)", "Radeon AI PRO {}"),
    (r"AMD (?:RX )?(\d{4}(?: XT)?)\b", "RX {}"),
    (r"Intel (Arc (?:Pro )?[AB]\d{2,3}(?: ECO)?)", "{}"),
)
# The model file the llama.cpp/Vulkan rows (README footnote 1) ran, as their linked issues state it.
_VULKAN_MODELS = {
    "Llama 3.2:3b": (
        "Llama 3.2 3B Instruct (Llama-3.2-3B-Instruct-Q4_K_M.gguf)",
        "llama",
        3.21,
        3.21,
        "Q4_K_M",
    ),
}
# Measured bandwidth of boards that run on their CPU (GB/s, URL of the measurement).
_CPU_BANDWIDTH = {
    "Raspberry Pi 5": (11.59, "https://github.com/ggml-org/llama.cpp/issues/26484"),
}


def _geerling_hardware(system: str, kind: str) -> tuple[str, int | None] | None:
    if kind == "CPU":
        return ("Raspberry Pi 5", None) if re.match(r"Pi 5 - \d+GB$", system) else None
    for pattern, template in _GEERLING_GPU_WORDS:
        found = re.search(pattern, system)
        if found:
            return template.format(*found.groups()), None
    apple = re.search(r"\b(M[1-5](?: Pro| Max| Ultra)?)\b", system)
    if apple:
        cores = re.search(r"\((\d+) GPU Core\)", system)
        return "Apple " + apple.group(1), int(cores.group(1)) if cores else None
    if system.startswith("Framework Mainboard"):
        return "AMD Ryzen AI Max+ 395", None
    return None


def parse_geerling(text: str, source: Mapping[str, Any]) -> Iterator[Fields]:
    section = ""
    for line in text.splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
            continue
        if not line.startswith("| ") or line.startswith("| System") or line.startswith("| :"):
            continue
        vulkan = "<sup>1</sup>" in line
        if vulkan and section not in _VULKAN_MODELS:
            continue  # llama.cpp with Vulkan, and the model file is not stated for this model
        line = line.replace("<sup>1</sup>", "")
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        system_cell, kind, rate_cell = cells[0], cells[1], cells[2]
        link = re.search(r"\((https://github\.com/[^)]+)\)", system_cell)
        system = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", system_cell).strip()
        if kind not in ("GPU", "CPU") or section not in _GEERLING_MODELS:
            continue
        found = _geerling_hardware(system, kind)
        rate = _number(rate_cell)
        if found is None or rate is None:
            continue
        hardware, cores = found
        model, arch, params, active, quant = (_VULKAN_MODELS if vulkan else _GEERLING_MODELS)[section]
        row: Fields = {
            "hardware": hardware,
            "gpu_cores": cores,
            "model": model,
            "arch": arch,
            "params_b": params,
            "active_params_b": active,
            "quant": quant,
            "decode_tok_s": rate,
            "source_url": link.group(1) if link else source["url"],
            "note": f"{source['note']}; system: {system}",
        }
        if hardware in _CPU_BANDWIDTH:
            bandwidth, where = _CPU_BANDWIDTH[hardware]
            row.update(
                bandwidth_gbps=bandwidth,
                bandwidth_basis="measured",
                backend="cpu",
                note=f"{row['note']}; bandwidth: a Pi 5's measured read-only bandwidth ({where})",
            )
        elif vulkan:
            row.update(
                engine="llama.cpp",
                backend="vulkan",
                note=f"{row['note']}; llama.cpp with Vulkan (README footnote 1)",
            )
        else:
            row["backend"] = (
                "metal"
                if hardware.startswith("Apple")
                else "cuda"
                if "RTX" in hardware or hardware == "GB10"
                else "rocm"
            )
        yield row


PARSERS = {"rows": parse_rows, "xiongjiedai": parse_xiongjiedai, "geerling": parse_geerling}
_SHARED = ("engine", "backend", "build", "date", "model", "arch", "params_b", "bandwidth_basis", "note")


# --------------------------------------------------------------------------- assembly


def complete(fields: Fields, source: Mapping[str, Any]) -> PeerRow:
    """A full row from a parser's fields, the source's shared facts and the bandwidth table."""
    row: Fields = {name: source[name] for name in _SHARED if name in source}
    if "note" in fields and "note" in row and not fields["note"].startswith(row["note"]):
        fields = {**fields, "note": f"{row['note']}; {fields['note']}"}
    row.update(fields)
    hardware = str(row["hardware"])
    lookup = re.sub(r"^(Apple|NVIDIA|AMD) ", "", hardware)
    spec = lookup_gpu(lookup, gpu_cores=row.get("gpu_cores"))
    if spec is not None:
        family, hw_class = hardware_class(spec.vendor, spec.family, spec.model)
        row.setdefault("bandwidth_gbps", spec.bandwidth_gbps)
        hw_key = spec.model
    elif "bandwidth_gbps" in row:
        family, hw_class = "cpu", "cpu"  # a board whose bandwidth the source states: its CPU runs the model
        hw_key = hardware
    else:
        raise LookupError(f"{hardware}: not in the bandwidth table and no bandwidth given")
    params = float(row["params_b"])
    return PeerRow(
        hardware=hardware,
        hw_key=hw_key,
        family=family,
        hw_class=hw_class,
        gpu_cores=row.get("gpu_cores"),
        bandwidth_gbps=float(row["bandwidth_gbps"]),
        bandwidth_basis=str(row.get("bandwidth_basis", "spec")),
        engine=str(row["engine"]),
        backend=str(row["backend"]),
        build=row.get("build"),
        model=str(row["model"]),
        arch=str(row["arch"]),
        params_b=params,
        active_params_b=float(row.get("active_params_b", params)),
        moe=float(row.get("active_params_b", params)) < params,
        quant=str(row["quant"]),
        file_gb=row.get("file_gb"),
        context_tokens=int(row.get("context_tokens", 0)),
        threads=row.get("threads"),
        decode_tok_s=float(row["decode_tok_s"]),
        prompt_tok_s=row.get("prompt_tok_s"),
        date=str(row["date"]),
        source_url=str(row.get("source_url", source["url"])),
        verified=bool(source["verified"]),
        note=str(row.get("note", "")),
    )


def build(sources_path: Path) -> tuple[list[PeerRow], list[str]]:
    """Every row of every listed source, and the problems found (a row with a problem is left out)."""
    listing = tomllib.loads(sources_path.read_text(encoding="utf-8"))
    rows: list[PeerRow] = []
    problems: list[str] = []
    for source in listing["source"]:
        text = (sources_path.parent / source["file"]).read_text(encoding="utf-8")
        for fields in PARSERS[source["parser"]](text, source):
            try:
                row = complete(fields, source)
            except LookupError as exc:
                problems.append(f"{source['file']}: {exc}")
                continue
            found = row_problems(row)
            if found:
                problems.append(
                    f"{source['file']}: {row.hardware} {row.model} {row.quant}: {'; '.join(found)}"
                )
                continue
            rows.append(row)
    return rows, problems


def document(rows: list[PeerRow]) -> dict[str, object]:
    return {
        "schema": PEERS_SCHEMA,
        "version": PEERS_VERSION,
        "about": "Published decode results (llama.cpp, Ollama) with their source URLs; built by "
        "bench/peers_build.py from bench/peers_sources/; see docs/peers.md",
        "units": {
            "bandwidth_gbps": "GB/s (10^9 bytes)",
            "params_b": "billions of parameters",
            "file_gb": "GB (10^9 bytes)",
            "decode_tok_s": "tokens/s",
            "prompt_tok_s": "tokens/s",
            "context_tokens": "tokens",
        },
        "rows": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=Path, default=ROOT / "bench" / "peers_sources" / "sources.toml")
    parser.add_argument("--out", type=Path, default=ROOT / "trayapp" / "data" / "peers.json")
    parser.add_argument(
        "--check", action="store_true", help="fail when the shipped file is not what the sources build"
    )
    args = parser.parse_args(argv)
    rows, problems = build(args.sources)
    for problem in problems:
        print(f"left out: {problem}", file=sys.stderr)
    text = json.dumps(document(rows), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print("peers.json is up to date" if same else "peers.json differs from its sources: rebuild it")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.family] = counts.get(r.family, 0) + 1
    print(f"{len(rows)} rows -> {args.out} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
