"""What the recording proxy adds for curl: a fresh connection per request, its request written the
moment it connects (as curl, shell scripts and most CLIs do; `bench/proxy_overhead.py`'s own asyncio
client writes a few hundred microseconds after its connect, which hides the proxy's upstream connect).

    python bench/proxy_curl.py [--rounds 60] [--gap-s 0.3] [--proxy NAME=SRC …] [--asyncio] [--relay]
        [--json]

Against the fake vLLM-style upstream of bench/proxy_overhead.py (its own process, 5 tokens, 20 ms
prefill), variants in rotating order each round (direct, then each hop, the order reversed every
other round) with `--gap-s` between requests: direct; ours (`llm-tray proxy --no-record` from this
tree, on uvloop where installed); the same on asyncio's loop (`--asyncio`); more trees with `--proxy
NAME=SRC` (a `git archive` of another commit); the Python relay (`--relay`). Per variant: curl's
`time_starttransfer` (connect to the answer's first byte: the request path through the hop, the fake
answering its head at once) median, and what the hop adds to direct, paired per round (median over
rounds). Needs `curl` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import REPO, fake_upstream, our_proxy, relay_proxy

MESSAGES = [{"role": "user", "content": "hi"}]
BODY = json.dumps({"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 5})


def curl_ttfb_ms(url: str) -> float:
    """curl's time from its start to the answer's first byte, in ms (a fresh connection)."""
    command = ["curl", "-sS", "-o", "/dev/null", "-w", "%{time_starttransfer}", "--max-time", "10"]
    command += ["-H", "Content-Type: application/json", "-d", BODY, url + "/v1/chat/completions"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
    return float(done.stdout) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--gap-s", type=float, default=0.3, help="pause after each request")
    p.add_argument("--proxy", action="append", default=[], metavar="NAME=SRC", help="another source tree")
    p.add_argument("--asyncio", action="store_true", help="add ours on asyncio's event loop")
    p.add_argument("--relay", action="store_true", help="add the Python relay (the floor of a Python hop)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if shutil.which("curl") is None:
        p.error("curl is not on PATH")
    log_dir = Path(tempfile.mkdtemp(prefix="proxy-curl-"))
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(fake_upstream(log_dir, 5, 0.01, 0.02))
        variants = {"direct": upstream}
        trees = [("ours", REPO)] + [(n, Path(s)) for n, s in (x.split("=", 1) for x in a.proxy)]
        for name, src in trees:
            (log_dir / name).mkdir()
            hop = stack.enter_context(our_proxy(log_dir / name, "openai=" + upstream, src))
            variants[name] = f"http://127.0.0.1:{hop.port}"
        if a.asyncio:
            (log_dir / "asyncio").mkdir()
            on_asyncio = our_proxy(log_dir / "asyncio", "openai=" + upstream, REPO, loop="asyncio")
            hop = stack.enter_context(on_asyncio)
            variants["asyncio"] = f"http://127.0.0.1:{hop.port}"
        if a.relay:
            variants["relay"] = f"http://127.0.0.1:{stack.enter_context(relay_proxy(log_dir, upstream)).port}"
        for url in variants.values():  # one untimed request each: imports, first connections
            curl_ttfb_ms(url)
        ttfb_ms: dict[str, list[float]] = {name: [] for name in variants}
        added_ms: dict[str, list[float]] = {name: [] for name in variants if name != "direct"}
        names = list(variants)
        for round_index in range(a.rounds):
            order = names if round_index % 2 == 0 else names[:1] + names[:0:-1]
            got = {}
            for name in order:
                got[name] = curl_ttfb_ms(variants[name])
                time.sleep(a.gap_s)
            for name, value in got.items():
                ttfb_ms[name].append(value)
                if name != "direct":
                    added_ms[name].append(value - got["direct"])
    result = {
        name: {
            "ttfb_median_ms": round(statistics.median(values), 3),
            "added_median_ms": round(statistics.median(added_ms[name]), 3) if name in added_ms else None,
        }
        for name, values in ttfb_ms.items()
    }
    if a.json:
        print(json.dumps({"rounds": a.rounds, "gap_s": a.gap_s, "variants": result}, indent=2))
    else:
        print(f"curl, a fresh connection per request, {a.rounds} rounds, {a.gap_s:g} s apart")
        print(f"(logs: {log_dir})")
        print("| variant | TTFB median ms | added median ms |\n|---|---|---|")
        for name, row in result.items():
            added = "—" if row["added_median_ms"] is None else f"{row['added_median_ms']:+.3f}"
            print(f"| {name} | {row['ttfb_median_ms']:.3f} | {added} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
