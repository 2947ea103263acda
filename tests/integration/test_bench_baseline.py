"""A stored bench is the baseline a later, slower session is judged against (#13), end to end.

`python -m trayapp bench` measures the real llama-server (the session's `llama_server`) and stores its
result in this test's own store (LLM_TRAY_HOME). A second llama-server of the same model file is then
started and given fewer resources for real (a SIGSTOP/SIGCONT duty cycle: a share of its one core)
while a recording `Monitor` watches one request: `regression` is raised against the bench baseline,
through the real store → monitor → pipeline. Expected numbers are the bench's own JSON and the
server's own `timings`, never the code under test. ~40-70 s on a busy 2-core host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.llama import (
    LlamaServer,
    alerts_of,
    duty_cycle,
    generate_in_background,
    monitor_for,
    tick_until_done,
)
from trayapp import paths
from trayapp.adapters.store import Store
from trayapp.core.thresholds import Thresholds

pytestmark = pytest.mark.llamacpp

STOP_S = 0.3  # one SIGSTOP: far under the probe's 2 s read timeout, so it never reads as server_down
SLOW_SHARE = 0.45  # the later session runs at about this share of the bench's rate
MARGIN_PCT = 10.0  # the server's own drop must clear the threshold by this much, or the test skips


@pytest.fixture
def second_server(llama_binary: Path, model_path: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    """Another real llama-server of the same model file (`-t 1 -np 1`), stopped at the end."""
    with LlamaServer(model_path, binary=llama_binary, log_dir=tmp_path) as server:
        yield server


def test_a_slower_session_regresses_against_the_stored_bench(
    llama_server: LlamaServer, second_server: LlamaServer
) -> None:
    args = ("--tokens", "24", "--runs", "2", "--warmup", "1", "--depths", "0", "--no-discover", "--json")
    done = run_cli("bench", "--endpoint", llama_server.url, *args, timeout_s=300)
    assert done.returncode == 0, done.stderr
    bench: dict[str, Any] = json.loads(done.stdout)
    assert bench["baseline_stored"] is True, done.stderr
    assert bench["decode_exact"] and bench["decode_tok_s"] > 0
    label = bench["hardware"]["label"]
    with Store(paths.store_file(), writer=False) as store:  # what the bench left for the monitor
        stored = store.baseline(
            model=bench["model"],
            quantization=bench["quantization"],
            hardware=label,
            context_tokens=None,
            before_wall_s=time.time() + 1,
        )
    assert stored is not None and stored.source == "bench" and stored.session_id is None
    assert stored.decode_tok_s == pytest.approx(bench["decode_tok_s"], abs=0.001)  # the JSON rounds to 3
    assert stored.server_version == bench["server"]["version"] and stored.values == 2

    assert second_server.pid is not None
    run_s = STOP_S * SLOW_SHARE / (1 - SLOW_SHARE)
    monitor = monitor_for(second_server.url, record=True)
    try:
        assert not [w for w in monitor.warnings if "not recording" in w], monitor.warnings
        first = monitor.tick()
        model = first.servers[0].models[0]
        assert model.name == bench["model"] and model.spec_type is None
        with duty_cycle(second_server.pid, stop_s=STOP_S, run_s=run_s):
            future = generate_in_background(second_server.url, "Describe the harbour.", 96, ignore_eos=True)
            snapshots = tick_until_done(monitor, future)
    finally:
        monitor.close()
    timings = future.result()["timings"]
    # The stored bench reaches the model's status (the dashboard's bench line), from the real store.
    benched = [m.bench_decode_tok_s for s in snapshots for m in s.servers[0].models]
    assert benched and all(b == pytest.approx(stored.decode_tok_s) for b in benched), benched
    server_drop_pct = (1 - timings["predicted_per_second"] / bench["decode_tok_s"]) * 100
    threshold = Thresholds().regression_pct
    if server_drop_pct < threshold + MARGIN_PCT:
        pytest.skip(
            f"the server's own drop was {server_drop_pct:.0f} %, under the {threshold:.0f} % threshold "
            f"+ {MARGIN_PCT:.0f} % margin: this host did not slow it enough to judge"
        )
    alerts = alerts_of(snapshots, "regression")
    assert len(alerts) == 1, alerts
    alert = next(iter(alerts.values()))
    evidence: Mapping[str, Any] = alert.evidence
    assert evidence["baseline_source"] == "bench" and evidence["baseline_session"] is None
    assert evidence["baseline_tok_s"] == pytest.approx(bench["decode_tok_s"], abs=0.01)  # rounded to 2
    assert evidence["baseline_version"] == bench["server"]["version"]
    # the polled rate over a duty cycle: the server's own rate of the request, give or take the polling
    assert evidence["decode_tok_s"] == pytest.approx(timings["predicted_per_second"], rel=0.5)
    assert evidence["drop_pct"] >= threshold
    assert "bench baseline" in alert.message
