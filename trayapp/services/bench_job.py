"""One bench run, for the command (`llm-tray bench`) and the tray's bench window (#13).

The server and model are found as `status` finds them (one monitor tick: discovery, facts, placement,
ceiling); a server busy with another client is refused unless forced. Then, each request streamed
through the API clients use and read by the recording proxy's tap (services/bench_client.py):

1. `warmup` short-prompt runs, discarded (kept in the JSON with `warmup: true`);
2. `runs` short-prompt runs of `tokens` tokens: steady decode tok/s (median, spread, CV);
3. one warm-up and `runs` long-prompt runs: TTFT and prompt tok/s, the cache defeated each time;
4. the sweep: `runs` runs at each `depths` depth (depth 0 is step 2), each prompt unique so no
   cache (not even a warm-up's) hides the work; a depth beyond the server's context stops it.

Every prompt starts with a unique prefix (and llama-server gets `cache_prompt: false`). The monitor
ticks again before each measured run, so a spill to the CPU during the bench is named, not averaged
in. Ctrl-C (or the window's Cancel, between runs) stops and keeps what finished.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TextIO

from trayapp.core.bench import (
    BenchOptions,
    BenchOutcome,
    BenchRun,
    BenchSettings,
    BenchTarget,
    RunKind,
    bench_run,
    is_spill,
    summarize,
)
from trayapp.core.loopback import same_server
from trayapp.core.model import ModelStatus, ServerStatus, Snapshot
from trayapp.core.phases import is_busy, is_loaded
from trayapp.core.units import format_pct, format_rate, format_tokens
from trayapp.services.bench_energy import BenchEnergy
from trayapp.services.bench_report import stored_calibration

if TYPE_CHECKING:
    from trayapp.core.machine import Machine
    from trayapp.core.thresholds import Thresholds
    from trayapp.services.bench_client import BenchClient, Generation
    from trayapp.services.monitor import Monitor

log = logging.getLogger(__name__)

PROMPT_DEPTH_TOKENS = 512  # the long prompt of the TTFT runs: llama-bench's pp512 (less in a small context)
FILLER = "The quick brown fox jumps over the lazy dog. "  # about 10 tokens with common tokenizers
FILLER_TOKENS_GUESS = 10.0
SHORT_PROMPT = "Write a long story about a lighthouse keeper and the sea."
PROMPT_RUN_TOKENS = 2  # the long-prompt runs only need their first token


class BenchError(Exception):
    """A reason not to bench (no model, unknown model, busy server): printed, exit 1."""


class BenchCancelled(Exception):
    """The bench window's Cancel: the bench stops before its next run, keeping those finished."""


# --------------------------------------------------------------------------- choosing the target


def pick_target(
    snapshot: Snapshot, urls: Sequence[str], model_name: str | None
) -> tuple[ServerStatus, ModelStatus]:
    """The server and model to bench; BenchError says why there is none."""
    servers = [s for s in snapshot.servers if not urls or any(same_server(s.url, u) for u in urls)]
    if not servers:
        raise BenchError("no server found: start one, or give --endpoint [KIND=]URL")
    up = [s for s in servers if s.status == "ok"]
    if not up:
        why = "; ".join(f"{s.url}: {s.status}" + (f" ({s.reason})" if s.reason else "") for s in servers)
        raise BenchError(f"no server is up: {why}")
    if model_name is not None:
        for server in up:
            for model in server.models:
                if model.name in (model_name, f"{model_name}:latest"):
                    return server, model
        known = sorted({m.name for s in up for m in s.models})
        listed = ", ".join(known) if known else "none"
        raise BenchError(f"unknown model {model_name!r} (the server lists: {listed})")
    loaded = [(s, m) for s in up for m in s.models if is_loaded(m.phase)]
    if not loaded:
        where = ", ".join(s.url for s in up)
        raise BenchError(f"no model loaded on {where}: load one, or name it with --model")
    if len(loaded) > 1:
        names = ", ".join(f"{m.name} ({s.url})" for s, m in loaded)
        raise BenchError(f"several models are loaded: {names}; choose one with --model")
    return loaded[0]


