"""Energy through the tick (#21): the pipeline measures the idle draw while no local server generates and
gives each finished local request its prefill and decode joules; a remote server's request gets the
reason instead. A RAPL package at 20 W idle and 120 W while generating, ticks 1 s apart; by hand."""

from __future__ import annotations

import pytest

from trayapp.core.energy_types import EnergyReading
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.machine import resolve_machine
from trayapp.core.model import FinishedRequest, ModelReading, RequestRecord, ServerReading
from trayapp.core.pipeline import REMOTE_ENERGY, Pipeline

HOST = HostReading(None, None, None)
WALL0 = 1_750_000_000.0
URL = "http://127.0.0.1:1234"


def run(remote: bool = False) -> tuple[list[RequestRecord], Pipeline]:
    """LM Studio generating from t=6 to t=9; its record (400 prompt tokens at 400 tok/s, 100 tokens at
    50 tok/s) arrives at t=9. The package draws 120 W over the intervals (6, 7], (7, 8], (8, 9]."""
    pipeline = Pipeline()
    counter_j, records = 1000.0, []
    for t in range(11):
        busy = 6 <= t <= 9
        if t > 0:
            counter_j += 120.0 if 7 <= t <= 9 else 20.0
        finished = ()
        if t == 9:
            finished = (
                FinishedRequest(
                    model="m", finished_wall_s=WALL0 + 9, prompt_tokens=400, prompt_tok_s=400.0,
                    decode_tokens=100, decode_tok_s=50.0,
                ),
            )  # fmt: skip
        reading = ServerReading(
            "lmstudio", URL, "ok", models=(ModelReading("m", busy=busy),), finished=finished
        )
        hw = HardwareSnapshot((), HOST, energy=(EnergyReading("package-0", "rapl", counter_j=counter_j),))
        machine = resolve_machine(hw)
        machines = {URL: machine} if remote else {}
        out = pipeline.process([reading], hw, machines, machine, float(t), WALL0 + t)
        records.extend(out.snapshot.requests)
    return records, pipeline


def test_a_local_request_gets_prefill_and_decode_joules_above_the_idle_draw() -> None:
    (record,), pipeline = run()
    assert pipeline.energy.idle_w == 20.0  # the idle ticks (1..6] at 20 J/s; busy ticks are left out
    # prefill: 400 / 400 = 1 s, [6, 7]: 120 J − 20 W × 1 s; decode: 100 / 50 = 2 s, [7, 9]: 240 J − 40 J.
    assert record.energy_prefill_j == pytest.approx(100.0)
    assert record.energy_decode_j == pytest.approx(200.0)
    assert record.energy_j_per_token == pytest.approx(2.0)
    assert (record.energy_idle_w, record.energy_source, record.energy_reason) == (20.0, "rapl", None)
    status = pipeline.energy.status()
    assert status.domains[0].total_j == pytest.approx(7 * 20.0 + 3 * 120.0)  # ten intervals


def test_a_remote_servers_request_says_its_energy_is_not_read_here() -> None:
    (record,), _ = run(remote=True)
    assert record.energy_decode_j is None and record.energy_reason == REMOTE_ENERGY
