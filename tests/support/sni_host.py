"""A real StatusNotifierItem tray for tests: a private D-Bus session bus, Xvfb, the
`status-notifier-watcher` and the `gtk-sni-tray-standalone --top` host (Debian's
haskell-status-notifier-item-utils and haskell-gtk-sni-tray-utils).

`SniDisplay` is an `XDisplay` without trayer whose `env` also carries the private bus's
`DBUS_SESSION_BUS_ADDRESS`, so the tray app started on it (tests/support/trayapp_process.py)
registers its icon with that watcher. `SniBus` reads what the host reads, over D-Bus
(jeepney, which keyring already requires on Linux): the watcher's registered items, the item's
properties (IconPixmap, ToolTip, Menu) and its com.canonical.dbusmenu menu, whose items it can
click. The host draws the icons in a 30-pixel bar at the top left of the screen.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

WATCHER = "org.kde.StatusNotifierWatcher"
WATCHER_PATH = "/StatusNotifierWatcher"
ITEM_INTERFACE = "org.kde.StatusNotifierItem"
MENU_INTERFACE = "com.canonical.dbusmenu"
HOST_BAR_HEIGHT_PX = 30  # gtk-sni-tray-standalone --top: a bar this tall across the top
CALL_TIMEOUT_S = 5.0


def sni_tools_missing() -> list[str]:
    tools = ["status-notifier-watcher", "gtk-sni-tray-standalone", "dbus-daemon"]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    try:
        import jeepney  # noqa: F401
    except ImportError:
        missing.append("jeepney (a dependency of keyring on Linux)")
    return missing


def real_sni_marks() -> list[pytest.MarkDecorator]:
    """The marks of a test that runs the app on a StatusNotifierItem host against a real llama-server."""
    missing = xdisplay_tools_missing() + sni_tools_missing()
    return [
        pytest.mark.xdisplay,
        pytest.mark.llamacpp,
        pytest.mark.skipif(
            bool(missing),
            reason=f"StatusNotifierItem host tools missing: {', '.join(missing)} "
            "(tests/provision.sh installs them)",
        ),
    ]


def wait_until(what: str, get: Callable[[], Any], timeout_s: float) -> Any:
    """The first truthy value of `get()` within `timeout_s` (D-Bus errors count as not yet)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = get()
            if value:
                return value
        except Exception as exc:  # the service may not be there yet
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s (last error: {last_error})")
        time.sleep(0.1)


@dataclass(frozen=True)
class MenuItem:
    id: int
    label: str
    enabled: bool


class SniBus:
    """A connection to the private session bus, reading it the way a StatusNotifierItem host does."""

    def __init__(self, address: str) -> None:
        from jeepney.io.blocking import open_dbus_connection

        self._conn = open_dbus_connection(bus=address)

    def close(self) -> None:
        self._conn.close()

    def _call(self, message: Any) -> tuple[Any, ...]:
        from jeepney import MessageType

        reply = self._conn.send_and_get_reply(message, timeout=CALL_TIMEOUT_S)
        if reply.header.message_type == MessageType.error:
            raise RuntimeError(f"D-Bus error: {reply.header.fields} {reply.body}")
        return tuple(reply.body)

    def _get(self, bus_name: str, path: str, interface: str, name: str) -> Any:
        from jeepney import DBusAddress, Properties

        address = DBusAddress(path, bus_name=bus_name, interface=interface)
        (_signature, value), *_ = self._call(Properties(address).get(name))
        return value

    def host_registered(self) -> bool:
        return bool(self._get(WATCHER, WATCHER_PATH, WATCHER, "IsStatusNotifierHostRegistered"))

    def registered_items(self) -> list[str]:
        """The watcher's RegisteredStatusNotifierItems: 'service' or 'service/path' strings."""
        return list(self._get(WATCHER, WATCHER_PATH, WATCHER, "RegisteredStatusNotifierItems"))

    def item(self, registered: str) -> SniItem:
        service, slash, path = registered.partition("/")
        return SniItem(self, service, f"/{path}" if slash else "/StatusNotifierItem")