def _find(snapshot: Snapshot, url: str, name: str) -> ModelStatus | None:
    for server, model in snapshot.models():
        if same_server(server.url, url) and model.name == name:
            return model
    return None


def _busy(snapshot: Snapshot, url: str) -> ModelStatus | None:
    for server, model in snapshot.models():
        if same_server(server.url, url) and is_busy(model.phase):
            return model
    return None


def _hardware_detail(snapshot: Snapshot) -> dict[str, object]:
    host = snapshot.hardware.host
    return {
        "gpus": [
            {"name": g.name, "vram_total_bytes": g.vram_total_bytes, "vram_used_bytes": g.vram_used_bytes}
            for g in snapshot.hardware.gpus
        ],
        "ram_bandwidth_gbps": host.ram_bandwidth_gbps,
        "ram_bandwidth_source": host.ram_bandwidth_source,
    }


def make_target(server: ServerStatus, model: ModelStatus, snapshot: Snapshot, hardware: str) -> BenchTarget:
    quantization = model.quantization or (model.facts.quantization if model.facts else None)
    return BenchTarget(
        server_url=server.url,
        server_kind=server.kind,
        server_version=server.version,
        model=model.name,
        quantization=quantization,
        facts=model.facts,
        context_length=model.context_length,
        gpu_fraction=model.gpu_fraction,
        gpu_fraction_source=model.gpu_fraction_source,
        vram_bytes=model.vram_bytes,
        hardware=hardware,
        hardware_detail=_hardware_detail(snapshot),
        spec_type=model.spec_type,
    )


# --------------------------------------------------------------------------- progress


class ProgressSink(Protocol):
    """Where a bench says how far it is: the terminal line below, or the tray's bench window."""

    def show(self, label: str) -> None: ...

    def step(self) -> None: ...

    def clear(self) -> None: ...


