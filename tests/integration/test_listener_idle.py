"""An idle listener sleeps (#26): the snapshot endpoint and /metrics accept loops wake only for a client
or for `shutdown`, which stops them at once. Before, the snapshot endpoint polled every 50 ms so that
a stop on the GUI thread waited at most that: 20 wake-ups a second, most of an idle tray's CPU."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

import httpx

from tests.support.fake_servers import wait_until
from trayapp.sinks.listener import GuardedServer

QUIET_S = 0.5  # how long an idle listener is watched for wake-ups (the old loop woke 10 times in it)
WAIT_S = 20.0


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Counting(GuardedServer):
    """Counts the accept loop's turns (socketserver calls service_actions once a turn)."""

    turns = 0

    def service_actions(self) -> None:
        self.turns += 1


def test_an_idle_listener_wakes_only_for_clients_and_stops_at_once() -> None:
    server = _Counting(("127.0.0.1", 0), _Ok, max_connections=4, name="test")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        assert httpx.get(url, timeout=WAIT_S).text == "ok"
        wait_until(lambda: server.turns >= 1, WAIT_S)  # a handler may answer before the loop counts its turn
        turns = server.turns
        threading.Event().wait(QUIET_S)  # nothing happens: a polling loop would turn ~10 times
        assert server.turns == turns
        assert httpx.get(url, timeout=WAIT_S).text == "ok"
        wait_until(lambda: server.turns >= turns + 1, WAIT_S)  # the accept woke the loop (cc45: awaited)
    finally:
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        stopper.join(WAIT_S)
        stopped = not stopper.is_alive()
        server.server_close()
    assert stopped, "shutdown did not wake the accept loop"
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_shutdown_before_the_loop_runs_ends_that_loop_at_once_then_serving_starts_again() -> None:
    """As socketserver's: a stop asked while the loop's thread is starting ends the loop when it starts
    (a stop at start-up is not lost); unlike socketserver's, that shutdown does not wait for it."""
    server = GuardedServer(("127.0.0.1", 0), _Ok, max_connections=4, name="test")
    try:
        server.shutdown()
        first = threading.Thread(target=server.serve_forever, daemon=True)
        first.start()
        first.join(WAIT_S)
        assert not first.is_alive()
        second = threading.Thread(target=server.serve_forever, daemon=True)
        second.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        assert httpx.get(url, timeout=WAIT_S).text == "ok"
        server.shutdown()
        second.join(WAIT_S)
        assert not second.is_alive()
    finally:
        server.server_close()