class SniItem:
    """One registered StatusNotifierItem and its dbusmenu."""

    def __init__(self, bus: SniBus, service: str, path: str) -> None:
        self.bus = bus
        self.service = service
        self.path = path

    def prop(self, name: str) -> Any:
        return self.bus._get(self.service, self.path, ITEM_INTERFACE, name)

    def tooltip(self) -> str:
        """The ToolTip's title and description (of icon name, pixmaps, title, description), one per line."""
        _icon_name, _pixmaps, title, text = self.prop("ToolTip")
        return "\n".join(part for part in (str(title), str(text)) if part)

    def icon_digest(self) -> str:
        """A digest of every IconPixmap (width, height, ARGB bytes): changes when the icon is redrawn."""
        digest = hashlib.sha1()
        pixmaps = self.prop("IconPixmap")
        for width, height, data in pixmaps:
            digest.update(f"{width}x{height}".encode())
            digest.update(bytes(data))
        return digest.hexdigest() if pixmaps else ""

    def _menu(self) -> Any:
        from jeepney import DBusAddress

        return DBusAddress(str(self.prop("Menu")), bus_name=self.service, interface=MENU_INTERFACE)

    def menu_items(self) -> list[MenuItem]:
        """The menu as a host shows it: AboutToShow (the app rebuilds it), then GetLayout."""
        from jeepney import new_method_call

        menu = self._menu()
        self.bus._call(new_method_call(menu, "AboutToShow", "i", (0,)))
        _revision, (_root_id, _root_props, children) = self.bus._call(
            new_method_call(menu, "GetLayout", "iias", (0, -1, []))
        )
        items = []
        for _signature, (item_id, props, _grandchildren) in children:
            if "label" in props:
                enabled = props.get("enabled", ("b", True))[1]
                items.append(MenuItem(int(item_id), str(props["label"][1]), bool(enabled)))
        return items

    def click(self, item_id: int) -> None:
        """What a host sends when the user clicks a menu item."""
        from jeepney import new_method_call

        event = new_method_call(self._menu(), "Event", "isvu", (item_id, "clicked", ("i", 0), 0))
        self.bus._call(event)


class SniDisplay(XDisplay):
    """Xvfb plus a private D-Bus session bus, a StatusNotifierWatcher and a StatusNotifierItem host."""

    def __init__(self, width: int = 1280, height: int = 800) -> None:
        super().__init__(width, height, tray=False)
        self.bus_address = ""
        self._dbus_pid: int | None = None
        self._sni_procs: list[subprocess.Popen[bytes]] = []
        self.bus: SniBus | None = None

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        if self.bus_address:
            env["DBUS_SESSION_BUS_ADDRESS"] = self.bus_address
        return env

    def __enter__(self) -> SniDisplay:
        super().__enter__()
        try:
            self._start_bus()
            self.bus = SniBus(self.bus_address)
            self._spawn(["status-notifier-watcher"])
            bus = self.bus
            wait_until("the StatusNotifierWatcher on the bus", lambda: bus.registered_items() == [], 20)
            self._spawn(["gtk-sni-tray-standalone", "--top"])
            wait_until("a registered StatusNotifierItem host", bus.host_registered, 20)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start_bus(self) -> None:
        result = subprocess.run(
            ["dbus-daemon", "--session", "--fork", "--nopidfile", "--print-address=1", "--print-pid=1"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        address, pid = result.stdout.split("\n")[:2]
        self.bus_address, self._dbus_pid = address.strip(), int(pid)

    def _spawn(self, args: list[str]) -> None:
        self._sni_procs.append(
            subprocess.Popen(
                args,
                env={**self.env, "NO_AT_BRIDGE": "1", "GDK_BACKEND": "x11"},  # no a11y bus to outlive us
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def __exit__(self, *exc: object) -> None:
        if self.bus is not None:
            self.bus.close()
            self.bus = None
        for proc in reversed(self._sni_procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._sni_procs.clear()
        if self._dbus_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._dbus_pid, signal.SIGTERM)
            self._dbus_pid = None
        super().__exit__(*exc)
