"""Privacy, proven: canary prompts and API keys go through the real app and come out nowhere.

A real llama-server with `--api-key` gets canary prompts (streaming and not) from a separate
client while the real Monitor records at DEBUG log level. One key comes from the keyring, one
from a named environment variable, and one was typed into config.toml by mistake; a fourth
endpoint carries a password in its URL (a server shown down, named without it). Afterwards
no canary may appear in any file under LLM_TRAY_HOME (except the user's own config.toml), in
any export format, the HTML report, the agent's /metrics, `status --json`, or the diagnostics
text the tray's "Copy diagnostics" puts on the clipboard.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import keyring
import keyring.backend
import pytest

from tests.support.cli import run_cli
from tests.support.llama import LlamaServer, free_port, generate_in_background
from tests.support.memory_keyring import SEED_ENV, SeededMemoryKeyring
from tests.support.proxy import running_proxy
from trayapp.config import paths
from trayapp.config.settings import Settings
from trayapp.config.settings_file import load_settings
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.core.model import Snapshot
from trayapp.services.monitor import Monitor
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.secrets import SERVICE

pytestmark = pytest.mark.llamacpp

DEAD_PORT = 11  # nothing listens there: a server behind a URL with credentials, shown down
CREDENTIALED_AS = f"http://127.0.0.1:{DEAD_PORT}"  # how every surface names it: no credentials
RAM_GBPS = "50"  # given, so no command measures this machine's RAM bandwidth
GENERATE_TIMEOUT_S = 180.0


class Canaries:
    """Unique strings; the uuid part alone is what no output may contain (it catches truncation too)."""

    def __init__(self) -> None:
        self.prompt = f"CANARY-PROMPT-{uuid.uuid4().hex}"
        self.env_key = f"CANARY-ENV-{uuid.uuid4().hex}"
        self.keyring_key = f"CANARY-KEYRING-{uuid.uuid4().hex}"
        self.config_key = f"CANARY-CFG-{uuid.uuid4().hex}"
        self.url_password = f"CANARY-URL-{uuid.uuid4().hex}"  # in an endpoint's URL (#25)

    def needles(self) -> dict[str, bytes]:
        values = {"prompt": self.prompt, "env key": self.env_key, "keyring key": self.keyring_key}
        values["config key"] = self.config_key
        values["URL password"] = self.url_password
        return {name: value.split("-")[-1].encode() for name, value in values.items()}

    def found_in(self, data: bytes) -> list[str]:
        return [name for name, needle in self.needles().items() if needle in data]


@pytest.fixture
def debug_log(_tray_home: Path) -> Iterator[Path]:
    """The app's own log file with the `trayapp` loggers at DEBUG, and every other logger
    (the monitor's, httpx, httpcore) at DEBUG into data/debug.log: both under LLM_TRAY_HOME.

    llm-tray has no log-level setting, so the test turns the loggers down itself.
    """
    from trayapp.app.log_setup import setup_logging

    path = setup_logging()
    handler = logging.FileHandler(paths.data_dir() / "debug.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, ours = logging.getLogger(), logging.getLogger("trayapp")
    levels = root.level, ours.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    ours.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for added in list(ours.handlers):  # setup_logging's file and console handlers
            ours.removeHandler(added)
            added.close()
        root.setLevel(levels[0])
        ours.setLevel(levels[1])


@pytest.fixture
def seeded_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keyring entries seen by this process and by every `llm-tray` subprocess it starts."""
    previous = keyring.get_keyring()
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "tests.support.memory_keyring.SeededMemoryKeyring")
    yield
    keyring.set_keyring(previous)


def _use_keyring(monkeypatch: pytest.MonkeyPatch, entries: list[tuple[str, str, str]]) -> None:
    monkeypatch.setenv(SEED_ENV, json.dumps(entries))
    backend: keyring.backend.KeyringBackend = SeededMemoryKeyring()
    keyring.set_keyring(backend)


def _config(server: LlamaServer, keyring_url: str, canaries: Canaries) -> str:
    return (
        f'[[endpoints]]\nurl = "{server.url}"\nkind = "llamacpp"\napi_key_env = "LLM_TRAY_CANARY_KEY"\n\n'
        f'[[endpoints]]\nurl = "{keyring_url}"\nkind = "llamacpp"\nuse_keyring = true\n\n'
        f'[[endpoints]]\nurl = "http://127.0.0.1:9"\nkind = "llamacpp"\napi_key = "{canaries.config_key}"\n\n'
        f'[[endpoints]]\nurl = "http://llmtray:{canaries.url_password}@127.0.0.1:{DEAD_PORT}"\n'
        'kind = "llamacpp"\n'
    )


