"""`llm-tray peers`: the published results nearest a model and a machine, and what the machine should
decode the model at by them — also before buying (`--gpu "RTX 4090" --params 32 --quant Q4_K_M`).

The table is `trayapp/data/peers.json` (docs/peers.md); the prediction is the peers' band of shares
of the bandwidth ceiling × this machine's bandwidth ÷ the model's bytes per token.
"""

from __future__ import annotations

import argparse
import json

from trayapp.core.modelfacts import facts_from_params
from trayapp.core.peers import (
    PeerQuery,
    PeerRow,
    band_for,
    bandwidth_share,
    nearest,
    predict,
)
from trayapp.core.terminal import terminal_safe
from trayapp.core.units import GB, format_rate
from trayapp.sources.peers_table import gpu_query, load_peers, peer_query

DEFAULT_QUANT = "Q4_K_M"


def add_peers_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu", default=None, metavar="NAME", help='a GPU or chip ("RTX 4090"); default: this machine'
    )
    parser.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=None,
        metavar="N",
        help="memory bandwidth in GB/s (a CPU-only machine, or to override the table's)",
    )
    parser.add_argument("--params", type=float, default=None, metavar="B", help="parameters, in billions")
    parser.add_argument(
        "--active-params", type=float, default=None, metavar="B", help="active parameters (MoE), billions"
    )
    parser.add_argument("--quant", default=DEFAULT_QUANT, metavar="Q", help=f"quantization ({DEFAULT_QUANT})")
    parser.add_argument("--limit", type=int, default=10, metavar="N", help="published results to list (10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _local_query(quant: str) -> tuple[PeerQuery, float | None]:
    """This machine's peer query and bandwidth, from its GPUs (none: its CPU and RAM)."""
    from trayapp.sources.hardware import HardwareProbe

    probe = HardwareProbe()
    try:
        snapshot = probe.read()
    finally:
        probe.close()  # NVML and macmon, started by the read
    names = [g.name for g in snapshot.gpus]
    bandwidths = [g.bandwidth_gbps for g in snapshot.gpus if g.bandwidth_gbps]
    if names:
        return peer_query(names, quant), (min(bandwidths) if bandwidths else None)
    return peer_query([], quant), snapshot.host.ram_bandwidth_gbps


def run_peers(args: argparse.Namespace) -> int:
    """The command: 0 printed, 2 a name or a number it cannot use."""
    rows = load_peers()
    quant = args.quant or DEFAULT_QUANT
    if args.gpu:
        query = gpu_query(args.gpu, quant)
        if query is None:
            raise ValueError(f"unknown GPU {args.gpu!r}: not in the bandwidth table")
        from trayapp.sources.hwtable import lookup_gpu

        spec = lookup_gpu(args.gpu)
        bandwidth = args.bandwidth_gbps or (spec.bandwidth_gbps if spec else None)
        where = f"{args.gpu} ({format_rate(bandwidth)} GB/s)"
    else:
        query, measured = _local_query(quant)
        bandwidth = args.bandwidth_gbps or measured
        where = f"this machine: {query.hw_label}" + (f" ({format_rate(bandwidth)} GB/s)" if bandwidth else "")
    bytes_per_token: float | None = None
    if args.params:
        facts = facts_from_params(args.params, args.active_params, quant)
        bytes_per_token = facts.bytes_per_token
    band = band_for(rows, query)
    prediction = predict(band, bandwidth, bytes_per_token) if band and bandwidth and bytes_per_token else None
    found = nearest(rows, query, args.params, limit=max(args.limit, 1))
    if args.json:
        print(
            json.dumps(
                {
                    "machine": {"name": query.hw_label, "class": query.hw_class, "bandwidth_gbps": bandwidth},
                    "model": {"params_b": args.params, "quant": quant, "bytes_per_token": bytes_per_token},
                    "band": None
                    if band is None
                    else {
                        "basis": band.basis,
                        "n": band.n,
                        "median_share": round(band.median_share, 3),
                        "low_share": round(band.low_share, 3),
                        "high_share": round(band.high_share, 3),
                        "min_share": round(band.min_share, 3),
                        "max_share": round(band.max_share, 3),
                    },
                    "predicted_tok_s": None
                    if prediction is None
                    else {
                        "ceiling": round(prediction.ceiling_tok_s, 2),
                        "low": round(prediction.low_tok_s, 2),
                        "median": round(prediction.median_tok_s, 2),
                        "high": round(prediction.high_tok_s, 2),
                    },
                    "nearest": [_row_json(r) for r in found],
                },
                indent=2,
            )
        )
        return 0
    lines = [where]
    if bytes_per_token:
        model = f"{args.params:g} B" + (f" ({args.active_params:g} B active)" if args.active_params else "")
        lines.append(f"model     {model} at {quant}: {bytes_per_token / GB:.1f} GB read per token")
    if band is None:
        lines.append("peers     too few published results for this hardware class")
    else:
        lines.append(
            f"peers     {band.basis}: {band.median_share * 100:.0f} % of bandwidth median, {band.n} results, "
            f"{band.low_share * 100:.0f}–{band.high_share * 100:.0f} % (range "
            f"{band.min_share * 100:.0f}–{band.max_share * 100:.0f} %)"
        )
    if prediction is not None:
        lines.append(
            f"predicted {format_rate(prediction.median_tok_s)} tok/s "
            f"({format_rate(prediction.low_tok_s)}–{format_rate(prediction.high_tok_s)}) of a "
            f"{format_rate(prediction.ceiling_tok_s)} tok/s ceiling"
        )
    elif band is not None and not bytes_per_token:
        lines.append("predicted give --params B (and --quant) for a predicted decode rate")
    elif band is not None and not bandwidth:
        lines.append("predicted give --bandwidth-gbps N for a predicted decode rate")
    lines.append("nearest published results (decode tok/s, share of the hardware's bandwidth):")
    for r in found:
        lines.append(
            f"  {r.hardware[:30]:<30} {r.model[:34]:<34} {r.quant:<9} {format_rate(r.decode_tok_s):>7} "
            f"{(bandwidth_share(r) or 0) * 100:>4.0f} %  {r.engine}/{r.backend}  {r.source_url}"
        )
    print(terminal_safe("\n".join(lines)))
    return 0


def _row_json(r: PeerRow) -> dict[str, object]:
    share = bandwidth_share(r)
    return {
        "hardware": r.hardware,
        "bandwidth_gbps": r.bandwidth_gbps,
        "model": r.model,
        "params_b": r.params_b,
        "quant": r.quant,
        "engine": r.engine,
        "backend": r.backend,
        "decode_tok_s": r.decode_tok_s,
        "share": None if share is None else round(share, 3),
        "source_url": r.source_url,
    }
