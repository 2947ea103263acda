"""One sampler per machine (#15): the snapshot endpoint over real loopback HTTP.

In process: `SnapshotServer` fed hand-made snapshots (documents, SSE, alert transitions, token,
bad clients). As a user runs it: a real `llm-tray agent` process against a fake Ollama (shaped
like tests/fixtures/ollama), its own LLM_TRAY_HOME; `status` answers from it; its sampler file
goes on exit; a stale one is ignored. Child output goes to files, never an unread pipe.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import snapshots as s
from tests.support.agent import Agent
from tests.support.cli import run_cli
from tests.support.fake_servers import FakeOllama, wait_until
from tests.support.llama import LlamaServer, decode_rate, generate_in_background, tokens_lasting
from trayapp.core.jsonview import snapshot_json
from trayapp.sinks.snapshot_server import SnapshotServer

WAIT_S = 20.0
SNAPSHOT_KEYS = {"schema", "t", "servers", "hardware", "energy", "alerts"}  # docs/json.md, schema 1


def decoding(t: float, *, alerts: tuple[Any, ...] = ()) -> Any:
    return s.snap(t, s.server(s.model("llama3.1:8b", "decoding", 42.0)), alerts=alerts)


@pytest.fixture
def server() -> Iterator[SnapshotServer]:
    srv = SnapshotServer(request_timeout_s=0.5).start()
    try:
        yield srv
    finally:
        srv.stop(2.0)


def _wait_doc(url: str, path: str = "/v1/snapshot", **kw: Any) -> httpx.Response:
    def ready() -> httpx.Response | None:
        response = httpx.get(url + path, timeout=2.0, **kw)
        return response if response.status_code == 200 else None

    return wait_until(ready, timeout_s=5.0)


class Events:
    """`GET /v1/events` read on a thread into a list of (event, data)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.items: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(5.0, read=30.0))
        self._response = self._client.send(
            self._client.build_request("GET", url + "/v1/events", headers=headers), stream=True
        )
        self.status = self._response.status_code
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        event = "message"
        try:
            for line in self._response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    with self._lock:
                        self.items.append((event, json.loads(line[6:])))
        except (httpx.HTTPError, RuntimeError):
            pass

    def of(self, name: str) -> list[Any]:
        with self._lock:
            return [data for event, data in self.items if event == name]

    def close(self) -> None:
        self._response.close()
        self._client.close()


# --------------------------------------------------------------------------- in process