def _generate_while_ticking(monitor: Monitor, server: LlamaServer, canaries: Canaries) -> list[Snapshot]:
    """One plain and one streamed canary request (each key once); the monitor ticks meanwhile."""
    snapshots: list[Snapshot] = []
    requests = [(canaries.env_key, False), (canaries.keyring_key, True)]
    for key, stream in requests:
        future = generate_in_background(
            server.url, f"{canaries.prompt} Tell a story.", 96, stream=stream, api_key=key, ignore_eos=True
        )
        deadline = time.monotonic() + GENERATE_TIMEOUT_S
        while not future.done():
            assert time.monotonic() < deadline, "the canary request did not finish"
            snapshots.append(monitor.tick())
            time.sleep(0.3)
        assert future.result()["timings"]["predicted_n"] == 96
    for _ in range(3):  # the idle polls after the requests
        snapshots.append(monitor.tick())
        time.sleep(0.3)
    return snapshots


def _overflow_through_proxy(
    monitor: Monitor, server: LlamaServer, inbox: RecordInbox, canaries: Canaries
) -> list[Snapshot]:
    """A canary prompt longer than the context, through the recording proxy (#20): refused, recorded
    with its counts, alerted on with a fix — and its text kept nowhere."""
    inbox.set_upstreams([server.url])
    prompt = f"{canaries.prompt} " * (server.ctx_size // 8)  # ~20 tokens each: well over the context
    headers = {"Authorization": f"Bearer {canaries.env_key}"}
    with running_proxy(server.url, "llamacpp", inbox=inbox) as proxy:
        with httpx.Client(trust_env=False, timeout=120) as client:
            answer = client.post(
                proxy.url + "/completion", json={"prompt": prompt, "n_predict": 8}, headers=headers
            )
        assert answer.status_code == 400, answer.text[:300]
        proxy.records.wait_for(1)
        snapshots = [monitor.tick()]
    assert any(a.kind == "context_overflow" for a in snapshots[-1].alerts), snapshots[-1].alerts
    return snapshots


def _home_files(home: Path) -> dict[Path, bytes]:
    """Every file under LLM_TRAY_HOME but the user's own config.toml, as raw bytes."""
    own = paths.config_file().resolve()
    return {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and p.resolve() != own}


def _assert_clean(where: str, data: bytes | str, canaries: Canaries) -> None:
    raw = data.encode() if isinstance(data, str) else data
    leaked = canaries.found_in(raw)
    assert not leaked, f"{where} contains the canary {leaked}"


def _scrape_agent(port: int, deadline_s: float) -> str:
    """The agent's /metrics once it reports a server (the agent runs meanwhile)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with httpx.Client(trust_env=False, timeout=5.0) as client:
        while time.monotonic() < deadline_s:
            try:
                response = client.get(url)
                if response.status_code == 200 and "llamacpp" in response.text:
                    return response.text
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise TimeoutError("the agent's /metrics never showed the servers")


def _run_agent(port: int, canaries: Canaries) -> str:
    result: list[subprocess.CompletedProcess[str]] = []
    args = ["agent", "--no-discover", "--metrics-port", str(port), "--duration", "8"]
    args += ["--ram-bandwidth-gbps", RAM_GBPS]
    thread = threading.Thread(target=lambda: result.append(run_cli(*args, timeout_s=60)), daemon=True)
    thread.start()
    text = _scrape_agent(port, time.monotonic() + 30)
    thread.join(timeout=60)
    assert result, "the agent did not stop after --duration"
    done = result[0]
    assert done.returncode == 0, done.stderr
    _assert_clean("agent output", done.stdout + done.stderr, canaries)
    return text


def test_no_canary_anywhere(
    llama_binary: Path,
    model_path: Path,
    tmp_path: Path,
    _tray_home: Path,
    debug_log: Path,
    seeded_keyring: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    canaries = Canaries()
    keys = f"{canaries.env_key},{canaries.keyring_key}"
    (tmp_path / "llama").mkdir()
    server = LlamaServer(model_path, binary=llama_binary, api_key=keys, log_dir=tmp_path / "llama")
    with server:
        keyring_url = f"http://localhost:{server.port}"  # the same server under a second endpoint
        monkeypatch.setenv("LLM_TRAY_CANARY_KEY", canaries.env_key)
        _use_keyring(monkeypatch, [(SERVICE, keyring_url, canaries.keyring_key)])
        paths.config_file().write_text(_config(server, keyring_url, canaries), encoding="utf-8")

        loaded = load_settings()
        assert any("endpoints[2].api_key" in error for error in loaded.errors), loaded.errors
        _assert_clean("the config error message", "\n".join(loaded.errors), canaries)
        for error in loaded.errors:
            logging.getLogger("trayapp.app.tray_main").warning("config: %s", error)  # as the tray logs them

        inbox = RecordInbox()  # the tray's proxy inbox: upstreams set when the proxy starts, below
        monitor = Monitor(
            loaded.settings,
            discover=False,
            record=True,
            measure_ram=False,
            profile=HardwareProfile(ram_bandwidth_gbps=float(RAM_GBPS)),
            proxy_inbox=inbox,
        )
        try:
            snapshots = _generate_while_ticking(monitor, server, canaries)
            snapshots += _overflow_through_proxy(monitor, server, inbox, canaries)
            live = next(s for s in reversed(snapshots) if any(m.decode_tok_s for _, m in s.models()))
            statuses = {s.url: s.status for s in live.servers}
            assert statuses.pop(CREDENTIALED_AS) != "ok", statuses  # named without its credentials
            assert statuses == {server.url: "ok", keyring_url: "ok"}, statuses  # both keys really used
            for path, data in _home_files(_tray_home).items():  # the store still open: -wal, -shm
                _assert_clean(str(path), data, canaries)
            diagnostics = _tray_diagnostics(loaded.settings, live, monitor.warnings)
            assert f"{server.url}" in diagnostics and "decode" in diagnostics, diagnostics
            _assert_clean("the copied diagnostics", diagnostics, canaries)
        finally:
            monitor.close()

        status = run_cli("status", "--json", "--no-discover", "--ram-bandwidth-gbps", RAM_GBPS)
        assert status.returncode == 0, status.stderr
        servers = {s["url"]: s["status"] for s in json.loads(status.stdout)["servers"]}
        assert servers.pop(CREDENTIALED_AS) != "ok", servers
        assert servers == {server.url: "ok", keyring_url: "ok"}, servers
        _assert_clean("status --json", status.stdout + status.stderr, canaries)
        assert "endpoints[2].api_key" in status.stderr, status.stderr

        metrics = _run_agent(free_port(), canaries)
        assert "llamacpp" in metrics
        _assert_clean("the agent's /metrics", metrics, canaries)

    out = tmp_path / "out"
    out.mkdir()
    exported: dict[str, bytes] = {}
    for table in ("requests", "sessions", "samples"):
        for fmt in ("csv", "jsonl", "parquet"):
            target = out / f"{table}.{fmt}"
            result = run_cli("export", "--table", table, "--format", fmt, "-o", str(target))
            assert result.returncode == 0, result.stderr
            exported[target.name] = target.read_bytes()
            _assert_clean(f"export {target.name}", target.read_bytes() + result.stderr.encode(), canaries)
    assert exported["requests.csv"].count(b"\n") >= 3, exported["requests.csv"]  # header + both requests
    report = run_cli("report", "-o", str(out / "report.html"))
    assert report.returncode == 0, report.stderr
    _assert_clean("the HTML report", (out / "report.html").read_bytes(), canaries)

    files = _home_files(_tray_home)
    assert files.get(debug_log), "the app's log was not written"
    assert files.get(paths.data_dir() / "debug.log"), "the debug log was not written"
    assert any(p.name.startswith("llm-tray.sqlite3") for p in files), sorted(files)
    for path, data in files.items():
        _assert_clean(str(path), data, canaries)


def _tray_diagnostics(settings: Settings, snapshot: Snapshot, warnings: list[str]) -> str:
    """What the tray's "Copy diagnostics" puts on the clipboard: `TrayApp.diagnostics` itself."""
    from trayapp.app.tray_app import TrayApp
    from trayapp.ui.versions import collect_versions

    app_like = SimpleNamespace(
        settings=settings, versions=collect_versions(), last_error=None, warnings=warnings, store_error=None
    )
    return TrayApp.diagnostics(app_like, snapshot)  # type: ignore[arg-type]
