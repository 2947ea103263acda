"""Soak (issue #25): `llm-tray proxy` with its descriptor limit lowered to 128, under 200 idle and
trickling connections that never authenticate or finish a head (and reconnect when closed), plus a
few well-behaved streaming clients. The command must keep serving them, its memory stay bounded, and
nothing exit. Before the fix the proxy held every such connection forever, and at the descriptor
limit its monitor's tick raised "Too many open files" and the command exited. About 15 s."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.fake_streaming import FakeStreamingUpstream

FD_LIMIT = 128
ATTACKERS = 200
CLIENTS = 4
SOAK_S = 12.0
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
from trayapp.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _attacker(port: int, trickle: bool, stop: asyncio.Event, counts: Counter[str]) -> None:
    """Connect, then say nothing (idle) or a byte every 0.5 s (trickle); reconnect when closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        counts["connections"] += 1
        try:
            sent = 0
            while not stop.is_set() and not reader.at_eof():
                if trickle:
                    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nX-Slow: "[sent : sent + 1] or b"a")
                    sent += 1
                try:
                    data = await asyncio.wait_for(reader.read(4096), 0.5)
                except asyncio.TimeoutError:
                    continue
                if not data:
                    break
                counts["answered " + data.split(b" ", 2)[1].decode()] += 1
                break
        except (ConnectionError, IndexError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(1.0)  # back a second later: a steady pressure, not a busy loop


async def _client(
    port: int, stop: asyncio.Event, results: list[tuple[float, bool]], counts: Counter[str]
) -> None:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    while not stop.is_set():
        started = time.monotonic()
        ok = False
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            response = await asyncio.wait_for(reader.read(), 10)
            ok = response.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in response
            if not ok:
                counts["client got " + (response[:12].decode("latin-1") or "no response")] += 1
            writer.close()
        except (OSError, asyncio.TimeoutError) as exc:
            counts["client got " + type(exc).__name__] += 1
        results.append((time.monotonic() - started, ok))
        await asyncio.sleep(0.05)


async def _soak(port: int, pid: int) -> tuple[list[tuple[float, bool]], dict[str, int], list[float]]:
    stop = asyncio.Event()
    counts: Counter[str] = Counter()
    results: list[tuple[float, bool]] = []
    rss: list[float] = []
    tasks = [asyncio.create_task(_attacker(port, i % 2 == 1, stop, counts)) for i in range(ATTACKERS)]
    await asyncio.sleep(1.0)  # the attackers first: the cap is full before any client comes
    tasks += [asyncio.create_task(_client(port, stop, results, counts)) for _ in range(CLIENTS)]
    deadline = time.monotonic() + SOAK_S
    while time.monotonic() < deadline:
        rss.append(_rss_mb(pid))
        await asyncio.sleep(1.0)
    stop.set()
    await asyncio.wait(tasks, timeout=15)
    return results, dict(counts), rss


def _listening_port(stdout_path: Path, child: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and child.poll() is None:
        first = stdout_path.read_text().partition("\n")
        if first[1]:
            return int(json.loads(first[0])["listen"].rsplit(":", 1)[1])
        time.sleep(0.05)
    raise AssertionError(f"the proxy did not start (exit {child.poll()})")


@pytest.mark.timeout(120)
def test_the_proxy_keeps_serving_under_idle_and_trickling_connections_at_a_low_fd_limit(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "LLM_TRAY_HOME": str(tmp_path / "home")}
    env.pop("LLM_TRAY_TOKEN", None)
    with FakeStreamingUpstream("openai", tokens=20, prefill_delay_s=0.02, token_delay_s=0.01) as upstream:
        stderr_path, stdout_path = tmp_path / "stderr.txt", tmp_path / "stdout.txt"
        with stderr_path.open("w") as stderr, stdout_path.open("w") as stdout:  # files: never a full pipe
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD.format(limit=FD_LIMIT), "proxy", "--listen", "127.0.0.1:0",
                 "--upstream", f"openai={upstream.url}", "--json", "--no-record"],
                stdout=stdout, stderr=stderr, env=env, text=True,
            )  # fmt: skip
        try:
            port = _listening_port(stdout_path, child)
            rss_start = _rss_mb(child.pid)
            results, counts, rss = asyncio.run(_soak(port, child.pid))
            alive = child.poll() is None
        finally:
            child.send_signal(signal.SIGINT)
            try:
                code = child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
    stderr_text = stderr_path.read_text()
    ok = sum(1 for _, good in results if good)
    print(
        f"soak: {len(results)} client requests, {ok} ok; attackers: {counts}; rss MB {rss_start:.0f} -> {rss}"
    )
    assert alive and code == 0, stderr_text[-2000:]
    assert "Traceback" not in stderr_text, stderr_text[-2000:]
    assert len(results) >= 20 and ok / len(results) >= 0.95, (results, counts)
    assert statistics.median(seconds for seconds, _ in results) < 1.0, results  # served, not queued
    assert max(rss) < rss_start + 60, rss  # bounded: no growth with the connections held and shed
    assert counts["connections"] > ATTACKERS  # the proxy closed attackers, which came back
