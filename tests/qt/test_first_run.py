"""First run: no server answers, and the machine may lack a GPU, NVML, a tray, a notification
daemon or a keyring. The icon and menu say no server was found, the dashboard says how to start
one or add a remote one, and the app keeps running.

The real app runs as a subprocess: offscreen with no D-Bus session at all (no tray, no
notification daemon), and on a real StatusNotifierItem host whose private bus has no
notification daemon (its warnings then go to org.freedesktop.Notifications, which is not
there). NVML is taken away by a `pynvml` module that fails to import (what a machine without
nvidia-ml-py has; a Linux machine with no NVIDIA driver at all says that instead, never importing
it); the keyring by keyring's own `fail` backend (a headless Linux box without Secret Service);
the one configured server uses the keyring for its API key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.support.snapshots import model, server, snap
from tests.support.sni_host import SniDisplay, sni_tools_missing, wait_until
from tests.support.trayapp_process import REPO, START_TIMEOUT_S, TrayAppProcess, is_event
from tests.support.xdisplay import xdisplay_tools_missing
from trayapp.ui.dashboard.empty_state import no_server_found
from trayapp.ui.dashboard.window import Dashboard

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers
NO_KEYRING = "keyring.backends.fail.Keyring"
CONFIG = f'[[endpoints]]\nurl = "{UNREACHABLE}"\nkind = "llamacpp"\nuse_keyring = true\n'


# --------------------------------------------------------------------------- the dashboard's empty state


def test_the_dashboard_says_how_to_start_a_server_or_add_one(qtbot: QtBot) -> None:
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.show()
    assert dash.empty_state.isHidden()  # before the first reading: nothing to explain yet
    dash.update_snapshot(
        snap(1.0, server(url="http://127.0.0.1:8080", status="unreachable"),
             server(url="http://127.0.0.1:11434", kind="ollama", status="unreachable"))
    )  # fmt: skip
    assert not dash.empty_state.isHidden()
    text = dash.empty_state.text()
    assert text.startswith("No LLM server found.")
    assert "Probed: 127.0.0.1:8080, 127.0.0.1:11434" in text
    for how in ("llama-server -m MODEL.gguf", "ollama serve", "LM Studio", "vllm serve"):
        assert how in text
    assert "Settings… → Servers → Add" in text and "[[endpoints]]" in text and "--endpoint" in text
    assert "No LLM server found." in dash.empty_state.label.text()  # the label shows it, in bold

    dash.update_snapshot(snap(2.0, server(model(phase="idle"))))  # a server answers: gone
    assert dash.empty_state.isHidden() and dash.empty_state.text() == ""


def test_no_server_found_means_no_server_answers() -> None:
    assert not no_server_found(None)
    assert no_server_found(snap(0.0))  # no server at all (discovery off, none configured)
    assert no_server_found(snap(0.0, server(status="unreachable")))
    assert not no_server_found(
        snap(0.0, server(status="unreachable"), server(url="http://h:1", status="error"))
    )
    assert not no_server_found(snap(0.0, server()))  # ok, even with no model loaded


# --------------------------------------------------------------------------- the real app


def _no_nvml_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with a `pynvml` that cannot be imported, and keyring's failing backend."""
    blocked = tmp_path / "no-nvml"
    blocked.mkdir(exist_ok=True)
    (blocked / "pynvml.py").write_text('raise ImportError("no nvidia-ml-py here (test)")\n')
    path = os.pathsep.join(p for p in (str(blocked), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PYTHON_KEYRING_BACKEND": NO_KEYRING}


def _events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def _status_json(env: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "trayapp", "status", "--json", "--no-discover"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1, 2), result.stderr  # its exit code says how the servers are
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_first_run_offscreen_without_gpu_nvml_tray_notifications_or_keyring(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(CONFIG)
    events = tmp_path / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("DBUS_SESSION_BUS_ADDRESS", "DISPLAY")}
    env.update(
        _no_nvml_env(tmp_path),
        QT_QPA_PLATFORM="offscreen",
        LLM_TRAY_HOME=str(home),
        LLM_TRAY_TEST_EVENTS=str(events),
        LLM_TRAY_TRAY_WAIT_S="2",
        DBUS_SESSION_BUS_ADDRESS=f"unix:path={tmp_path / 'no-bus'}",  # no session bus: no notifications
    )
    args = [sys.executable, "-m", "trayapp", "--no-discover"]
    with subprocess.Popen(args, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True) as process:
        try:

            def running_and_warned() -> bool:
                if process.poll() is not None:
                    pytest.fail(f"the app exited ({process.returncode}): {process.stderr.read()}")
                seen = _events(events)
                snapshots = sum(e["event"] == "snapshot" for e in seen)
                return snapshots >= 2 and any(e["event"] == "warning" for e in seen)

            wait_until("two snapshots and the no-key warning", running_and_warned, START_TIMEOUT_S)
            status = _status_json(env)
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=30) == 0
            stderr = process.stderr.read() if process.stderr else ""
        finally:
            if process.poll() is None:
                process.kill()
    seen = _events(events)
    kinds = [e["event"] for e in seen]
    assert "no_tray" in kinds and "no_tray_window" in kinds and kinds[-1] == "quit"
    assert "error" not in kinds, [e for e in seen if e["event"] == "error"]
    warnings = [str(e["message"]) for e in seen if e["event"] == "warning"]
    assert any("no API key" in w and "api_key_env" in w for w in warnings), warnings  # no keyring: told how
    servers = status["servers"]
    assert isinstance(servers, list) and [(s["url"], s["status"]) for s in servers] == [
        (UNREACHABLE, "unreachable")
    ]
    hardware = status["hardware"]
    assert isinstance(hardware, dict) and hardware["gpus"] == []
    # Where Linux has no NVIDIA driver at all, that is the reason (installing nvidia-ml-py would not help)
    assert _expected_nvml_reason() in str(hardware["gpu_reason"])
    log_text = (home / "data" / "llm-tray.log").read_text()
    assert "Traceback" not in log_text and "Traceback" not in stderr, log_text[-3000:]


_missing = xdisplay_tools_missing() + sni_tools_missing()


@pytest.mark.xdisplay
@pytest.mark.skipif(bool(_missing), reason=f"StatusNotifierItem host tools missing: {', '.join(_missing)}")
def test_first_run_on_a_status_notifier_host_without_a_notification_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _no_nvml_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    with SniDisplay() as display:
        bus = display.bus
        assert bus is not None
        app = TrayAppProcess(display, UNREACHABLE, tmp_path, config_toml=CONFIG)
        try:
            app.wait_for("'tray_shown'", is_event("tray_shown"), START_TIMEOUT_S)
            # the no-key warning is shown as a notification: over D-Bus, to a daemon that is not there
            app.wait_for("the no-key warning", is_event("warning"), START_TIMEOUT_S)
            item = bus.item(wait_until("a registered item", bus.registered_items, 20.0)[0])
            wait_until(
                "'No LLM server found' in the tooltip", lambda: "No LLM server found" in item.tooltip(), 30
            )
            labels = [m.label for m in item.menu_items()]
            assert "No LLM server found" in labels and "   probed 127.0.0.1:9" in labels, labels
            app.wait_for("another snapshot", is_event("snapshot"), 30.0)  # still running
            assert app.quit() == 0, app.log_tail()
        finally:
            app.stop()
    kinds = [e["event"] for e in app.events()]
    assert kinds[-1] == "quit" and "error" not in kinds
    assert "Traceback" not in app.log_tail()


def _expected_nvml_reason() -> str:
    """What this machine lacks first, from its own facts: a loaded NVIDIA driver or NVML's library on
    Linux, else (the blocked module) nvidia-ml-py."""
    import ctypes

    if sys.platform.startswith("linux") and not Path("/proc/driver/nvidia").exists():
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return "no NVIDIA driver"
    return "nvidia-ml-py is not installed"
