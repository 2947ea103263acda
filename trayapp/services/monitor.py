"""The headless monitor: discovery + probes + hardware → pipeline → store.

Used by the tray (on its sampler thread), `watch`, `status` and `agent`.
Never imports Qt. `tick()` blocks on I/O, so GUI code calls it only from a
worker thread. One hung endpoint never delays the others: each server is
polled on its own thread with its own timeouts, and a poll that overruns the
tick budget is reported as such while it finishes in the background.
Remote machines (`[[agents]]`, sources/remote_agent.py) are asked for their snapshot in
parallel with the probes; their servers and alerts join this machine's after the pipeline
(they are neither recorded nor diagnosed here: their agent does both).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from trayapp.config import paths
from trayapp.config.bugs import BugLog
from trayapp.config.settings import EndpointConfig, Settings
from trayapp.core.hardware_readings import HardwareProfile, HardwareSnapshot
from trayapp.core.loopback import same_server
from trayapp.core.machine import Machine, resolve_machine
from trayapp.core.model import FinishedRequest, ServerReading, Snapshot
from trayapp.core.peers import PeerBand, band_with_causes
from trayapp.core.phases import is_active
from trayapp.core.pipeline import Pipeline, Priors, TickOutput
from trayapp.core.probe import ServerProbe
from trayapp.core.proxied_streams import with_proxied_streams
from trayapp.core.rate_helpers import merge_proxy_records, with_prompt_totals
from trayapp.core.redact import redact_url
from trayapp.services.poll_thread import PollThread, ServerActivity, safe_poll
from trayapp.services.priors import stored_baselines, stored_bench_priors
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources import secrets
from trayapp.sources.discovery import Discovery, Endpoint, make_probe
from trayapp.sources.facts_loader import ModelFactsLoader
from trayapp.sources.hardware import HardwareProbe
from trayapp.sources.hwtable import gpu_lookup
from trayapp.sources.peers_table import load_peers, peer_query
from trayapp.sources.remote_agent import RemoteAgents

if TYPE_CHECKING:
    from trayapp.core.bench import BenchResult
    from trayapp.sinks.store import Store
    from trayapp.sources.ram_bandwidth import RamBandwidthKeeper

log = logging.getLogger(__name__)

POLL_BUDGET_S = 3.0  # a tick waits at most this long for slow servers
HUNG_AFTER_S = 10.0  # a server silent this long is reported as hung
PROXY_RECORD_WAIT_S = 60.0  # how long a proxy record waits for its server's next reading
STORE_RETRY_S = 10.0  # a store another process holds is tried again this often while not recording
_INBOX_LOCK = threading.Lock()  # makes the inbox of a monitor that had none (accept_proxy_records)


@dataclass(frozen=True)
class MonitorOptions:
    extra_endpoints: tuple[EndpointConfig, ...] = ()
    discover: bool | None = None  # None: as configured
    profile: HardwareProfile | None = None  # hardware overrides from the command line
    record: bool = True
    one_shot: bool = False


class Monitor:
    def __init__(
        self,
        settings: Settings,
        *,
        extra_endpoints: Sequence[EndpointConfig] = (),
        discover: bool | None = None,
        profile: HardwareProfile | None = None,
        record: bool = True,
        one_shot: bool = False,
        hardware_probe: HardwareProbe | None = None,
        measure_ram: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        proxy_inbox: RecordInbox | None = None,
    ) -> None:
        self.options = MonitorOptions(tuple(extra_endpoints), discover, profile, record, one_shot)
        self.settings = settings
        self._clock = clock
        self._wall = wall_clock
        self.warnings: list[str] = []
        self.last_snapshot: Snapshot | None = None
        self._hardware = hardware_probe or HardwareProbe()
        self._ram_keeper: RamBandwidthKeeper | None = None  # None: the bandwidth is given, or not measured
        if measure_ram and self._profile().ram_bandwidth_gbps is None:
            self._measure_ram_bandwidth()
        self._polls: dict[str, PollThread] = {}  # by server URL
        self._activity = ServerActivity()
        self._last_reading: dict[str, tuple[ServerReading, float]] = {}
        self._store: Store | None = None
        self._locked_out: str | None = None  # why not recording: another process holds the store
        self._store_retry_mono_s = 0.0  # when a held store is tried again (STORE_RETRY_S)
        self._record_bug: str | None = None  # the last tick's store bug, shown as the store error
        self._bugs = BugLog(log)  # this monitor's boundary: each bug's traceback logged once
        self._peer_band_cache: dict[tuple[tuple[str, ...], str | None], PeerBand | None] = {}
        if record:
            self._open_store()
        self.pipeline = Pipeline(
            settings.thresholds,
            idle_gap_s=settings.monitor.session_idle_gap_s,
            one_shot=one_shot,
        )
        self._discovery = self._make_discovery()
        self._last_status: dict[str, str] = {}
        self._paused = False
        self._proxy_inbox = proxy_inbox
        self._proxy_waiting: list[tuple[str, FinishedRequest, float]] = []  # for a server not read yet
        self._remote = RemoteAgents(settings.agents)

    # ------------------------------------------------------------------ setup

    def _profile(self) -> HardwareProfile:
        return self.settings.hardware.profile().overridden_by(self.options.profile)

    def _measure_ram_bandwidth(self) -> None:
        from trayapp.sources.ram_bandwidth import RamBandwidthKeeper, default_cache_path

        self._ram_keeper = RamBandwidthKeeper(default_cache_path(), clock=self._clock, wall_clock=self._wall)
        try:
            record = self._ram_keeper.load_or_measure()
        except Exception as exc:  # a failed benchmark only costs the CPU-side ceiling
            self.warnings.append(f"RAM bandwidth measurement failed: {exc}")
            return
        self._hardware.set_measured_ram_bandwidth(record)

    def _recheck_ram_bandwidth(self, snapshot: Snapshot) -> None:
        """Keep the one stored RAM bandwidth: adopt a higher figure another process stored, and measure
        again in the background on a provisional figure or on evidence (hardware changed, contradicted)."""
        keeper = self._ram_keeper
        if keeper is not None and keeper.current is not None and not self.options.one_shot:
            keeper.after_tick(snapshot, self._hardware.set_measured_ram_bandwidth)

    def _open_store(self) -> None:
        """Open the store as its writer. Held by another process: the store error says so while it
        lasts, and the store is tried again each STORE_RETRY_S (the tray records once it lets go)."""
        from trayapp.sinks.store import Store, StoreLockedError

        cfg = self.settings.store
        try:
            self._store = Store(
                paths.store_file(),
                writer=True,
                sample_interval_s=cfg.sample_interval_s,
                retention_days=cfg.retention_days,
                max_size_bytes=int(cfg.max_size_mb * 2**20),
            )
        except StoreLockedError as exc:
            self._locked_out, self._store = f"not recording: {exc}", None
            self._store_retry_mono_s = self._clock() + STORE_RETRY_S
            return
        except Exception as exc:
            self.warnings.append(f"not recording: cannot open the store ({exc})")
            self._store = None
            return
        if self._locked_out is not None:
            log.info("recording to %s: the process that held it let go", paths.store_file())
        self._locked_out = None

    def _endpoint_configs(self) -> list[EndpointConfig]:
        seen: set[str] = set()
        merged: list[EndpointConfig] = []
        for endpoint in (*self.settings.endpoints, *self.options.extra_endpoints):
            if endpoint.url not in seen:
                seen.add(endpoint.url)
                merged.append(endpoint)
        return merged

    def _make_discovery(self) -> Discovery:
        configs = {e.url: e for e in self._endpoint_configs()}
        endpoints = [
            Endpoint(
                url=e.url,
                kind=e.kind,
                api_key_env=e.api_key_env,
                name=e.name,
            )
            for e in configs.values()
        ]
        discover = self.settings.monitor.discover if self.options.discover is None else self.options.discover

        def api_key_lookup(endpoint: Endpoint) -> str | None:
            config = configs.get(endpoint.url)
            if config is None:
                return None
            key, why = secrets.resolve_api_key(
                endpoint.url, api_key_env=config.api_key_env, use_keyring=config.use_keyring
            )
            if why and endpoint.url not in self._key_warned:
                self._key_warned.add(endpoint.url)
                self.warnings.append(f"{redact_url(endpoint.url)}: no API key ({why})")
            return key

        self._key_warned: set[str] = set()
        return Discovery(
            endpoints,
            scan_defaults=discover,
            reprobe_interval_s=self.settings.monitor.rediscover_s,
            probe_factory=functools.partial(make_probe, ollama_log=self.settings.monitor.ollama_log),
            facts_loader=ModelFactsLoader(),
            api_key_lookup=api_key_lookup,
        )

    # ------------------------------------------------------------------ public

    def apply_settings(self, settings: Settings) -> None:
        """Take new settings without a restart (endpoints, thresholds, intervals)."""
        endpoints_changed = (
            settings.endpoints,
            settings.monitor.discover,
            settings.hardware,
            settings.monitor.ollama_log,
        ) != (
            self.settings.endpoints,
            self.settings.monitor.discover,
            self.settings.hardware,
            self.settings.monitor.ollama_log,
        )
        if settings.agents != self.settings.agents:
            self._remote.close()
            self._remote = RemoteAgents(settings.agents)
        self.settings = settings
        self.pipeline.set_thresholds(settings.thresholds)
        self.pipeline.sessions.idle_gap_s = settings.monitor.session_idle_gap_s
        if endpoints_changed:
            self._discovery.close()
            self._discovery = self._make_discovery()

    def set_paused(self, paused: bool) -> None:
        self._paused = paused

    def tick(self, budget_s: float = POLL_BUDGET_S) -> Snapshot:
        """Poll everything once and return the new snapshot (blocking I/O, at most ~budget_s)."""
        now_mono = self._clock()
        self._remote.submit()
        probes = self._discovery.refresh(now_mono)
        readings = self._with_proxy_records(self._poll_all(probes, now_mono, budget_s), self._clock())
        hardware = self._read_hardware()
        machines, default_machine = self._machines(hardware)
        now_wall_s = self._wall()
        baselines, plain = stored_baselines(
            self._store, self.last_snapshot, machines, default_machine, now_wall_s, self._bugs
        )
        calibrations, bench_rates = stored_bench_priors(
            self._store, self.last_snapshot, machines, default_machine, now_wall_s, self._bugs
        )
        priors = Priors(
            baselines=baselines,
            plain_baselines=plain,
            calibrations=calibrations,
            bench_rates=bench_rates,
            peer_bands=self._peer_bands(readings, machines, hardware),
        )
        output = self.pipeline.process(
            readings, hardware, machines, default_machine, self._clock(), self._wall(), priors=priors
        )
        self._log_transitions(output.snapshot)
        if self._locked_out is not None and self._clock() >= self._store_retry_mono_s:
            self._open_store()  # the process that held it may have gone: the tray records from then on
        if self._store is not None and not self._paused:
            self._record(output)
        snapshot = self._remote.merge(output.snapshot, now_mono + budget_s - self._clock())
        self.last_snapshot = snapshot
        self._recheck_ram_bandwidth(output.snapshot)
        self.activity_seen()  # the servers' CPU marked after this poll: the next look counts from here
        return snapshot

    def next_interval_s(self) -> float:
        """About 1 s while something generates, slower when idle."""
        snap = self.last_snapshot
        cfg = self.settings.monitor
        if snap is not None and any(is_active(m.phase) for _, m in snap.models()):
            return cfg.poll_active_s
        return cfg.poll_idle_s

    def activity_seen(self) -> bool:
        """A server on this machine used CPU since the last look: poll now (settings.ACTIVITY_CHECK_S)."""
        return self._activity.seen((reading for reading, _ in self._last_reading.values()), self._clock())

    def close(self) -> None:
        self._remote.close()
        self._discovery.close()
        for thread in self._polls.values():
            thread.stop()
        self._polls = {}
        self._hardware.close()
        if self._store is not None:
            last = self.last_snapshot
            ended_wall_s = last.t_wall_s if last is not None else self._wall()
            alerts = [
                replace(a, ended_wall_s=ended_wall_s)
                for a in (last.alerts if last is not None else ())
                if a.ended_wall_s is None
            ]
            try:  # its sessions and alerts end as it stops recording: none reads "live" afterwards
                self._store.record_stop(self.pipeline.sessions.end_all(), alerts)
            except Exception as exc:  # a bug: logged once, the store still closes
                self._bugs.report(exc, "store: ending the sessions and alerts")
            self._store.close()
            self._store = None

    @property
    def store_error(self) -> str | None:
        if self._store is None:
            return self._locked_out
        return self._record_bug or self._store.last_error

    def record_bench(self, result: BenchResult) -> tuple[bool, str | None] | None:
        """Keep a bench's result as the baseline through this monitor's store, whose writer it is
        (the tray's bench: a second writer would be refused): (stored, a note). Safe from any
        thread (the store locks). None when this monitor records nothing (no store of its own)."""
        if self._store is None or not self._store.writer:
            return None
        from trayapp.core.bench import baseline_refusal
        from trayapp.sinks.store import StoreError

        refusal = baseline_refusal(result)
        if refusal is not None:
            return False, refusal
        try:
            written = self._store.record_bench(result)
        except StoreError as exc:
            return False, f"not stored as the baseline: {exc}"
        return bool(written), None

    def accept_proxy_records(
        self, upstreams: Sequence[str], lease_s: float, records: Sequence[tuple[str, FinishedRequest]]
    ) -> tuple[list[str], bool]:
        """Records of a recording proxy in another process (`llm-tray proxy` while this monitor
        holds the store; POST /v1/records): into the inbox the tray's own proxies feed, so they take
        the same path to the live view and the store. `upstreams` count as proxied for `lease_s`.
        Safe from any thread. Returns (the upstreams this monitor does not watch, whose records wait
        for a reading and are then dropped; whether it records to the store)."""
        with _INBOX_LOCK:
            if self._proxy_inbox is None:  # an agent's monitor has no proxies of its own
                self._proxy_inbox = RecordInbox()
            inbox = self._proxy_inbox
        inbox.lend(upstreams, lease_s)
        for url, record in records:
            inbox.put(url, record)
        recording = self._store is not None and not self._paused
        snapshot = self.last_snapshot
        if snapshot is None:  # not polled yet: nothing to say
            return [], recording
        watched = [server.url for server in snapshot.servers if server.machine is None]
        return [u for u in upstreams if not any(same_server(u, w) for w in watched)], recording

    # ------------------------------------------------------------------ internals

    def _poll_all(
        self, probes: Sequence[ServerProbe], now_mono: float, budget_s: float
    ) -> list[ServerReading]:
        """Poll every server at once; wait at most `budget_s` for answers.

        A server still answering an earlier poll is not polled again. Until it has been
        silent for HUNG_AFTER_S its last reading is repeated with its age (so `watch`
        keeps its cadence and a slow prefill does not flap the status); after that it is
        reported as hung.
        """
        urls = {probe.url for probe in probes}
        for url in [url for url, thread in self._polls.items() if url not in urls and not thread.running()]:
            self._polls.pop(url).stop()  # a server no longer watched (one still answering: next time)
        for probe in probes:
            thread = self._polls.get(probe.url)
            if thread is None:
                thread = self._polls[probe.url] = PollThread(probe.url)
            if not thread.running():
                poll = functools.partial(safe_poll, probe, now_mono, self._clock, self._bugs)
                thread.start(poll, now_mono)
        deadline_s = time.monotonic() + budget_s
        for probe in probes:
            self._polls[probe.url].wait(deadline_s - time.monotonic())
        readings: list[ServerReading] = []
        now = self._clock()
        for probe in probes:
            thread = self._polls[probe.url]
            if not thread.running():
                reading = thread.reading
                if reading is None:  # safe_poll returns one unless something beyond Exception ended it
                    raise RuntimeError(f"the poll of {redact_url(probe.url)} ended without a reading")
                self._last_reading[probe.url] = (reading, now)
                readings.append(reading)
                continue
            last = self._last_reading.get(probe.url)
            waited = now - thread.started_s
            if last is not None and waited < HUNG_AFTER_S:
                readings.append(replace(last[0], age_s=now - last[1]))
            else:
                readings.append(
                    ServerReading(
                        kind=probe.kind,
                        url=probe.url,
                        status="error",
                        reason=f"no answer for {waited:.0f} s (server hung?)",
                    )
                )
        return readings

    def _with_proxy_records(self, readings: list[ServerReading], now_mono: float) -> list[ServerReading]:
        """Each server's finished requests with the recording proxy's records of it merged in."""
        if self._proxy_inbox is None:
            return readings
        waiting = self._proxy_waiting + [(url, r, now_mono) for url, r in self._proxy_inbox.take()]
        self._proxy_waiting = []
        merged = []
        for reading in readings:
            mine = [r for url, r, _ in waiting if same_server(url, reading.url)]
            waiting = [w for w in waiting if not same_server(w[0], reading.url)]
            if self._proxy_inbox.proxied(reading.url):
                totals = self._proxy_inbox.prompt_totals(reading.url)  # prompts being read, counted
                reading = with_prompt_totals(replace(reading, proxied=True), totals)
                reading = with_proxied_streams(reading, self._proxy_inbox.streams(reading.url))
            if mine and reading.age_s is None:  # a repeated reading already carried its records
                names = [m.name for m in reading.models if m.loaded]
                reading = replace(reading, finished=merge_proxy_records(reading.finished, mine, names))
            elif mine:
                waiting += [(reading.url, r, now_mono) for r in mine]
            merged.append(reading)
        for url, record, since in waiting:
            if now_mono - since < PROXY_RECORD_WAIT_S:
                self._proxy_waiting.append((url, record, since))
            else:
                log.warning("proxy record for %s dropped: that server is not being watched", redact_url(url))
        return merged

    def _read_hardware(self) -> HardwareSnapshot:
        return self._hardware.read()

    def _machines(self, hardware: HardwareSnapshot) -> tuple[dict[str, Machine], Machine]:
        profile = self._profile()
        default = resolve_machine(hardware, profile, gpu_lookup)
        machines: dict[str, Machine] = {}
        for endpoint in self._endpoint_configs():
            endpoint_profile = endpoint.hardware_profile(profile)
            if endpoint_profile != profile:  # a server on another machine, described in the config
                # keyed as its probe names the server (HttpProbe.url: no credentials)
                machines[redact_url(endpoint.url)] = resolve_machine(hardware, endpoint_profile, gpu_lookup)
        return machines, default

    def _record(self, output: TickOutput) -> None:
        """The store's boundary: a write error it returns (a full disk, a locked file) is its
        `last_error`; anything it raises is a bug, logged once with its traceback and shown as
        the store error until a tick records again."""
        assert self._store is not None
        try:
            self._store.record(output.snapshot, output.sessions)
        except Exception as exc:
            self._record_bug = self._bugs.report(exc, "store: record")
        else:
            self._record_bug = None

    def _peer_bands(
        self, readings: Sequence[ServerReading], machines: dict[str, Machine], hardware: HardwareSnapshot
    ) -> dict[tuple[str, str], PeerBand]:
        """The published peers' band of every model of this tick's local servers, for its
        quantization (#23; core/peers.py): the healthy band where no bench calibrated this machine.
        The machine is the GPU named by `--gpu` / the config, else the GPUs read here (none: its CPU).
        Cached per machine and quantization; a table that does not load is a bug, logged once."""
        given = self._profile().gpu_name
        gpus = (given,) if given else tuple(g.name for g in hardware.gpus)
        bands: dict[tuple[str, str], PeerBand] = {}
        for reading in readings:
            if reading.url in machines:
                continue  # a server on another machine, described in the config: not this hardware
            for model in reading.models:
                quant = model.quantization or (model.facts.quantization if model.facts else None)
                key = (gpus, quant)
                if key not in self._peer_band_cache:
                    try:
                        self._peer_band_cache[key] = band_with_causes(load_peers(), peer_query(gpus, quant))
                    except Exception as exc:
                        self._bugs.report(exc, "peers: band lookup")
                        self._peer_band_cache[key] = None
                band = self._peer_band_cache[key]
                if band is not None:
                    bands[(reading.url, model.name)] = band
        return bands

    def _log_transitions(self, snapshot: Snapshot) -> None:
        for server in snapshot.servers:
            before = self._last_status.get(server.url)
            if before != server.status:
                detail = f" ({server.reason})" if server.reason and server.status != "ok" else ""
                log.info("%s %s: %s → %s%s", server.kind, server.url, before or "new", server.status, detail)
                self._last_status[server.url] = server.status
