"""The tray menu's "Benchmark this model…" (#13): enabled for a model loaded on this machine, naming it,
and asking the app for that server and model; disabled when there is nothing local to bench."""

from __future__ import annotations

from dataclasses import replace

from pytestqt.qtbot import QtBot

from tests.support.snapshots import LLAMA, OLLAMA, model, server, snap
from trayapp.ui.tray import TrayController


def _tray(qtbot: QtBot) -> TrayController:
    return TrayController(None, min_redraw_interval_s=0.0, template=False)


def test_a_loaded_local_model_can_be_benched(qtbot: QtBot) -> None:
    tray = _tray(qtbot)
    tray.update_snapshot(snap(0.0, server(model("gemma-3-270m", phase="idle", rate=None))))
    tray.rebuild_menu()
    assert tray.bench_action.isEnabled()
    assert tray.bench_action.text() == "Benchmark gemma-3-270m…"
    with qtbot.waitSignal(tray.bench_requested, timeout=2000) as asked:
        tray.bench_action.trigger()
    assert asked.args == [LLAMA, "llamacpp", "gemma-3-270m"]


def test_the_model_the_icon_shows_is_the_one_benched(qtbot: QtBot) -> None:
    tray = _tray(qtbot)
    idle = server(model("idle-one", phase="idle", rate=None), url=OLLAMA, kind="ollama")
    busy = server(model("busy-one", rate=30.0))
    tray.update_snapshot(snap(0.0, idle, busy))
    tray.rebuild_menu()
    assert tray.bench_action.text() == "Benchmark busy-one…"  # the icon speaks for the decoding one


def test_nothing_to_bench_when_no_local_model_is_loaded(qtbot: QtBot) -> None:
    tray = _tray(qtbot)
    tray.update_snapshot(snap(0.0, server(model("cold", phase="unloaded", rate=None))))
    tray.rebuild_menu()
    assert not tray.bench_action.isEnabled()
    remote = replace(server(model("far", phase="idle", rate=None)), machine="gpu-box")
    tray.update_snapshot(snap(1.0, remote))
    tray.rebuild_menu()
    assert not tray.bench_action.isEnabled()  # a remote machine's model is benched on that machine
