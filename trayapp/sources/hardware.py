"""One `HardwareSnapshot` from every GPU probe and the host probe.

The RAM bandwidth is not measured here: a worker measures it (see
`trayapp.sources.ram_bandwidth.RamBandwidthKeeper`) and calls `set_measured_ram_bandwidth()`,
again whenever the stored figure changes (with its `RamBandwidthChange`).
Owned by the sampler thread; `set_ram_bandwidth()` may be called from another.
"""

from __future__ import annotations

import dataclasses

from trayapp.core.hardware_readings import GpuReading, HardwareSnapshot, RamBandwidthChange, ValueSource
from trayapp.sources.energy import HostEnergyProbe
from trayapp.sources.gpu import AppleProbe, GpuProbe, NvmlProbe
from trayapp.sources.gpu_amd import AmdSysfsProbe
from trayapp.sources.host import HostProbe
from trayapp.sources.ram_bandwidth_cache import RamBandwidth

_RamFigure = tuple[float | None, ValueSource, float | None, str | None, RamBandwidthChange | None]


class HardwareProbe:
    """NVIDIA, AMD and Apple GPUs plus the host. A probe left as None gets the real one."""

    def __init__(
        self,
        nvml_probe: GpuProbe | None = None,
        amd_probe: GpuProbe | None = None,
        apple_probe: GpuProbe | None = None,
        host_probe: HostProbe | None = None,
        ram_bandwidth_gbps: float | None = None,
        ram_bandwidth_source: ValueSource = "measured",
        energy_probe: HostEnergyProbe | None = None,
    ) -> None:
        self._gpu_probes: tuple[GpuProbe, ...] = (
            nvml_probe if nvml_probe is not None else NvmlProbe(),
            amd_probe if amd_probe is not None else AmdSysfsProbe(),
            apple_probe if apple_probe is not None else AppleProbe(),
        )
        self._host_probe = host_probe if host_probe is not None else HostProbe()
        self._energy_probe = energy_probe if energy_probe is not None else HostEnergyProbe()
        self._ram_bandwidth: _RamFigure = (ram_bandwidth_gbps, ram_bandwidth_source, None, None, None)

    def set_ram_bandwidth(
        self,
        gbps: float | None,
        source: ValueSource = "measured",
        measured_wall_s: float | None = None,
        confidence: str | None = None,
        change: RamBandwidthChange | None = None,
    ) -> None:
        """Use this RAM bandwidth from now on (one assignment: safe from another thread).

        `measured_wall_s`, `confidence` ("quiet" | "provisional" | "suspect") and `change` (its last
        change) describe a measured figure.
        """
        self._ram_bandwidth = (gbps, source, measured_wall_s, confidence, change)

    def set_measured_ram_bandwidth(self, record: RamBandwidth) -> None:
        """Use a measured figure, with when it was measured, how far to trust it and its last change."""
        self.set_ram_bandwidth(
            record.gbps, "measured", record.measured_at_wall_s, record.confidence, record.change
        )

    def read(self) -> HardwareSnapshot:
        gpus: list[GpuReading] = []
        for probe in self._gpu_probes:
            gpus.extend(probe.read())
        # NVIDIA comes first, so its indices stay those of nvidia-smi.
        gpus = [dataclasses.replace(gpu, index=i) for i, gpu in enumerate(gpus)]
        reason = None
        if not gpus:
            reasons = [probe.reason for probe in self._gpu_probes if probe.reason]
            reason = "; ".join(reasons) if reasons else "no GPU found"
        host = self._host_probe.read(*self._ram_bandwidth)
        energy = self._energy_probe.read()
        return HardwareSnapshot(
            gpus=tuple(gpus),
            host=host,
            gpu_reason=reason,
            energy=energy,
            energy_reason=self._energy_probe.reason,
        )

    def close(self) -> None:
        for probe in self._gpu_probes:
            probe.close()
        self._host_probe.close()
        self._energy_probe.close()
