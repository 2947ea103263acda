"""The idle tray does not load the plotting stack: pyqtgraph, numpy and the dashboard's modules load
when the dashboard is first opened, and the snapshots it was fed while unbuilt are all in it then.
Nor does `import trayapp.app.tray_app` load an HTTP stack (start-up to a visible icon).

The import check runs in a fresh interpreter (this test process has imported pyqtgraph already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.support.snapshots import alert, model, server, snap
from trayapp.core.history import History
from trayapp.ui import dashboard as dashboard_pkg
from trayapp.ui.dashboard import LazyDashboard
from trayapp.ui.dashboard import alerts as alerts_module
from trayapp.ui.dashboard import window as window_module

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pyqtgraph", "numpy", "trayapp.ui.dashboard.window", "trayapp.core.history")
# The HTTP stacks load on the sampler's thread (httpx) or when a proxy is turned on (asyncio, the
# proxy server), never before the icon: `import trayapp.app.tray_app` must not pull them in.
NETWORK = ("httpx", "asyncio", "trayapp.services.proxy.server", "trayapp.services.proxy.runner")
CHILD_TIMEOUT_S = 120.0

CHILD = """
import json, sys
from PySide6.QtWidgets import QApplication
qapp = QApplication([])
from tests.support.snapshots import model, server, snap
from trayapp.app import tray_app as app_module
from trayapp.config.settings import Settings

HEAVY, NETWORK = %r, %r
loaded = lambda: {name: name in sys.modules for name in HEAVY}
report = {"after_import": loaded(), "network_after_import": [n for n in NETWORK if n in sys.modules]}

def no_monitor():
    raise AssertionError("the sampler is not started in this test")

tray = app_module.TrayApp(qapp, Settings(), no_monitor, events=app_module.TestEvents(None))
report["after_construct"] = loaded()
for i in range(3):
    tray.on_snapshot(snap(float(i), server(model(rate=40.0 + i))))
report["after_snapshots"] = loaded()
report["diagnostics_pyqtgraph"] = tray.versions.get("pyqtgraph")
drawn = []
tray.dashboard.redrawn.connect(drawn.append)
tray.show_dashboard()
qapp.processEvents()
report["after_open"] = loaded()
report["visible"] = tray.dashboard.isVisible()
report["drawn"] = drawn
tray.shutdown()
print("REPORT " + json.dumps(report))
"""


def test_the_plotting_stack_loads_only_when_the_dashboard_opens(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(
        QT_QPA_PLATFORM="offscreen",
        PYTHONPATH=str(REPO),
        LLM_TRAY_HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
    )
    env.pop("LLM_TRAY_TEST_EVENTS", None)
    result = subprocess.run(
        [sys.executable, "-c", CHILD % (HEAVY, NETWORK)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    nothing = dict.fromkeys(HEAVY, False)
    assert report["after_import"] == nothing
    assert report["network_after_import"] == []
    assert report["after_construct"] == nothing
    assert report["after_snapshots"] == nothing  # fed while hidden, still without numpy
    assert report["diagnostics_pyqtgraph"] not in (None, "", "?")  # read from its metadata
    assert report["after_open"] == dict.fromkeys(HEAVY, True)
    assert report["visible"] is True
    # The three snapshots fed before the window existed are all on its first plot.
    assert report["drawn"][-1] == {"model": "llama3.1:8b", "points": 3, "total": 3}


def test_snapshots_kept_while_unbuilt_are_bounded_by_the_window_and_alerts_survive(
    qapp: QApplication, qtbot: QtBot
) -> None:
    lazy = LazyDashboard(window_s=10.0)
    early = alert("offload-early")
    lazy.update_snapshot(snap(0.0, server(model(rate=30.0)), alerts=(early,)))
    for t in range(1, 21):
        lazy.update_snapshot(snap(float(t), server(model(rate=40.0))))
    ended = alert("offload-late")
    lazy.update_snapshot(replace(snap(21.0, server(model(rate=40.0))), ended_alerts=(ended,)))
    assert not lazy.loaded
    assert lazy.pending_count == 11  # t = 11 … 21: the 10 s window ending at 21 s, ends included

    drawn: list[dict[str, object]] = []
    lazy.redrawn.connect(drawn.append)
    lazy.show_and_raise()
    qtbot.addWidget(lazy.window)
    qtbot.waitUntil(lambda: bool(drawn), timeout=5000)
    assert lazy.loaded and lazy.pending_count == 0
    assert len(lazy.window.history) == 11
    assert drawn[-1]["points"] == 11
    ids = {
        lazy.window.alert_list.item(row).data(0x0100)  # Qt.ItemDataRole.UserRole
        for row in range(lazy.window.alert_list.count())
    }
    assert ids == {"offload-early", "offload-late"}  # the early one came from a dropped snapshot
    lazy.window.hide()


def test_the_lazy_bounds_agree_with_the_window() -> None:
    assert dashboard_pkg.HIDDEN_WINDOW_S == window_module.WINDOW_S
    assert dashboard_pkg.MAX_EARLIER_ALERTS == alerts_module.MAX_ALERTS
    assert History().max_points == dashboard_pkg.MAX_HIDDEN_SNAPSHOTS
