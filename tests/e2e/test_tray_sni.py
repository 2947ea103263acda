"""The tray app on a StatusNotifierItem host (KDE, GNOME's AppIndicator, Waybar, …) end to end.

A private D-Bus session bus, Xvfb, the real `status-notifier-watcher` and the real
`gtk-sni-tray-standalone` host (tests/support/sni_host.py), a real llama-server and the real app
(`python -m trayapp`, QT_QPA_PLATFORM=xcb). The test reads the item as a host does, over D-Bus:
it is registered with the watcher, its icon pixmaps and tooltip change when a separate client
makes the server generate, the host draws it in its bar, and its com.canonical.dbusmenu menu has
the app's items: "Open dashboard" opens the dashboard and "Quit" quits the app.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.images import differing_pixels, std_dev
from tests.support.llama import LlamaServer, OpenEndedGeneration
from tests.support.sni_host import HOST_BAR_HEIGHT_PX, SniDisplay, SniItem, real_sni_marks, wait_until
from tests.support.trayapp_process import START_TIMEOUT_S, TrayAppProcess, is_event

pytestmark = real_sni_marks()


@pytest.fixture
def display() -> Iterator[SniDisplay]:
    with SniDisplay() as x:
        yield x


def _labels(item: SniItem) -> list[str]:
    return [m.label for m in item.menu_items()]


def _click(item: SniItem, label: str) -> None:
    found = [m for m in item.menu_items() if m.label == label]
    assert found, f"no menu item {label!r} in {_labels(item)}"
    assert found[0].enabled, f"menu item {label!r} is disabled"
    item.click(found[0].id)


def test_tray_icon_and_menu_on_a_status_notifier_host(
    display: SniDisplay, llama_server: LlamaServer, tmp_path: Path
) -> None:
    bus = display.bus
    assert bus is not None
    corner = f"{HOST_BAR_HEIGHT_PX}x{HOST_BAR_HEIGHT_PX}+0+0"  # the host's first icon slot
    empty_shot = display.screenshot(tmp_path / "sni-empty.png", crop=corner)
    assert std_dev(empty_shot) < 0.01, "the host's bar is not empty before the app starts"
    assert bus.registered_items() == []

    app = TrayAppProcess(display, llama_server.url, tmp_path)
    try:
        app.wait_for("'tray_shown'", is_event("tray_shown"), START_TIMEOUT_S)
        registered = wait_until("a registered StatusNotifierItem", bus.registered_items, 20.0)
        assert len(registered) == 1, registered
        item = bus.item(registered[0])
        assert item.prop("Id") == "llm-tray"
        assert item.prop("Status") == "Active"

        idle = app.wait_for("an idle icon", is_event("icon", health="idle"), START_TIMEOUT_S)
        idle_digest = item.icon_digest()
        assert idle_digest, "the item has no IconPixmap"
        assert idle["tooltip"] in item.tooltip(), item.tooltip()  # what the app set, as the host reads it
        idle_shot = wait_until(
            "the icon drawn in the host's bar",
            lambda: (
                (shot := display.screenshot(tmp_path / "sni-idle.png", crop=corner))
                and std_dev(shot) > 0.02
                and shot
            ),
            20.0,
        )

        # The menu, as the host shows it: the server's line and the app's actions.
        labels = _labels(item)
        for expected in ("Open dashboard", "Pause monitoring", "Settings…", "Quit"):
            assert expected in labels, labels
        port = llama_server.url.rsplit(":", 1)[1]
        assert any(f"127.0.0.1:{port}" in label for label in labels), labels

        # A separate client generates: the item's pixmaps and tooltip change, and so does the bar.
        request = OpenEndedGeneration(llama_server.url, "Tell a long story about a lighthouse.")
        live = app.wait_live_number(60.0)
        assert live["health"] not in ("idle", "none")
        live_digest = item.icon_digest()
        assert live_digest and live_digest != idle_digest, "IconPixmap is the same idle and generating"
        assert "tok/s" in item.tooltip(), item.tooltip()
        gen_shot = display.screenshot(tmp_path / "sni-generating.png", crop=corner)
        changed = differing_pixels(idle_shot, gen_shot)
        assert changed >= 20, f"the host draws the same icon idle and generating ({changed} pixels differ)"
        assert request.stop() > 0  # hung up: the server stops generating

        # The menu works: "Open dashboard" opens it, "Quit" quits.
        _click(item, "Open dashboard")
        app.wait_for("'dashboard_shown'", is_event("dashboard_shown"), 20.0)
        _click(item, "Quit")
        try:
            code = app.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the app did not quit within 20 s of the menu's Quit:\n{app.log_tail()}")
        assert code == 0, app.log_tail()
        assert app.events()[-1]["event"] == "quit"
        assert not [e for e in app.events() if e["event"] == "error"]
        wait_until("the item gone from the watcher", lambda: bus.registered_items() == [], 20.0)
    finally:
        app.stop()
