"""A held-back GPU (or CPU) is the cause in below_floor, low_efficiency and regression (#21), with the
driver's evidence: power limit against the draw, SM clock against its maximum.

The GPU comes from the fake NVML under NvmlProbe (nvidia-ml-py's clock-event bit 0x4 is
clocksEventReasonSwPowerCap); expected texts are written out by hand.
"""

from __future__ import annotations

from dataclasses import replace

import pynvml

from tests.support.diagnose_inputs import LLAMA_URL, llama_hardware, llama_reading, request_slots
from tests.support.fake_nvml import FakeNvml, rtx_4090
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.machine import resolve_machine
from trayapp.core.model import Baseline, Finding, ModelKey
from trayapp.core.pipeline import Pipeline, Priors
from trayapp.core.throttle import cpu_throttle_text, throttle_cause
from trayapp.sources.gpu import NvmlProbe

WALL0 = 1_750_000_000.0
CAPPED = "the GPU is power-capped at 400 W, drawing 398 W, SM clock 1.6 of 2.4 GHz"


def capped_hardware() -> HardwareSnapshot:
    """llama_hardware's RTX 4090 as NvmlProbe reads it while the driver caps its power at 400 W."""
    assert pynvml.nvmlClocksEventReasonSwPowerCap == 0x4
    nvml = FakeNvml(
        [
            rtx_4090(
                reasons=0x4,
                power_mw=398_000,
                power_limit_mw=400_000,
                sm_clock_mhz=1600,
                sm_max_clock_mhz=2400,
                temperature_c=71,
            )
        ]
    )
    (read,) = NvmlProbe(nvml, host_memory=lambda: (0, 0), name_of_pid=lambda pid: None).read()
    base = llama_hardware()
    gpu = replace(
        base.gpus[0],
        throttle_reasons=read.throttle_reasons,
        power_w=read.power_w,
        power_limit_w=read.power_limit_w,
        sm_clock_mhz=read.sm_clock_mhz,
        sm_clock_max_mhz=read.sm_clock_max_mhz,
        temperature_c=read.temperature_c,
    )
    return replace(base, gpus=(gpu,))


def findings(hw: HardwareSnapshot, rate_tok_s: float, baseline: Baseline | None = None) -> list[Finding]:
    """Every finding raised while llama-server decodes at `rate_tok_s` on `hw` for 20 s."""
    pipeline = Pipeline(one_shot=True)
    machine = resolve_machine(hw)
    key: ModelKey = (LLAMA_URL, "Llama-3.1-8B-Instruct-Q4_K_M.gguf")
    priors = Priors(baselines={key: baseline}) if baseline else Priors()
    found: list[Finding] = []
    for t, slot in enumerate(request_slots(task=1, prompt_tokens=300, rate_tok_s=rate_tok_s, decode_s=20)):
        out = pipeline.process([llama_reading(slot)], hw, {}, machine, float(t), WALL0 + t, priors=priors)
        found.extend(
            Finding(a.kind, a.severity, a.server, a.model, a.message, a.fix, a.evidence, a.cause)
            for a in out.snapshot.alerts
        )
    return found


def last(found: list[Finding], kind: str) -> Finding:
    return [f for f in found if f.kind == kind][-1]


def test_the_throttle_evidence_reads_as_the_driver_reports_it() -> None:
    cause = throttle_cause(capped_hardware())
    assert cause is not None
    assert cause.text == CAPPED  # 400 000 mW, 398 000 mW, 1600 of 2400 MHz
    assert cause.evidence["gpu0"] == {
        "reasons": ["sw_power_cap"],
        "power_w": 398.0,
        "power_limit_w": 400.0,
        "sm_clock_mhz": 1600.0,
        "sm_clock_max_mhz": 2400.0,
        "temperature_c": 71.0,
    }
    assert throttle_cause(llama_hardware()) is None  # no reason named: nothing held back


def test_low_efficiency_names_the_power_cap_as_its_cause() -> None:
    # Ceiling near 500 tokens deep is 202.2 tok/s (test_diagnose_scenarios); 60 tok/s is 30 % of it.
    found = last(findings(capped_hardware(), 60.0), "low_efficiency")
    assert found.cause is not None and CAPPED in found.cause
    assert "sw_power_cap" in found.cause
    assert found.evidence["throttle"] == throttle_cause(capped_hardware()).evidence  # type: ignore[union-attr]


def test_below_floor_is_held_back_by_the_power_cap() -> None:
    found = last(findings(capped_hardware(), 2.0), "below_floor")
    assert found.cause == CAPPED
    assert f"Held back: {CAPPED}." in found.message


def test_regression_names_the_power_cap_not_a_mystery() -> None:
    baseline = Baseline(decode_tok_s=150.0, context_tokens=600, server_version="b6500", session_id="s0")
    found = last(findings(capped_hardware(), 90.0, baseline), "regression")  # 40 % below 150
    assert found.cause == CAPPED
    assert f"Held back now: {CAPPED}." in found.message
    assert found.fix.startswith("Check cooling and power limits")


def test_without_throttle_the_regression_has_no_such_cause() -> None:
    baseline = Baseline(decode_tok_s=150.0, context_tokens=600, server_version="b6500", session_id="s0")
    found = last(findings(llama_hardware(), 90.0, baseline), "regression")
    assert found.cause is None and "Held back" not in found.message


def test_a_hot_cpu_well_under_its_maximum_clock_is_throttled() -> None:
    host = HostReading(None, None, None, cpu_freq_mhz=1200.0, cpu_freq_max_mhz=3600.0, thermal_max_c=97.0)
    assert cpu_throttle_text(host) == "the CPU runs at 1.2 of 3.6 GHz at 97 °C (thermal throttling)"
    assert cpu_throttle_text(replace(host, thermal_max_c=60.0)) is None  # slow but cool: power saving
    assert cpu_throttle_text(replace(host, cpu_freq_max_mhz=None)) is None  # a VM: no maximum known
