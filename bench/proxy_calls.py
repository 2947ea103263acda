"""How many function calls one request costs the proxy's loop thread: a count, not a time.

    python bench/proxy_calls.py [--src DIR ...] [--requests N] [--keep-alive] [--top K] [--callers NAME]

On a shared two-core host a time moves by tens of percent from one run to the next; the number of
Python and C calls the proxy's event-loop thread makes for a request does not. This counts them
(`sys.setprofile` on that thread only) while N streamed chat requests go through the real proxy
(`ProxyThread`, a vLLM-kind route, the recorder on, its records dropped) to the fake streaming
upstream in its own process (5 tokens an answer), one after another, each on a fresh connection
(`--keep-alive`: all on one kept connection), after a warm-up. The proxy's work for a request
lands in the window: it stays open until every record has been made. Prints calls a request, and
the functions with the most calls of their own plus the C calls they made. `--src` runs the same
on other source trees (a `git worktree` of an earlier commit), each in its own process.
Profiling makes each call slower; the counts are what this gives, not the times.
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
WARM_UP = 10


def _request(port: int, keep_alive: bool) -> bytes:
    close = "" if keep_alive else "Connection: close\r\n"
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(BODY)}\r\n{close}\r\n"
    )
    return head.encode() + BODY


def _one(sock: socket.socket, port: int, keep_alive: bool) -> None:
    """One streamed request; returns once its last chunk (the chunked body's end) is read."""
    sock.sendall(_request(port, keep_alive))
    seen = b""
    while not seen.endswith(b"0\r\n\r\n"):
        data = sock.recv(65536)
        if not data:
            break
        seen = seen[-8:] + data
    if b"0\r\n\r\n" not in seen:
        raise RuntimeError("the answer ended before its last chunk")


def _on_loop(loop: Any, profile: Any) -> None:
    """`sys.setprofile(profile)` on the proxy's loop thread, returning once it is set."""
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (sys.setprofile(profile), done.set()))
    done.wait(5)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    name = code.co_filename
    for marker in ("/trayapp/", "/python3."):
        if marker in name:
            name = name[name.index(marker) + 1 :]
            break
    return f"{name}:{code.co_firstlineno}:{code.co_name}"


def _count(src: str, requests: int, keep_alive: bool, callers_of: str = "") -> dict[str, Any]:
    sys.path.insert(0, src)
    from trayapp.services.proxy.route import Route
    from trayapp.services.proxy.runner import ProxyThread

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from proxy_overhead import fake_upstream

    python_calls: collections.Counter[str] = collections.Counter()
    c_calls: collections.Counter[str] = collections.Counter()  # by the Python function that made them
    callers: collections.Counter[str] = collections.Counter()  # of the functions named by `callers_of`
    records: list[object] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            where = _where(frame)
            python_calls[where] += 1
            if callers_of and callers_of in where and frame.f_back is not None:
                callers[f"{_where(frame.f_back)} -> {where}"] += 1
        elif event == "c_call":
            c_calls[_where(frame)] += 1

    with tempfile.TemporaryDirectory() as logs, fake_upstream(Path(logs), 5, 0.0, 0.0) as upstream_url:
        route = Route("127.0.0.1", 0, upstream_url, "vllm")
        proxy = ProxyThread([route], lambda route, record: records.append(record))
        port = int(proxy.start()[0].rsplit(":", 1)[1])
        loop = proxy._loop
        try:
            kept = socket.create_connection(("127.0.0.1", port)) if keep_alive else None
            for phase, count in (("warm-up", WARM_UP), ("counted", requests)):
                before = len(records)
                _on_loop(loop, profile)
                if phase == "warm-up":
                    loop.call_soon_threadsafe(sys.setprofile, None)
                for _ in range(count):
                    if kept is not None:
                        _one(kept, port, True)
                    else:
                        with socket.create_connection(("127.0.0.1", port)) as sock:
                            _one(sock, port, False)
                deadline = time.monotonic() + 10
                while len(records) < before + count and time.monotonic() < deadline:
                    time.sleep(0.01)  # the records come a little after the answers, on the loop
                time.sleep(0.6)  # a client named later than its record (the naming's own timers)
                _on_loop(loop, None)
                if len(records) < before + count:
                    raise RuntimeError(f"{phase}: {len(records) - before} records for {count} requests")
            if kept is not None:
                kept.close()
        finally:
            proxy.stop()
    functions = collections.Counter({k: python_calls[k] + c_calls[k] for k in python_calls | c_calls})
    return {
        "python": sum(python_calls.values()) / requests,
        "c": sum(c_calls.values()) / requests,
        "functions": {k: v / requests for k, v in functions.most_common()},
        "callers": {k: v / requests for k, v in callers.most_common()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--keep-alive", action="store_true", help="every request on one kept connection")
    p.add_argument("--top", type=int, default=25, help="functions listed a tree")
    p.add_argument("--callers", default="", help="also list who calls the functions whose name has this")
    p.add_argument("--src", action="append", default=[], help="another source tree to run beside this one")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a tree's own process
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(_count(a.one, a.requests, a.keep_alive, a.callers)))
        return 0
    trees = [str(Path(__file__).resolve().parents[1]), *a.src]
    how = "one kept connection" if a.keep_alive else "a fresh connection each"
    print(f"the proxy loop's calls a request ({a.requests} streamed requests of 5 tokens, {how}):")
    for tree in trees:
        run = [sys.executable, __file__, "--one", tree, "--requests", str(a.requests)]
        run += ["--keep-alive"] if a.keep_alive else []
        run += ["--callers", a.callers] if a.callers else []
        out = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
        print(f"\n  {tree}: {out['python']:.1f} Python calls + {out['c']:.1f} C calls a request")
        for name, calls in list(out["functions"].items())[: a.top]:
            print(f"    {calls:7.1f}  {name}")
        for name, calls in out["callers"].items():
            print(f"    {calls:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