def test_a_stop_while_it_starts_stops_it_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tray starts the endpoint on a thread of its own and may quit at once (cc48: Ctrl-C a
    second after launch): a `stop` arriving as `start` starts its threads stops them all, raises
    nothing, and leaves no thread serving."""
    srv = SnapshotServer()
    stopping: list[threading.Thread] = []
    failures: list[BaseException] = []
    real_start = threading.Thread.start

    def stop_meanwhile() -> None:
        try:
            srv.stop(5.0)
        except BaseException as exc:  # what the test is about: recorded, asserted below
            failures.append(exc)

    def start_with_a_stop_beside(thread: threading.Thread) -> None:
        if thread.name == "llm-tray-snapshot-http" and not stopping:
            stopping.append(threading.Thread(target=stop_meanwhile, name="stop-meanwhile"))
            real_start(stopping[0])
            stopping[0].join(0.5)  # a stop that does not wait for `start` is over by now
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_with_a_stop_beside)
    srv.start()
    monkeypatch.undo()
    stopping[0].join(10.0)
    assert not stopping[0].is_alive() and failures == []
    names = ("llm-tray-snapshot-http", "llm-tray-snapshot-build")
    wait_until(lambda: not [t for t in threading.enumerate() if t.name in names], 10.0)


def test_snapshot_glance_and_text_documents(server: SnapshotServer) -> None:
    assert httpx.get(server.url + "/v1/snapshot", timeout=2).status_code == 503  # nothing yet
    snapshot = decoding(1.0)
    server.publish(snapshot)
    doc = _wait_doc(server.url).json()
    assert set(doc) == SNAPSHOT_KEYS and doc == json.loads(json.dumps(snapshot_json(snapshot)))
    glance = httpx.get(server.url + "/v1/glance", timeout=2).json()
    assert glance["text"] == "42" and glance["model"]["name"] == "llama3.1:8b"
    text = httpx.get(server.url + "/v1/snapshot?format=text", timeout=2).text
    assert "llama3.1:8b Q4_K_M [decoding] ~42 tok/s ·" in text  # the `status` model line (~: polled)
    assert httpx.get(server.url + "/nope", timeout=2).status_code == 404
    assert httpx.post(server.url + "/v1/snapshot", timeout=2).status_code == 405


def test_events_stream_snapshots_and_alert_transitions(server: SnapshotServer) -> None:
    server.publish(decoding(1.0))
    _wait_doc(server.url)
    stream = Events(server.url)
    try:
        assert stream.status == 200
        wait_until(lambda: stream.of("glance"), WAIT_S)  # the state now, at once
        assert stream.of("snapshot")[0]["t"] == s.T0 + 1.0
        spill = s.alert()
        server.publish(decoding(2.0, alerts=(spill,)))
        started = wait_until(lambda: stream.of("alert"), WAIT_S)
        assert started == [{"transition": "started", "alert": json.loads(json.dumps(
            snapshot_json(decoding(2.0, alerts=(spill,)))["alerts"][0]))}]  # fmt: skip
        server.publish(decoding(3.0))
        wait_until(lambda: len(stream.of("alert")) == 2, WAIT_S)
        ended = stream.of("alert")[1]
        assert ended["transition"] == "ended" and ended["alert"]["id"] == "offload-1"
        wait_until(lambda: [d["t"] for d in stream.of("snapshot")] == [s.T0 + 1, s.T0 + 2, s.T0 + 3], WAIT_S)
        assert [line for line in stream.of("line") if "llama3.1:8b decoding ~42 tok/s" in line]
    finally:
        stream.close()


def test_publishing_never_waits_on_a_client_that_does_not_read(server: SnapshotServer) -> None:
    server.publish(decoding(0.0))
    _wait_doc(server.url)
    stuck = socket.create_connection(("127.0.0.1", server.port))  # an event stream never read
    stuck.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        started = time.monotonic()
        for i in range(2000):
            server.publish(decoding(float(i)))
        assert time.monotonic() - started < 1.0  # a reference swap each (2000 in well under 1 s)
        wait_until(
            lambda: httpx.get(server.url + "/v1/snapshot", timeout=2).json()["t"] == s.T0 + 1999, WAIT_S
        )
    finally:
        stuck.close()


def test_slow_garbage_and_oversized_clients_do_not_stop_the_others(server: SnapshotServer) -> None:
    server.publish(decoding(1.0))
    _wait_doc(server.url)
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"GET /v1/snap")  # slowloris: never finishes its request line
    garbage = socket.create_connection(("127.0.0.1", server.port))
    garbage.sendall(b"\x00\x01\x02 nonsense\r\n\r\n")
    huge = socket.create_connection(("127.0.0.1", server.port))
    huge.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
    try:
        assert httpx.get(server.url + "/v1/snapshot", timeout=2).status_code == 200  # others are served
        garbage.settimeout(5)
        assert garbage.recv(100).startswith(b"HTTP/1.0 400")
        huge.settimeout(5)
        assert huge.recv(100).startswith(b"HTTP/1.0 414")
        slow.settimeout(5)
        started = time.monotonic()
        assert slow.recv(100) == b""  # dropped after the request timeout (0.5 s here)
        assert time.monotonic() - started < 4.0
        assert httpx.get(server.url + "/v1/glance", timeout=2).status_code == 200
    finally:
        for sock in (slow, garbage, huge):
            sock.close()


def test_a_token_is_required_on_every_path_and_off_loopback() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        SnapshotServer("0.0.0.0")
    srv = SnapshotServer(token="s3cret-token").start()
    try:
        srv.publish(decoding(1.0))
        good = {"Authorization": "Bearer s3cret-token"}
        _wait_doc(srv.url, headers=good)
        for path in ("/v1/snapshot", "/v1/glance", "/v1/events", "/nope"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
                response = httpx.get(srv.url + path, headers=headers, timeout=2)
                assert response.status_code == 401 and "llama3.1" not in response.text
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert httpx.get(srv.url + "/v1/glance", headers=good, timeout=2).json()["text"] == "42"
        stream = Events(srv.url, good)
        try:
            assert stream.status == 200
            wait_until(lambda: stream.of("snapshot"), WAIT_S)
        finally:
            stream.close()
    finally:
        srv.stop(2.0)


# --------------------------------------------------------------------------- a real agent


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.load("llama3.1:8b")
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def agent(tmp_path: Path, ollama: FakeOllama) -> Iterator[Agent]:
    running = Agent(tmp_path, ollama.url)
    try:
        yield running
    finally:
        running.stop()


def test_agent_publishes_and_status_answers_from_it(agent: Agent, ollama: FakeOllama) -> None:
    info = agent.wait_ready()
    assert info["pid"] == agent.process.pid and info["url"].startswith("http://127.0.0.1:")
    assert info["started"].endswith("Z") and oct(agent.file.stat().st_mode & 0o777) == "0o600"
    result = agent.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    assert f"answering from the running sampler (pid {agent.process.pid}" in result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == SNAPSHOT_KEYS and doc["schema"] == 1
    (server,) = doc["servers"]
    assert server["url"] == ollama.url and server["kind"] == "ollama"
    assert [m["name"] for m in server["models"]] == ["llama3.1:8b"]
    assert doc["t"] <= httpx.get(info["url"] + "/v1/snapshot", timeout=2).json()["t"]
    text = agent.cli("status")
    assert text.returncode == 0 and "answering from the running sampler" in text.stderr
    assert f"ollama 0.32.15 {ollama.url}" in text.stdout and "llama3.1:8b" in text.stdout
    own = agent.cli("status", "--json", "--endpoint", f"ollama={ollama.url}", "--no-discover")
    assert own.returncode == 0 and "answering from" not in own.stderr  # flags: a probe of its own


def test_watch_follows_the_agents_ticks(agent: Agent) -> None:
    agent.wait_ready()
    result = agent.cli("watch", "--json", "--duration", "1")
    assert result.returncode == 0, result.stderr
    assert "answering from the running sampler" in result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) >= 2 and all(set(line) == SNAPSHOT_KEYS for line in lines)
    assert [line["t"] for line in lines] == sorted({line["t"] for line in lines})  # one per tick, in order


def test_sampler_file_goes_on_exit_and_a_stale_one_is_ignored(agent: Agent, ollama: FakeOllama) -> None:
    info = agent.wait_ready()
    assert agent.stop() == 0
    assert not agent.file.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True, timeout=30)  # fmt: skip
    for pid in (int(dead.stdout), os.getpid()):  # a dead pid; a live pid whose endpoint is gone
        agent.file.write_text(json.dumps({"url": info["url"], "pid": pid, "started": info["started"]}))
        result = agent.cli("status", "--json")  # no flags: it would use a live sampler
        assert result.returncode == 0 and "answering from" not in result.stderr, result.stderr
        bar = agent.cli("bar")
        assert (bar.returncode, bar.stdout) == (0, "llm-tray not running\n"), bar.stderr


def test_status_from_the_agent_sends_nothing_to_the_server(tmp_path: Path, ollama: FakeOllama) -> None:
    """The fake is in the config (so a `status` probing by itself polls it) and the agent polls once a
    minute: a request the fake sees during `status` would be a second poll."""
    slow = Agent(tmp_path, ollama.url, poll_s=60.0)
    with (slow.home / "config" / "config.toml").open("a") as config:
        config.write(f'\n[[endpoints]]\nurl = "{ollama.url}"\nkind = "ollama"\n')
    try:
        slow.wait_ready()  # its first snapshot is published: that tick's requests are done
        before = len(ollama.paths_requested())
        for args in (("status", "--json"), ("status",), ("bar", "--format", "waybar")):
            result = slow.cli(*args)
            assert result.returncode == 0, result.stderr
            assert "answering from" in result.stderr or args[0] == "bar"
        assert ollama.paths_requested()[before:] == []
        assert json.loads(slow.cli("bar", "--format", "waybar").stdout)["text"] == "llama3.1:8b idle"
        own = slow.cli("status", "--json", "--no-discover")  # the control: a probe of its own polls it
        assert own.returncode == 0 and "/api/ps" in ollama.paths_requested()[before:]
    finally:
        slow.stop()


def test_agent_bad_snapshot_address_without_a_token_fails_fast(tmp_path: Path) -> None:
    refused = Agent(tmp_path, "http://127.0.0.1:9", "--snapshot-address", "0.0.0.0")
    assert refused.process.wait(timeout=60) == 1
    refused.stop()
    assert "is not loopback: set LLM_TRAY_TOKEN" in refused.err_path.read_text()
    assert not refused.file.exists()


@pytest.mark.llamacpp
def test_no_prompt_generated_text_or_api_key_reaches_the_endpoint(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    """#8's canaries through the endpoint: a canary prompt, its generated text and an API key the
    monitor sends (from a named environment variable) are in no document and no event."""
    prompt = f"CANARY-PROMPT-{uuid.uuid4().hex}"
    key = f"CANARY-KEY-{uuid.uuid4().hex}"
    endpoint = f'[[endpoints]]\nurl = "{llama_server.url}"\nkind = "llamacpp"\napi_key_env = "CANARY_KEY"\n'
    agent = Agent(tmp_path, "", config=endpoint, env={"CANARY_KEY": key}, gpu=None)
    raw = bytearray()
    tokens = tokens_lasting(decode_rate(llama_server.url), 4.0)  # long enough for the stream to see it
    try:
        info = agent.wait_ready()
        with httpx.stream("GET", info["url"] + "/v1/events", timeout=httpx.Timeout(5, read=30)) as events:
            reply = generate_in_background(llama_server.url, prompt, tokens, ignore_eos=True)
            done_at: int | None = None  # snapshots seen when the request had ended
            for chunk in events.iter_bytes():
                raw += chunk
                if done_at is None and reply.done():
                    done_at = raw.count(b"event: snapshot")
                if done_at is not None and raw.count(b"event: snapshot") >= done_at + 2:
                    break  # two ticks after the request ended: its finished record included
        content = reply.result(timeout=60)["content"]
        assert b'"decoding"' in raw or b'"prefill"' in raw  # the stream did see the request
        documents = [bytes(raw)] + [
            httpx.get(info["url"] + path, timeout=5).content
            for path in ("/v1/snapshot", "/v1/snapshot?format=text", "/v1/snapshot?format=line", "/v1/glance")
        ]
        windows = {content[i : i + 24].encode() for i in range(0, max(len(content) - 24, 1), 8)}
        for data in documents:
            assert prompt.split("-")[-1].encode() not in data and key.split("-")[-1].encode() not in data
            assert not [w for w in windows if len(w) >= 24 and w in data]  # no generated text
    finally:
        agent.stop()


def test_status_says_when_the_sampler_wants_a_token(tmp_path: Path, ollama: FakeOllama) -> None:
    guarded = Agent(tmp_path, ollama.url, env={"LLM_TRAY_TOKEN": "t0ken"})  # a token on loopback too
    try:
        guarded.wait_ready()
        without = {k: v for k, v in guarded.env.items() if k != "LLM_TRAY_TOKEN"}
        result = run_cli("status", "--json", env=without, timeout_s=60)
        assert result.returncode == 0  # it probed by itself
        assert (
            f"the running sampler (pid {guarded.process.pid}) wants a token: set LLM_TRAY_TOKEN"
            in result.stderr
        )
        assert "answering from" not in result.stderr
        assert "answering from the running sampler" in guarded.cli("status", "--json").stderr
        assert guarded.cli("bar").stdout == "llama3.1:8b idle\n"  # bar sends LLM_TRAY_TOKEN
        assert run_cli("bar", env=without, timeout_s=60).stdout == "llm-tray not running\n"
    finally:
        guarded.stop()
