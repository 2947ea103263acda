"""The shipped peer table (`trayapp/data/peers.json`, built by `bench/peers_build.py`) and how this
machine is named in it.

`load_peers()` reads and checks the table once (`core/peers.parse_table`); `peer_query()` describes
a machine for `core/peers.band_for` / `nearest`: its GPU's part in the bandwidth table (`hwtable`),
or the CPU class when the model runs from system RAM.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from importlib import resources

from trayapp.core.peers import PeerQuery, PeerRow, hardware_class, parse_table
from trayapp.sources.hwtable import lookup_gpu


@functools.cache
def load_peers() -> tuple[PeerRow, ...]:
    """Every row of the shipped table; PeerTableError when it does not match its schema."""
    text = resources.files("trayapp").joinpath("data", "peers.json").read_text(encoding="utf-8")
    return parse_table(json.loads(text))


def peer_query(gpu_names: Sequence[str], quant: str | None = None) -> PeerQuery:
    """The peer query of a machine with these GPUs (none: a CPU-only machine) for a quantization."""
    for name in gpu_names:
        spec = lookup_gpu(name)
        if spec is not None:
            family, hw_class = hardware_class(spec.vendor, spec.family, spec.model)
            label = name.replace("NVIDIA GeForce ", "").replace("NVIDIA ", "").replace("Apple ", "")
            return PeerQuery(family, hw_class, spec.model, quant, label)
    return PeerQuery("cpu", "cpu", "", quant, "CPU")


def gpu_query(name: str, quant: str | None = None) -> PeerQuery | None:
    """The peer query of a GPU named by the user (`--gpu "RTX 4090"`); None when the table lacks it."""
    spec = lookup_gpu(name)
    if spec is None:
        return None
    family, hw_class = hardware_class(spec.vendor, spec.family, spec.model)
    return PeerQuery(family, hw_class, spec.model, quant, name)
