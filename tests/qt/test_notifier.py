"""One notification per new alert episode; mutes and do-not-disturb suppress."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

from tests.support.snapshots import alert, model, server, snap
from trayapp.config.settings import NotificationConfig
from trayapp.ui.notifier import NotificationGate, Notifier, notification_text


class RecordingTray(QSystemTrayIcon):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[str, str]] = []

    def showMessage(self, title: str, body: str, *args: object) -> None:
        self.messages.append((title, body))


def test_one_notification_per_new_alert_never_repeated(qtbot: QtBot) -> None:
    tray = RecordingTray()
    notifier = Notifier(tray)
    a = replace(alert("offload-1"), evidence={"cpu_share": 0.52})
    for t in range(5):  # the same episode on five ticks
        notifier.on_snapshot(snap(float(t), server(model()), alerts=(a,)))
    assert tray.messages == [
        (
            "qwen3:30b spilled to the CPU (52 %)",
            "Decode ~9 tok/s instead of ~48. The context grew to 32k (+4.1 GB KV).\n"
            "Fix: num_ctx ≤ 12k keeps it on the GPU, or set KV cache to q8_0.",
        )
    ]
    b = replace(alert("floor-2", kind="below_floor"), message="decode under 3 tok/s")
    notifier.on_snapshot(snap(6.0, server(model()), alerts=(a, b)))
    assert len(tray.messages) == 2 and tray.messages[1][0] == "qwen3:30b is below the usable speed"
    assert "decode under 3 tok/s" in tray.messages[1][1]
    again = alert("offload-3")  # a new episode of the same kind is news again
    notifier.on_snapshot(snap(7.0, server(model()), alerts=(a, b, again)))
    assert len(tray.messages) == 3


def test_click_opens_the_alert(qtbot: QtBot) -> None:
    tray = RecordingTray()
    notifier = Notifier(tray)
    notifier.on_snapshot(snap(0.0, server(model()), alerts=(alert("offload-9"),)))
    with qtbot.waitSignal(notifier.alert_clicked) as blocker:
        tray.messageClicked.emit()
    assert blocker.args == ["offload-9"]


def test_muted_kind_and_dnd_suppress(qtbot: QtBot) -> None:
    tray = RecordingTray()
    notifier = Notifier(tray, NotificationConfig(muted_kinds=("offload",)))
    notifier.on_snapshot(snap(0.0, server(model()), alerts=(alert("offload-1"),)))
    assert tray.messages == []
    notifier.on_snapshot(snap(1.0, server(model()), alerts=(alert("ctx-1", kind="context_full"),)))
    assert len(tray.messages) == 1
    notifier.set_config(NotificationConfig(do_not_disturb=True))
    notifier.on_snapshot(snap(2.0, server(model()), alerts=(alert("ctx-2", kind="context_full"),)))
    assert len(tray.messages) == 1
    notifier.set_config(NotificationConfig())
    notifier.on_snapshot(snap(3.0, server(model()), alerts=(alert("ctx-2", kind="context_full"),)))
    assert len(tray.messages) == 1  # suppressed during DND: not replayed afterwards
    notifier.set_config(NotificationConfig(enabled=False))
    notifier.on_snapshot(snap(4.0, server(model()), alerts=(alert("ctx-3", kind="context_full"),)))
    assert len(tray.messages) == 1


def test_several_new_alerts_make_one_bubble(qtbot: QtBot) -> None:
    tray = RecordingTray()
    notifier = Notifier(tray)
    critical = replace(
        alert("floor-1", kind="below_floor", severity="critical"), message="decode under 3 tok/s"
    )
    shown = notifier.on_snapshot(snap(0.0, server(model()), alerts=(alert("offload-1"), critical)))
    assert {a.id for a in shown} == {"offload-1", "floor-1"}
    assert len(tray.messages) == 1
    title, body = tray.messages[0]
    assert title == "qwen3:30b is below the usable speed (+1 more)"
    assert "decode under 3 tok/s" in body
    assert "Also: qwen3:30b spilled to the CPU" in body
    assert notifier.last_alert_id == "floor-1"


def test_gate_rules_are_pure() -> None:
    gate = NotificationGate(NotificationConfig())
    info = alert("cold-1", kind="cold_load", severity="info")
    ended = replace(alert("old-1"), ended_wall_s=5.0)
    assert gate.why_not(info) == "info alerts are not notified"
    assert gate.why_not(ended) == "already ended"
    assert gate.select([info, ended, alert("x")]) == [alert("x")]
    assert gate.why_not(alert("x")) == "already notified for this episode"
    long = replace(alert(), kind="unknown_kind", message="m" * 200, cause=None)
    title, body = notification_text(long)
    assert len(title) == 90 and title.endswith("…") and body.endswith("Fix: " + long.fix)


def test_notification_title_is_a_short_headline_and_the_body_keeps_the_numbers() -> None:
    offload = replace(
        alert(),
        kind="offload",
        model="qwen3:30b",
        message="qwen3:30b is 52 % on the CPU: expect at most ~9 tok/s instead of ~48 tok/s fully on GPU.",
        fix="a context of 12k tokens fits fully on the GPU.",
        evidence={"cpu_share": 0.52},
    )
    title, body = notification_text(offload)
    assert title == "qwen3:30b spilled to the CPU (52 %)"
    assert "~9 tok/s instead of ~48" in body and "Fix: a context of 12k" in body


def test_the_body_gives_the_first_command_and_where_to_copy_them_all() -> None:
    """#20: a tray message has no buttons (Linux, macOS, Windows): the tray menu's "Copy fix" copies."""
    commands = ("OLLAMA_CONTEXT_LENGTH=12288 ollama serve", '"options": {"num_ctx": 12288}')
    offload = replace(alert(), evidence={"cpu_share": 0.52}, fix_commands=commands)
    _title, body = notification_text(offload)
    assert body.splitlines()[-2:] == [
        f"Fix: {offload.fix}",
        "“Copy fix” in the tray menu: OLLAMA_CONTEXT_LENGTH=12288 ollama serve (+1 more)",
    ]