class Progress:
    """One `\\r` line on stderr, only when stderr is a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.total = max(total, 1)
        self.done = 0
        self._width = 0

    def show(self, label: str) -> None:
        if not self.enabled:
            return
        filled = round(20 * self.done / self.total)
        line = f"bench [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} {label}"
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def step(self) -> None:
        self.done += 1

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


# --------------------------------------------------------------------------- the run loop


@dataclass
class _Plan:
    settings: BenchSettings
    context_length: int | None
    filler_tokens: float = FILLER_TOKENS_GUESS  # tokens per FILLER, refined from the long-prompt runs
    base_tokens: int | None = None  # tokens of a short prompt (prefix and chat template included)

    def reps_for(self, depth: int) -> int:
        return max(1, round((depth - (self.base_tokens or 0)) / self.filler_tokens))

    def learn(self, reps: int, prompt_tokens: int | None) -> None:
        if prompt_tokens is not None and self.base_tokens is not None and prompt_tokens > self.base_tokens:
            self.filler_tokens = max(1.0, (prompt_tokens - self.base_tokens) / reps)


class _Bench:
    def __init__(
        self,
        monitor: Monitor,
        client: BenchClient,
        target: BenchTarget,
        plan: _Plan,
        thresholds: Thresholds,
        progress: ProgressSink,
        cancel: threading.Event | None = None,
        local: bool = True,
    ) -> None:
        self.monitor, self.client, self.target, self.plan = monitor, client, target, plan
        self.thresholds, self.progress, self.cancel = thresholds, progress, cancel
        self.runs: list[BenchRun] = []
        self.warnings: list[str] = []
        self.sweep_stopped: str | None = None
        self._nonce = secrets.token_hex(6)
        self._count = 0
        self._spill_named = False
        self.energy = BenchEnergy(monitor._read_hardware, local=local)

    def _prompt(self, reps: int) -> str:
        self._count += 1
        prefix = f"[bench {self._nonce}-{self._count}] "  # unique: no prompt cache can serve it
        return prefix + (FILLER * reps if reps else "") + SHORT_PROMPT

    def _placement(self) -> tuple[float | None, bool]:
        """The model's GPU share now (a monitor tick) and whether it spilled since the start."""
        try:
            model = _find(self.monitor.tick(), self.target.server_url, self.target.model)
        except Exception as exc:  # a failed tick costs only the spill check
            log.warning("bench: monitor tick failed: %s", exc)
            return None, False
        share = model.gpu_fraction if model is not None else None
        self._better_facts(model)
        if model is not None and model.context_length:  # known once a router has loaded the model
            self.plan.context_length = model.context_length
            if self.target.context_length is None:
                self.target = replace(self.target, context_length=model.context_length)
        spilled = is_spill(self.target.gpu_fraction, share, self.thresholds)
        if spilled and not self._spill_named:
            self._spill_named = True
            self.warnings.append(
                "the model spilled to the CPU during the bench: GPU share "
                f"{format_pct(self.target.gpu_fraction)} at the start, {format_pct(share)} at run "
                f"{len(self.runs) + 1}"
            )
        return share, spilled

    def _better_facts(self, model: ModelStatus | None) -> None:
        """Exact facts (read from the model file in the background) replace the first tick's estimate."""
        if model is None or model.facts is None or not model.facts.exact:
            return
        if self.target.facts is None or not self.target.facts.exact:
            self.target = replace(self.target, facts=model.facts)

    def refresh_facts(self) -> None:
        """One more tick at the end when the facts are still an estimate (a short bench)."""
        if self.target.facts is None or not self.target.facts.exact:
            with contextlib.suppress(Exception):
                self._better_facts(_find(self.monitor.tick(), self.target.server_url, self.target.model))

    def _one(self, kind: RunKind, warmup: bool, depth: int, reps: int, max_tokens: int) -> BenchRun:
        if self.cancel is not None and self.cancel.is_set():
            raise BenchCancelled
        label = ("warm-up" if warmup else kind) + (f" @ {format_tokens(depth)}" if depth else "")
        self.progress.show(label)
        share, spilled = (None, False) if warmup else self._placement()
        self.energy.begin()
        generation: Generation = self.client.generate(self.target.model, self._prompt(reps), max_tokens)
        energy_j = self.energy.end()
        run = bench_run(
            generation.record,
            kind=kind,
            warmup=warmup,
            depth_tokens=depth,
            streamed_tokens=generation.streamed_tokens,
            first_text_s=generation.first_text_mono_s,
            last_text_s=generation.last_text_mono_s,
            wall_s=generation.wall_s,
            gpu_fraction=share,
            spilled=spilled,
        )
        run = replace(run, energy_j=energy_j)
        self.runs.append(run)
        self.progress.step()
        rate = run.decode_tok_s if kind != "prompt" else run.prompt_tok_s
        self.progress.show(f"{label}: {format_rate(rate)} tok/s")
        return run

    def _fits(self, depth: int, tokens: int) -> str | None:
        limit = self.plan.context_length
        if limit is not None and depth + tokens > limit:
            return (
                f"depth {depth} + {tokens} generated tokens exceeds the server's context of {limit} tokens "
                f"(per slot): the sweep stops here"
            )
        return None

    def run(self) -> None:
        from trayapp.services.bench_client import ContextExceededError

        s = self.plan.settings
        self.energy.sample_idle()
        for i in range(s.warmup + s.runs):
            run = self._one("decode", i < s.warmup, 0, 0, s.tokens)
            if self.plan.base_tokens is None and run.prompt_tokens:
                self.plan.base_tokens = run.prompt_tokens
        prompt_reps = self.plan.reps_for(s.prompt_depth_tokens)
        for i in range((1 if s.warmup else 0) + s.runs):
            run = self._one(
                "prompt", s.warmup > 0 and i == 0, s.prompt_depth_tokens, prompt_reps, PROMPT_RUN_TOKENS
            )
            self.plan.learn(prompt_reps, run.prompt_tokens)
        for depth in (d for d in s.depths if d > 0):
            why = self._fits(depth, s.tokens)
            if why is not None:
                self.sweep_stopped = why
                return
            reps = self.plan.reps_for(depth)
            for _ in range(s.runs):
                try:
                    self._one("sweep", False, depth, reps, s.tokens)
                except ContextExceededError as exc:
                    self.sweep_stopped = (
                        f"depth {depth}: the server refused the prompt ({exc}): the sweep stops here"
                    )
                    return


