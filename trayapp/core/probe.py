"""The protocols the sources and sinks implement for the pipeline. No I/O here."""

from __future__ import annotations

from typing import Protocol

from trayapp.core.hardware_readings import HardwareSnapshot
from trayapp.core.model import ServerReading


class ServerProbe(Protocol):
    """Polls one server. `poll` never raises: failures come back as a status + reason."""

    kind: str
    url: str

    def poll(self, now_mono_s: float) -> ServerReading: ...

    def close(self) -> None: ...


class HardwareSource(Protocol):
    def read(self) -> HardwareSnapshot: ...
