"""Bad servers never stall the CLI: `status` answers within seconds, `watch` keeps its cadence."""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.support.fake_http import FakeServer, hang, json_reply, text_reply

LLAMA_401 = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}


@pytest.fixture
def bad_servers() -> Iterator[dict[str, FakeServer]]:
    servers = {
        "hung": FakeServer({"/health": hang, "/props": hang, "/slots": hang}),
        "garbage": FakeServer({"/health": text_reply("<html>not json"), "/props": text_reply("{'half': ")}),
        "http500": FakeServer({"/health": json_reply({"error": "boom"}, 500)}),
        "unauthorized": FakeServer(
            {"/health": json_reply({"status": "ok"}), "/props": json_reply(LLAMA_401, 401)}
        ),
    }
    for server in servers.values():
        server.__enter__()
    try:
        yield servers
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)


def _endpoints(servers: dict[str, FakeServer]) -> list[str]:
    args: list[str] = []
    for server in servers.values():
        args += ["--endpoint", f"llamacpp={server.url}"]
    return [*args, "--endpoint", "llamacpp=http://127.0.0.1:9", "--no-discover"]


def test_status_returns_within_seconds_with_a_clear_reason_for_each(
    bad_servers: dict[str, FakeServer],
) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "status", "--json", *_endpoints(bad_servers)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < 15, f"status took {elapsed:.1f} s"
    by_url = {s["url"]: s for s in json.loads(result.stdout)["servers"]}
    hung = by_url[bad_servers["hung"].url]
    assert hung["status"] == "error" and hung["reason"]
    assert by_url[bad_servers["garbage"].url]["status"] == "error"
    assert "JSON" in by_url[bad_servers["garbage"].url]["reason"]
    assert by_url[bad_servers["http500"].url]["status"] == "error"
    assert "500" in by_url[bad_servers["http500"].url]["reason"]
    assert by_url[bad_servers["unauthorized"].url]["status"] == "unauthorized"
    assert "key" in by_url[bad_servers["unauthorized"].url]["reason"].lower()
    assert by_url["http://127.0.0.1:9"]["status"] == "unreachable"


def test_watch_keeps_its_cadence_while_a_server_hangs(bad_servers: dict[str, FakeServer]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "watch", "--json", "--interval", "1", "--duration", "8",
         "--no-record", *_endpoints(bad_servers)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    stamps = [json.loads(line)["t"] for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(stamps) >= 7
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # Waiting on the hung server would make every tick last its 2 s read timeout; one late tick on a
    # busy host is followed by a short one (watch keeps its schedule), so the mean tells, not the max.
    # The first gap includes discovery.
    assert statistics.mean(gaps[1:]) < 1.5, f"watch lost its cadence: gaps {gaps}"
    last = json.loads(result.stdout.splitlines()[-1])
    hung = next(s for s in last["servers"] if s["url"] == bad_servers["hung"].url)
    assert hung["status"] == "error"


def test_a_second_recorder_is_told_instead_of_duplicating_sessions() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "trayapp", "watch", "--interval", "1", "--duration", "20",
         "--endpoint", "http://127.0.0.1:9", "--no-discover"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as first:  # fmt: skip
        assert first.stdout is not None
        first.stdout.readline()  # the first line: it holds the store by now
        second = subprocess.run(
            [sys.executable, "-m", "trayapp", "watch", "--interval", "1", "--duration", "1",
             "--endpoint", "http://127.0.0.1:9", "--no-discover"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 0
        first.terminate()
        first.wait(timeout=30)
    assert "not recording" in second.stderr and "already recording" in second.stderr
