"""How long the proxy's pass over /proc takes to find a client process it has never seen (Linux).

    python bench/client_lookup.py [--processes 200] [--fds 40] [--rounds 15] [--src DIR]

A desktop runs hundreds of processes holding thousands of descriptors; the proxy names a client
(issue #22) by the process holding its socket, and a client never seen before (a script, a `curl`)
is found by reading processes' descriptors, one readlink each, on a worker thread that holds the
GIL in turns with the proxy's event loop. This starts `--processes` idle processes holding `--fds`
descriptors each (the desktop), then for each round a new client process connected to a listener
here, and times `sources/socket_owners._holders` finding it: as the proxy reads /proc now (newest
processes first) and, in the same round, oldest first (as it did until the sixteenth pass of #26);
the median of each and the processes read. Nothing here is a test: the figure depends on the host.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

_IDLE = (
    "import os, sys; fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]; "
    "sys.stdin.read()"
)
_CLIENT = (
    "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
    "print(s.getsockname()[1], flush=True); sys.stdin.read()"
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=200)
    p.add_argument("--fds", type=int, default=40)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--src", default=str(Path(__file__).resolve().parent.parent), help="llm-tray tree to run")
    a = p.parse_args()
    if not sys.platform.startswith("linux"):
        print("Linux only (/proc)")
        return 1
    sys.path.insert(0, a.src)
    from trayapp.sources import socket_owners

    desktop = [
        subprocess.Popen([sys.executable, "-c", _IDLE, str(a.fds)], stdin=subprocess.PIPE)
        for _ in range(a.processes)
    ]
    timings: dict[str, list[float]] = {"newest first (now)": [], "oldest first (before)": []}
    reads: dict[str, list[int]] = {name: [] for name in timings}
    real_order, real_among = socket_owners.newest_first, socket_owners._sockets_among
    try:
        time.sleep(1.0)  # the idle processes have opened their descriptors
        entries = len(os.listdir("/proc"))
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            for _ in range(a.rounds):
                client = subprocess.Popen(
                    [sys.executable, "-c", _CLIENT, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                try:
                    assert client.stdout is not None
                    peer = ("127.0.0.1", int(client.stdout.readline()))
                    served, _ = listener.accept()
                    with served:
                        (inode,) = socket_owners.inodes_of([(peer, ("127.0.0.1", port))])
                        assert inode, "sock_diag refused here"
                        for name in timings:
                            read: list[int] = []

                            def counted(
                                pid: int, fds: list[str], wanted: set[int], read: list[int] = read
                            ) -> list[int]:
                                read.append(pid)
                                return real_among(pid, fds, wanted)

                            socket_owners._sockets_among = counted  # type: ignore[assignment]
                            if name.startswith("oldest"):
                                socket_owners.newest_first = lambda pids, last_pid: sorted(pids)  # type: ignore[assignment]
                            started = time.perf_counter()
                            found = socket_owners._holders({inode}, [])
                            timings[name].append((time.perf_counter() - started) * 1e3)
                            socket_owners.newest_first, socket_owners._sockets_among = real_order, real_among
                            reads[name].append(len(read))
                            assert found == {inode: client.pid}, found
                finally:
                    assert client.stdin is not None
                    client.stdin.close()
                    client.wait(10)
    finally:
        for proc in desktop:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in desktop:
            proc.wait(10)
    print(f"{entries} entries in /proc, {a.processes} of them idle processes of {a.fds} descriptors each")
    for name, values in timings.items():
        print(
            f"  {name:22} median {statistics.median(values):7.2f} ms  "
            f"(min {min(values):.2f}, max {max(values):.2f}); processes read: median "
            f"{statistics.median(reads[name]):.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