def _api_key(monitor: Monitor, url: str) -> str | None:
    from trayapp.sources import secrets as keys

    for config in (*monitor.settings.endpoints, *monitor.options.extra_endpoints):
        if same_server(config.url, url) and (config.api_key_env or config.use_keyring):
            key, _ = keys.resolve_api_key(
                config.url, api_key_env=config.api_key_env, use_keyring=config.use_keyring
            )
            return key
    return None


def _machine(monitor: Monitor, snapshot: Snapshot, url: str) -> Machine:
    machines, default = monitor._machines(snapshot.hardware)  # the machines this tick's ceilings used
    return machines.get(url, default)


def find_target(
    monitor: Monitor,
    urls: Sequence[str],
    model_name: str | None,
    force: bool,
    warn: TextIO | None = None,
) -> tuple[Snapshot, ServerStatus, ModelStatus]:
    """The snapshot, server and model to bench (BenchError when there is none, or it is busy)."""
    snapshot = monitor.tick()
    for warning in monitor.warnings:
        if warn is not None:
            print(f"llm-tray: {warning}", file=warn)
    server, model = pick_target(snapshot, urls, model_name)
    if _busy(snapshot, server.url) is not None:
        time.sleep(monitor.settings.monitor.poll_active_s)  # a phase needs a second poll to be sure
        snapshot = monitor.tick()
        server, model = pick_target(snapshot, urls, model_name)
        other = _busy(snapshot, server.url)
        if other is not None and not force:
            raise BenchError(
                f"{server.url} is busy: another client is using it ({other.name} is in {other.phase}); "
                "its numbers would be shared with that work. Wait, or bench anyway with --force"
            )
    return snapshot, server, model


def run_job(
    monitor: Monitor,
    snapshot: Snapshot,
    server: ServerStatus,
    model: ModelStatus,
    options: BenchOptions,
    progress: ProgressSink,
    cancel: threading.Event | None = None,
) -> BenchOutcome:
    """Bench `model` on `server` (found by `find_target`); Ctrl-C or `cancel` keep what finished."""
    from trayapp.core.pipeline import hardware_label
    from trayapp.services.bench_client import BenchClient, BenchRequestError

    machine = _machine(monitor, snapshot, server.url)
    target = make_target(server, model, snapshot, hardware_label(machine))
    prompt_depth = PROMPT_DEPTH_TOKENS
    if target.context_length:
        prompt_depth = min(prompt_depth, max(64, target.context_length // 2 - PROMPT_RUN_TOKENS))
    settings = BenchSettings(
        tokens=options.tokens,
        runs=options.runs,
        warmup=options.warmup,
        depths=tuple(options.depths),
        prompt_depth_tokens=prompt_depth,
        forced=options.force,
    )
    thresholds = monitor.settings.thresholds
    started = time.time()
    interrupted, failure = False, None
    with BenchClient(server.url, server.kind, api_key=_api_key(monitor, server.url)) as client:
        plan = _Plan(settings, target.context_length)
        local = server.url not in monitor._machines(snapshot.hardware)[0]
        bench = _Bench(monitor, client, target, plan, thresholds, progress, cancel, local)
        try:
            bench.run()
        except (KeyboardInterrupt, BenchCancelled):
            interrupted = True
        except BenchRequestError as exc:
            failure = str(exc)
        finally:
            progress.clear()
        if not interrupted:
            bench.refresh_facts()
        target = bench.target
    warnings = bench.warnings + ([f"stopped: {failure}"] if failure else [])
    result = summarize(
        target,
        settings,
        bench.runs,
        machine,
        thresholds,
        started_wall_s=started,
        finished_wall_s=time.time(),
        sweep_stopped=bench.sweep_stopped,
        interrupted=interrupted,
        warnings=warnings,
        calibrated_efficiency=stored_calibration(target),
        energy_reason=bench.energy.reason,
    )
    return BenchOutcome(result, failure)
