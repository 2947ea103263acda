"""The fleet view end to end (issue 6): a real Prometheus scrapes two `llm-tray agent`s on loopback.

Both agents (separate processes, each with its own `LLM_TRAY_HOME` and an ephemeral metrics
port) watch the real llama-server; a separate client generates on it; Prometheus (Debian's
2.42, `TESTING.md` §6) scrapes both agents every second. The test polls Prometheus's HTTP
API until it has stored the decode rate and the ceiling of the model from both agents, then
checks the stored numbers against the server's own timings, and runs every PromQL query of
the shipped Grafana dashboard against the same Prometheus.

The listener rule (#25, docs/prometheus.md "Security"): the second agent's /metrics listens beyond
loopback (`--listen-address 0.0.0.0`), so it needs the token; Prometheus scrapes it with
`authorization: {type: Bearer, credentials_file: ...}`, and a job without the token finds it down (401).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.llama import LlamaServer, decode_rate, free_port, generate_in_background, tokens_lasting

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "resources" / "grafana" / "llm-tray-dashboard.json"
MODEL = "gemma-3-270m-q4_k_m.gguf"
READY_TIMEOUT_S = 60.0
STORED_TIMEOUT_S = 120.0
MAX_GENERATIONS = 4  # bounded: more requests only if a generation ended before both agents were stored
GENERATION_S = 15.0  # each request decodes ~15 s at the server's own speed (500 tokens: 6 s on a fast host)
TEMPLATE_VARIABLES = ("instance", "server", "model")
# Series every agent exports while the model decodes on this CPU-only machine: a dashboard query
# reading only these must return data. (GPU share, VRAM, TTFT and alerts are legitimately empty here.)
LIVE_METRICS = (
    "llm_tray_decode_tokens_per_second",
    "llm_tray_ceiling_tokens_per_second",
    "llm_tray_efficiency_ratio",
    "llm_tray_context_size_tokens",
    "llm_tray_decoded_tokens_total",
)
_METRIC_NAME = re.compile(r"\bllm_tray_[a-z_]+\b")
FLEET_TOKEN = "fleet-scrape-token-8d1f"


# --------------------------------------------------------------------------- processes


class Processes:
    """Child processes with their logs; `stop_all` terminates each by pid, then kills what lingers."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.running.append((name, process))
        return process

    def log_tail(self, name: str, n_bytes: int = 3000) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def diagnostics(self) -> str:
        parts = []
        for name, process in self.running:
            state = "running" if process.poll() is None else f"exited {process.returncode}"
            parts.append(f"--- {name} ({state}):\n{self.log_tail(name)}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        for _, process in self.running:
            if process.poll() is None:
                process.terminate()
        for _, process in self.running:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


# --------------------------------------------------------------------------- Prometheus API


class PromApi:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.client = httpx.Client(trust_env=False, timeout=10.0)

    def close(self) -> None:
        self.client.close()

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        response = self.client.get(self.base_url + path, params=params)
        body: dict[str, Any] = response.json()
        assert body.get("status") == "success", f"{path} {params}: {response.status_code} {body}"
        return body

    def query(self, promql: str, at_s: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": promql}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        result: list[dict[str, Any]] = self.get("/api/v1/query", **params)["data"]["result"]
        return result

    def query_range(
        self, promql: str, start_s: float, end_s: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get(
            "/api/v1/query_range", query=promql, start=f"{start_s:.3f}", end=f"{end_s:.3f}", step=step_s
        )["data"]["result"]
        return result

    def wait_ready(self, processes: Processes, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert process.poll() is None, f"prometheus exited:\n{processes.diagnostics()}"
            try:
                if self.client.get(self.base_url + "/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"prometheus not ready within {READY_TIMEOUT_S:g} s:\n{processes.diagnostics()}")


def _values(series: dict[str, Any]) -> list[tuple[float, float]]:
    return [(float(t), float(v)) for t, v in series["values"]]


# --------------------------------------------------------------------------- the fleet


@dataclass
class Fleet:
    prom: PromApi
    instances: list[str]  # Prometheus's `instance` label of each agent
    server_url: str
    window: tuple[float, float] = (0.0, 0.0)  # wall time of the generation the data was stored during
    timings: dict[str, Any] = field(default_factory=dict)  # that generation's `timings` from the server
    live_at_s: float = 0.0  # a moment inside the window when both agents' decode rates were stored


def _prometheus_config(open_target: str, token_target: str, token_file: Path, no_token_target: str) -> str:
    """The loopback agent scraped as is; the agent beyond loopback with its token (as docs/prometheus.md
    shows), and once more without it (that job must find it down)."""
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: llm-tray\n    static_configs:\n      - targets: ['{open_target}']\n"
        "  - job_name: llm-tray-lan\n"
        f"    authorization:\n      type: Bearer\n      credentials_file: {token_file}\n"
        f"    static_configs:\n      - targets: ['{token_target}']\n"
        f"  - job_name: llm-tray-no-token\n    static_configs:\n      - targets: ['{no_token_target}']\n"
    )


def _stored_instances(prom: PromApi, metric: str) -> set[str]:
    """Agents (instance labels) for which Prometheus holds `metric` > 0 for the model in the last minutes."""
    result = prom.query(f'max by (instance) (max_over_time({metric}{{model="{MODEL}"}}[5m])) > 0')
    return {series["metric"]["instance"] for series in result}


def _wait_targets_up(prom: PromApi, instances: list[str], processes: Processes) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    health: dict[str, str] = {}
    while time.monotonic() < deadline:
        targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in targets}
        if all(health.get(i) == "up" for i in instances):
            return
        time.sleep(0.3)
    pytest.fail(f"agents not scraped within {READY_TIMEOUT_S:g} s: {health}\n{processes.diagnostics()}")


def _wait_target_refused(prom: PromApi, instance: str, processes: Processes) -> None:
    """The job without the token finds the agent beyond loopback down, with its 401."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    target: dict[str, Any] = {}
    while time.monotonic() < deadline:
        targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
        target = next((t for t in targets if t["labels"]["instance"] == instance), {})
        if target.get("health") == "down" and "401" in target.get("lastError", ""):
            return
        time.sleep(0.3)
    pytest.fail(f"the scrape without a token was not refused: {target}\n{processes.diagnostics()}")


def _latest_common_decode(fleet: Fleet) -> float | None:
    """A time in the window at which Prometheus holds a decode rate from every agent.

    The middle one, not the latest: at the edge of a decoding run an agent's series may be going
    stale between scrapes, so other live series of that agent can be missing there.
    """
    start_s, end_s = fleet.window
    series = fleet.prom.query_range(
        f'llm_tray_decode_tokens_per_second{{model="{MODEL}"}}', start_s, end_s + 2
    )
    stamps = [{t for t, _ in _values(s)} for s in series]
    common = set.intersection(*stamps) if len(stamps) == len(fleet.instances) else set()
    return sorted(common)[len(common) // 2] if common else None


def _wait_metrics(port: int, processes: Processes, headers: dict[str, str] | None = None) -> None:
    """Until the agent on `port` answers /metrics (bounded)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    pace = threading.Event()
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        pace.wait(0.2)
    why = f"agent on {port} did not serve /metrics within {READY_TIMEOUT_S:g} s"
    pytest.fail(f"{why}\n{processes.diagnostics()}")


def _generate_until_stored(fleet: Fleet, processes: Processes) -> None:
    """Generate (bounded), polling Prometheus until decode and ceiling > 0 are stored from both agents."""
    wanted = set(fleet.instances)
    deadline = time.monotonic() + STORED_TIMEOUT_S
    decode: set[str] = set()
    ceiling: set[str] = set()
    tokens = tokens_lasting(decode_rate(fleet.server_url), GENERATION_S)
    for _ in range(MAX_GENERATIONS):
        started = time.time()
        future: Future[dict[str, Any]] = generate_in_background(
            fleet.server_url, "Write a long story about a lighthouse keeper.", tokens, ignore_eos=True
        )
        stored_at = None
        while not future.done() and time.monotonic() < deadline:
            decode = _stored_instances(fleet.prom, "llm_tray_decode_tokens_per_second")
            ceiling = _stored_instances(fleet.prom, "llm_tray_ceiling_tokens_per_second")
            if stored_at is None and decode >= wanted and ceiling >= wanted:
                stored_at = time.time()
            time.sleep(0.5)
        result = future.result(timeout=max(1.0, deadline - time.monotonic()))
        if stored_at is not None:
            fleet.window = (started, time.time())
            fleet.timings = result["timings"]
            fleet.live_at_s = _latest_common_decode(fleet) or stored_at
            return
        if time.monotonic() >= deadline:
            break
    pytest.fail(
        f"Prometheus did not store decode > 0 (from {sorted(decode)}) "
        f"and ceiling > 0 (from {sorted(ceiling)}) "
        f"for both agents {sorted(wanted)} within {STORED_TIMEOUT_S:g} s\n{processes.diagnostics()}"
    )


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "prometheus not installed (apt-get install prometheus; CI installs it via tests/provision.sh)"
        )
    return binary


@pytest.fixture(scope="module")
def fleet(
    prometheus_binary: str, llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two agents + Prometheus, with one generation's worth of data stored from both agents."""
    root = tmp_path_factory.mktemp("fleet")
    processes = Processes(root)
    prom = PromApi("")
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            env = {**os.environ, "LLM_TRAY_HOME": str(root / f"agent{i}-home")}
            env.pop("LLM_TRAY_TOKEN", None)
            lan = ["--listen-address", "0.0.0.0"] if i == 1 else []  # beyond loopback: the token rule
            if i == 1:
                env["LLM_TRAY_TOKEN"] = FLEET_TOKEN
            processes.start(
                f"agent{i}",
                [sys.executable, "-m", "trayapp", "agent", "--metrics-port", str(port), *lan,
                 "--endpoint", llama_server.url, "--no-discover"],
                env=env,
            )  # fmt: skip
            # One at a time: each agent measures the RAM bandwidth before it serves /metrics, and two
            # measuring at once on a small host would each see part of it (a ceiling below the decode).
            _wait_metrics(port, processes, {"Authorization": f"Bearer {FLEET_TOKEN}"} if i == 1 else None)
        unauthorized = httpx.get(f"http://127.0.0.1:{ports[1]}/metrics", timeout=5.0)
        assert unauthorized.status_code == 401 and "llm_tray_" not in unauthorized.text
        assert "warning: /metrics listens beyond loopback" in processes.log_tail("agent1", 20000)
        instances = [f"127.0.0.1:{port}" for port in ports]
        token_file = root / "scrape-token"
        token_file.write_text(FLEET_TOKEN + "\n")
        token_file.chmod(0o600)
        config = root / "prometheus.yml"
        no_token_instance = f"localhost:{ports[1]}"
        config.write_text(_prometheus_config(instances[0], instances[1], token_file, no_token_instance))
        prom_port = free_port()
        prometheus = processes.start(
            "prometheus",
            [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
        )  # fmt: skip
        prom = PromApi(f"http://127.0.0.1:{prom_port}")
        prom.wait_ready(processes, prometheus)
        _wait_targets_up(prom, instances, processes)
        _wait_target_refused(prom, no_token_instance, processes)
        fleet = Fleet(prom=prom, instances=instances, server_url=llama_server.url)
        _generate_until_stored(fleet, processes)
        yield fleet
    finally:
        processes.stop_all()
        prom.close()


# --------------------------------------------------------------------------- tests


@pytest.mark.prometheus
@pytest.mark.llamacpp
def test_prometheus_stores_decode_rate_and_ceiling_from_two_agents(fleet: Fleet) -> None:
    start_s, end_s = fleet.window
    server_rate = fleet.timings["predicted_per_second"]
    selector = f'{{model="{MODEL}", server="{fleet.server_url}", kind="llamacpp"}}'
    decode = {s["metric"]["instance"]: _values(s) for s in fleet.prom.query_range(
        f"llm_tray_decode_tokens_per_second{selector}", start_s, end_s + 2)}  # fmt: skip
    ceiling = {s["metric"]["instance"]: dict(_values(s)) for s in fleet.prom.query_range(
        f"llm_tray_ceiling_tokens_per_second{selector}", start_s, end_s + 2)}  # fmt: skip

    assert set(decode) == set(fleet.instances), f"decode stored from {sorted(decode)}"
    assert set(ceiling) == set(fleet.instances), f"ceiling stored from {sorted(ceiling)}"
    assert len(set(fleet.instances)) == 2
    for instance in fleet.instances:
        rates = decode[instance]
        assert rates and all(rate > 0 for _, rate in rates), (instance, rates)
        for t, rate in rates:  # the same evaluation step: decode never (beyond noise) exceeds the ceiling
            assert t in ceiling[instance], f"{instance}: decode at {t} without a ceiling"
            # The stored decode rate is the agent's polled estimate, which agrees with the server's own
            # timings to 10 % (test_watch_reports_the_servers_own_decode_rate); the ceiling is a bound.
            assert 0 < rate <= 1.10 * ceiling[instance][t], (
                f"{instance}: decode {rate:.1f} > ceiling {ceiling[instance][t]:.1f} + 10 %"
            )
        median = statistics.median(rate for _, rate in rates)
        assert median == pytest.approx(server_rate, rel=0.30), (
            f"{instance}: stored decode rates {[round(r, 1) for _, r in rates]} vs the server's own "
            f"{server_rate:.1f} tok/s"
        )


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _panel_targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:  # rows may nest panels
            for target in inner.get("targets", []):
                found.append((inner["title"], target))
    return found


def _substitute(expr: str) -> str:
    """A Grafana query as Prometheus would receive it with every variable on "All"."""
    text = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5s", expr)
    for name in TEMPLATE_VARIABLES:
        text = re.sub(r"\$\{" + name + r"(:\w+)?\}|\$" + name + r"\b", ".*", text)
    assert "$" not in text, f"unsubstituted variable in {expr!r}"
    return text


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = _dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in TEMPLATE_VARIABLES:
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for needed in ("decode tok/s vs ceiling", "efficiency", "gpu share", "context depth vs size", "vram",
                   "time to first token", "active alerts by kind", "decoded tokens"):  # fmt: skip
        assert needed in titles, f"no {needed!r} panel in {titles}"
    for title, target in _panel_targets(dashboard):
        assert target["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, title
        names = set(_METRIC_NAME.findall(target["expr"]))
        assert names, f"{title}: no llm_tray_ metric in {target['expr']!r}"
        needed_variables = {"instance"}  # every series comes from an agent
        if names - {"llm_tray_gpu_vram_used_bytes", "llm_tray_gpu_vram_total_bytes"}:
            needed_variables.add("server")
        if names - {"llm_tray_gpu_vram_used_bytes", "llm_tray_gpu_vram_total_bytes", "llm_tray_server_up"}:
            needed_variables.add("model")  # per-model series follow every variable
        for name in needed_variables:
            assert f"${name}" in target["expr"] or f"${{{name}}}" in target["expr"], (title, name)


@pytest.mark.prometheus
@pytest.mark.llamacpp
def test_every_dashboard_query_runs_on_the_real_prometheus(fleet: Fleet) -> None:
    dashboard = _dashboard()
    targets = _panel_targets(dashboard)
    assert len(targets) >= 10
    empty: list[str] = []
    for title, target in targets:
        promql = _substitute(target["expr"])
        result = fleet.prom.query(promql, at_s=fleet.live_at_s)  # asserts status "success"
        if not result:
            empty.append(f"{title}: {promql}")
        if set(_METRIC_NAME.findall(promql)) <= set(LIVE_METRICS):
            assert result, f"{title}: no data for {promql!r} at {fleet.live_at_s}"
            instances = {series["metric"].get("instance") for series in result}
            assert instances == set(fleet.instances), f"{title}: {promql!r} answered for {instances}"
    main = [t for _, t in targets if "llm_tray_decode_tokens_per_second" in t["expr"]]
    assert main, "no decode panel"

    # The template variables' label_values() queries, through Prometheus's series API.
    expected = {"instance": set(fleet.instances), "server": {fleet.server_url}, "model": {MODEL}}
    for variable in dashboard["templating"]["list"]:
        if variable["name"] not in expected:
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"].strip())
        assert match, variable["definition"]
        selector, label = _substitute(match.group(1)), match.group(2)
        series = fleet.prom.get(
            "/api/v1/series",
            **{"match[]": selector, "start": f"{fleet.window[0]:.3f}", "end": f"{time.time():.3f}"},
        )["data"]
        assert {s.get(label) for s in series} == expected[variable["name"]], (variable["name"], series[:3])
    print("dashboard queries with no data on this CPU-only box:", *empty, sep="\n  ")
