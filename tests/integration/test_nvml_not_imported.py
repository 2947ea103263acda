"""Where Linux has no NVIDIA driver and no libnvidia-ml, the NVML probe says what pynvml would say
without importing it (issue #26: a few MiB of every process that samples), in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trayapp.sources.gpu import NvmlProbe, nvidia_driver_absent

needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's driver check")


@needs_linux
def test_this_machine_without_a_driver_says_what_pynvml_says_without_importing_it() -> None:
    if not nvidia_driver_absent():
        pytest.skip("this machine has an NVIDIA driver or its library")
    code = (
        "import sys\nfrom trayapp.sources.gpu import NvmlProbe\n"
        "probe = NvmlProbe()\nprint(probe.read(), probe.reason, 'pynvml' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == "() NVML library not found: no NVIDIA driver False", done.stderr
    asked = NvmlProbe(driver_absent=lambda: False)  # pynvml itself, as before
    assert asked.read() == () and asked.reason == "NVML library not found: no NVIDIA driver"
