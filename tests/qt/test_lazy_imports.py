"""The idle tray does not load the plotting stack: pyqtgraph, numpy and the dashboard's modules load
when the dashboard is first opened, and the snapshots it was fed while unbuilt are all in it then.
Nor does `import trayapp.app.tray_main` (run_tray, which imports tray_app) load an HTTP stack (start-up
to a visible icon), nor the windows a user rarely opens (settings, the no-tray window), nor the keyring
or httpx's command-line client (the sampler's thread); PySide6 keeps no module's source (issue #26:
16 MiB of the idle tray's RSS).

The import check runs in a fresh interpreter (this test process has imported pyqtgraph already).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

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
# proxy server), never before the icon: `import trayapp.app.tray_main` must not pull them in. QtNetwork
# (~2.5 MiB) is the single-instance check's on Windows only, loaded when it runs.
NETWORK = (
    "httpx",
    "asyncio",
    "trayapp.services.proxy.server",
    "trayapp.services.proxy.runner",
    "PySide6.QtNetwork",
)
# Loaded when the user first opens them (their Qt classes cost ~2 MiB of RSS), or asks for diagnostics.
RARE = ("trayapp.ui.settings_dialog", "trayapp.ui.no_tray_window", "trayapp.ui.versions")
CHILD_TIMEOUT_S = 120.0

CHILD = """
import json, sys
from PySide6.QtWidgets import QApplication
qapp = QApplication([])
from tests.support.snapshots import model, server, snap
from trayapp.app import tray_main  # run_tray: what `llm-tray` imports to start the tray
from trayapp.app import tray_app as app_module
from trayapp.config.settings import Settings

HEAVY, NETWORK, RARE = %r, %r, %r
loaded = lambda: {name: name in sys.modules for name in HEAVY}
rare = lambda: [name for name in RARE if name in sys.modules]
report = {"after_import": loaded(), "network_after_import": [n for n in NETWORK if n in sys.modules]}

def no_monitor():
    raise AssertionError("the sampler is not started in this test")

tray = app_module.TrayApp(qapp, Settings(), no_monitor, events=app_module.TestEvents(None))
report["after_construct"] = loaded()
report["rare_after_construct"] = rare()
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
report["rare_before_settings"] = rare()
tray.open_settings()
report["settings_visible"] = tray._settings_dialog.isVisible()
report["rare_after_settings"] = rare()
tray._settings_dialog.close()
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
        [sys.executable, "-c", CHILD % (HEAVY, NETWORK, RARE)],
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
    assert report["rare_after_construct"] == []
    assert report["after_snapshots"] == nothing  # fed while hidden, still without numpy
    assert report["diagnostics_pyqtgraph"] not in (None, "", "?")  # read from its metadata
    assert report["after_open"] == dict.fromkeys(HEAVY, True)
    assert report["visible"] is True
    # The three snapshots fed before the window existed are all on its first plot.
    assert report["drawn"][-1] == {"model": "llama3.1:8b", "points": 3, "total": 3}
    # Diagnostics' versions were read above (from metadata, when asked); settings load when opened.
    assert report["rare_before_settings"] == ["trayapp.ui.versions"]
    assert report["settings_visible"] is True
    assert report["rare_after_settings"] == ["trayapp.ui.settings_dialog", "trayapp.ui.versions"]


def run_child(code: str, tmp_path: Path, extra_path: Path | None = None) -> dict[str, Any]:
    """`code` run in a fresh interpreter (offscreen Qt, its own homes, `extra_path` importable too); the
    JSON it printed after REPORT."""
    env = dict(os.environ)
    env.update(
        QT_QPA_PLATFORM="offscreen",
        PYTHONPATH=os.pathsep.join(str(p) for p in (REPO, *([extra_path] if extra_path else []))),
        LLM_TRAY_HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg"),
    )
    command = [sys.executable, "-c", code]
    timeout_s = CHILD_TIMEOUT_S
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("REPORT "))
    report: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
    return report


SOURCE_CHILD = """
import json, linecache, sys
import PySide6.QtCore
from trayapp.ui.qtcompat import stop_source_caching
patched = stop_source_caching()
import qt_user, plain_module
feature = sys.modules["PySide6.support.feature"]
print("REPORT " + json.dumps({
    "patched": patched,
    "cached": [f for f in linecache.cache if f.endswith(("qt_user.py", "plain_module.py"))],
    "flags": {n: feature.pyside_feature_dict.get(n) for n in ("qt_user", "plain_module")},
}))
"""


def test_pyside_keeps_no_source_of_the_modules_imported_after_it(tmp_path: Path) -> None:
    """shiboken reads each imported module's source to see whether it mentions PySide6 (for its
    `__feature__` switches), with `inspect.getsource`, which kept every file in `linecache`: 15.7 MiB of
    the idle tray (tracemalloc). The patched check gives shiboken the same answers and keeps nothing."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "qt_user.py").write_text("from PySide6.QtCore import QObject\n", encoding="utf-8")
    (modules / "plain_module.py").write_text("VALUE = 1\n" * 1000, encoding="utf-8")
    report = run_child(SOURCE_CHILD, tmp_path, extra_path=modules)
    assert report["patched"] is True
    assert report["cached"] == []
    assert report["flags"] == {"qt_user": 0, "plain_module": -1}  # 0: uses PySide, -1: ignored


SAMPLER_CHILD = """
import json, sys
from trayapp.app.tray_main import skip_httpx_cli
skip_httpx_cli()
import httpx
import trayapp.services.monitor
from trayapp.sources import secrets
before = [n for n in ("keyring", "click", "rich", "pygments") if n in sys.modules]
url = "http://127.0.0.1:1"
key, why = secrets.resolve_api_key(url, api_key_env="LLM_TRAY_NO_SUCH_KEY", use_keyring=False)
after_env = "keyring" in sys.modules
print("REPORT " + json.dumps({"before": before, "after_env": after_env, "why": why,
                              "httpx_main": callable(httpx.main), "client": httpx.Client is not None}))
"""


def test_the_sampler_loads_neither_the_keyring_nor_httpx_s_command_line(tmp_path: Path) -> None:
    """The keyring (and its ~30 modules) loads when a key is stored or read from it; httpx's command-line
    client (click, rich, pygments where installed: ~80 modules, ~3 MiB) never loads in the tray."""
    report = run_child(SAMPLER_CHILD, tmp_path)
    assert report["before"] == []
    assert report["after_env"] is False  # a key from the environment needs no keyring
    assert report["why"] == "environment variable LLM_TRAY_NO_SUCH_KEY is not set"
    assert report["httpx_main"] is True  # httpx's own stub, which says how to install its CLI
    assert report["client"] is True


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
