"""What a finished `llm-tray bench` leaves: its text, and its result kept as the baseline (#13)."""

from __future__ import annotations

import logging
import sqlite3
import time

from trayapp.core.bench import BenchResult, BenchTarget, baseline_refusal
from trayapp.core.server_kinds import server_label
from trayapp.core.units import format_gb, format_pct, format_rate, format_tokens

log = logging.getLogger(__name__)


def stored_calibration(target: BenchTarget) -> float | None:
    """An earlier bench's efficiency of this model on this hardware (the band it centres), if any."""
    from trayapp.config import paths
    from trayapp.sinks.store import Store, StoreError

    try:
        with Store(paths.store_file(), writer=False) as store:
            return store.calibration(model=target.model, hardware=target.hardware, before_wall_s=time.time())
    except (StoreError, sqlite3.Error) as exc:  # an older schema (no bench table yet) reads as none
        log.warning("bench: no calibration read: %s", exc)
        return None


def store_baseline(result: BenchResult) -> tuple[bool, str | None]:
    """Keep the result as the baseline of its (model, quantization, hardware) in the store: (stored,
    a note to print). Its own writer; when the tray or `agent` records, the store is theirs and the
    result goes to that sampler, which keeps it through its writer (the same rule applies there)."""
    from trayapp.config import paths
    from trayapp.sinks.store import Store, StoreError, StoreLockedError

    refusal = baseline_refusal(result)
    if refusal is not None:
        return False, refusal
    path = paths.store_file()
    try:
        with Store(path) as store:
            written = store.record_bench(result)
    except StoreLockedError as exc:
        return _store_through_sampler(result, str(exc))
    except StoreError as exc:
        return False, f"not stored as the baseline: {exc}"
    log.info("bench stored as the baseline (%d depth(s)) in %s", written, path)
    return bool(written), None


def _store_through_sampler(result: BenchResult, locked: str) -> tuple[bool, str | None]:
    """The store is locked (`locked` says by whom): give the result to this machine's sampler."""
    from trayapp.sinks.sampler_file import SamplerRefused, locate_sampler, post_bench

    info, why_not = locate_sampler()
    if info is None:
        return False, (
            f"not stored as the baseline: {locked}, and {why_not} to take it; "
            "stop that process (a `llm-tray watch`?) and bench again to keep it"
        )
    who = f"the {info.role or 'sampler'} (pid {info.pid})"
    try:
        stored, note = post_bench(info, result)
    except SamplerRefused as exc:
        return False, f"not stored as the baseline: {exc}"
    if stored:
        return True, f"kept by {who}, which records to the store"
    return False, note or f"not stored as the baseline: {who} did not keep it"


# --------------------------------------------------------------------------- text


def format_result(result: BenchResult) -> str:
    t, s = result.target, result.settings
    lines = [
        f"{t.model} ({t.quantization or 'quantization unknown'}) on {server_label(t.server_kind)}"
        + (f" {t.server_version}" if t.server_version else "")
        + f" at {t.server_url}",
        f"hardware   {t.hardware} · GPU share {format_pct(t.gpu_fraction)}"
        + (f" · {format_gb(t.vram_bytes)} in VRAM" if t.vram_bytes else ""),
    ]
    measured = [r for r in result.runs if r.kind == "decode" and not r.warmup]
    if result.decode_tok_s is not None:
        cv = result.decode_spread.cv
        how = "server timings" if result.decode_exact else "streamed tokens"
        lines.append(
            f"decode     {format_rate(result.decode_tok_s)} tok/s (median of {len(measured)}, {how}; "
            f"{s.warmup} warm-up discarded) · spread {format_rate(result.decode_spread.tok_s)} tok/s"
            + (f", CV {cv * 100:.1f} %" if cv is not None else "")
            + (f" · {result.decode_j_per_token:.3g} J/token" if result.decode_j_per_token is not None else "")
        )
        if result.decode_j_per_token is None and result.energy_reason:
            lines.append(f"energy     not measured: {result.energy_reason}")
    if result.ttft_s is not None:
        bound = " (upper bound: the server counts cached tokens)" if result.prompt_rate_upper_bound else ""
        lines.append(
            f"prompt     TTFT {result.ttft_s:.2f} s · {format_rate(result.prompt_tok_s)} tok/s{bound} "
            f"({format_tokens(s.prompt_depth_tokens)}-token prompt, cache defeated)"
        )
    if result.ceiling_tok_s is not None:
        h = result.healthy
        band = ""
        if h.band_low_tok_s is not None and h.band_high_tok_s is not None:
            band = f" · healthy {format_rate(h.band_low_tok_s)}–{format_rate(h.band_high_tok_s)} tok/s"
        lines.append(
            f"ceiling    {format_rate(result.ceiling_tok_s)} tok/s · "
            f"{format_pct(result.efficiency)} of it{band} · {h.reason}"
        )
    if len(result.sweep) > 1 or (result.sweep and result.sweep[0].depth_tokens > 0):
        lines.append("sweep      depth    decode  predicted  ceiling (tok/s)")
        for p in result.sweep:
            lines.append(
                f"           {format_tokens(p.depth_tokens):>6} {format_rate(p.decode_tok_s):>8} "
                f"{format_rate(p.predicted_tok_s):>10} {format_rate(p.ceiling_tok_s):>8}"
            )
    if result.sweep_stopped:
        lines.append(f"note       {result.sweep_stopped}")
    lines += [f"warning    {w}" for w in result.warnings]
    if result.interrupted:
        lines.append(f"interrupted: {sum(1 for r in result.runs if not r.warmup)} measured run(s) kept")
    return "\n".join(lines)
