"""The tray process's entry point: `run_tray` (logging, the QApplication, one instance per user,
signals, the monitor it samples with) builds the `TrayApp` (app/tray_app.py) and runs Qt's loop until quit."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from trayapp.app.events import TestEvents
from trayapp.app.log_setup import install_excepthook, setup_logging
from trayapp.app.single_instance import notify_running, single_instance
from trayapp.app.tray_app import MonitorFactory, TrayApp
from trayapp.config.settings import EndpointConfig, Settings, watched_settings
from trayapp.core.hardware_readings import HardwareProfile
from trayapp.services.proxy.inbox import RecordInbox
from trayapp.sources.malloc import release_free_memory, settle_the_heap
from trayapp.ui.icons import app_icon
from trayapp.ui.qtcompat import apply_workarounds, stop_source_caching
from trayapp.ui.worker import MonitorLike

log = logging.getLogger(__name__)

HEARTBEAT_MS = 200  # lets Python run signal handlers while Qt's loop sleeps
EVENTS_ENV = "LLM_TRAY_TEST_EVENTS"


def _handle_signals(app: QApplication) -> QTimer:
    """Ctrl+C / SIGTERM quit cleanly; a heartbeat timer lets Python run the handler promptly."""

    def quit_app(signum: int, _frame: object) -> None:
        # Said and done from Qt's loop, not here: the handler runs between two bytecodes of whatever the
        # main thread was doing, a write to the log file included (a log call here raised "reentrant
        # call inside BufferedWriter" and the line was lost: cc55).
        QTimer.singleShot(0, lambda: quit_from_the_loop(signum))

    def quit_from_the_loop(signum: int) -> None:
        log.info("signal %d: quitting", signum)
        app.quit()

    signal.signal(signal.SIGINT, quit_app)
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, quit_app)
    heartbeat = QTimer(app)
    heartbeat.setObjectName("python-signal-heartbeat")
    heartbeat.timeout.connect(lambda: None)
    heartbeat.start(HEARTBEAT_MS)
    return heartbeat


RELEASE_FIRST_MS = 10_000  # start-up done: imports, the first ticks, the RAM-bandwidth measurement
RELEASE_EVERY_MS = 600_000


def _release_free_memory_now_and_then(app: QApplication) -> QTimer:
    """glibc keeps the pages start-up freed (~3 MiB of an idle tray's RSS): handed back once start-up is
    done, then every 10 minutes (a few ms on the GUI thread; nothing off glibc). At the first, the
    objects start-up made are left out of Python's later collections (`settle_the_heap`)."""
    timer = QTimer(app)
    timer.setObjectName("release-free-memory")

    def release() -> None:
        if timer.interval() == RELEASE_FIRST_MS:
            settle_the_heap()  # start-up's objects out of every later collection
        release_free_memory()
        timer.setInterval(RELEASE_EVERY_MS)

    timer.timeout.connect(release)
    timer.start(RELEASE_FIRST_MS)
    return timer


def skip_httpx_cli() -> None:
    """httpx imports its command-line client where click, rich and pygments are installed (~80
    modules, ~3 MiB); the app never runs it. Marked absent, httpx defines its stub `main` instead."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def default_monitor_factory(
    settings: Settings,
    extra_endpoints: Sequence[EndpointConfig],
    discover: bool | None,
    profile: HardwareProfile | None,
    proxy_inbox: RecordInbox | None = None,
) -> MonitorFactory:
    def factory() -> MonitorLike:
        from trayapp.services.monitor import Monitor  # built on the sampler thread, with its handles

        return Monitor(
            watched_settings(settings),
            extra_endpoints=extra_endpoints,
            discover=discover,
            profile=profile,
            record=True,
            proxy_inbox=proxy_inbox,
        )

    return factory


def run_tray(
    settings: Settings,
    *,
    extra_endpoints: Sequence[EndpointConfig] = (),
    discover: bool | None = None,
    profile: HardwareProfile | None = None,
    at_login: bool = False,
    monitor_factory: MonitorFactory | None = None,
    startup_warnings: Sequence[str] = (),
) -> int:
    """Run the tray app until it quits; returns the exit code (0 also when another instance was asked).

    `startup_warnings` (e.g. config file errors) are logged and shown once, like monitor warnings.
    """
    stop_source_caching()  # before the sampler's and the dashboard's imports
    skip_httpx_cli()
    log_path = setup_logging()
    install_excepthook()
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(sys.argv[:1])
    apply_workarounds()
    app.setApplicationName("llm-tray")
    app.setQuitOnLastWindowClosed(False)
    app.setWindowIcon(app_icon())

    if notify_running():
        log.info("llm-tray is already running: asked it to show its dashboard")
        print("llm-tray is already running: showing its dashboard", file=sys.stderr)
        return 0
    instance = single_instance()
    instance.listen()
    log.info("starting (log: %s, at_login=%s)", log_path, at_login)

    inbox = RecordInbox()
    factory = monitor_factory or default_monitor_factory(settings, extra_endpoints, discover, profile, inbox)
    tray_app = TrayApp(
        app,
        settings,
        factory,
        at_login=at_login,
        events=TestEvents(os.environ.get(EVENTS_ENV)),
        instance=instance,
        proxy_inbox=inbox,
        discover=discover,
    )
    heartbeat = _handle_signals(app)
    tray_app.start()
    releaser = _release_free_memory_now_and_then(app)
    for warning in startup_warnings:
        log.warning("%s", warning)
        tray_app.on_warning(warning)
    try:
        code = app.exec()
    finally:
        heartbeat.stop()
        releaser.stop()
        tray_app.shutdown()
    log.info("stopped (exit code %d)", code)
    return int(code)
