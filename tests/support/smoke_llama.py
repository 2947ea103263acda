"""Provisioning's last check: the installed llama-server is portable and really generates.

Run as `python -m tests.support.smoke_llama`. It starts the real server on the real test model,
reads the CPU features the build uses from its `system_info` line (AVX-512 and AMX must be off, so
the binary runs on every x86-64 host of this kind), asks for a few tokens, and exits non-zero with
what broke and how to rebuild.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from tests.support.llama import LlamaServer, generate, llama_server_binary, test_model_path

REBUILD_HINT = (
    "rebuild the portable wheel: delete the folder that tests/build_llama.sh prints, "
    "then run tests/provision.sh again"
)
FORBIDDEN_FEATURES = ("AVX512", "AMX")  # compiled in, these die with SIGILL on hosts without them
SMOKE_TOKENS = 4


def enabled_cpu_features(system_info_line: str) -> set[str]:
    """Features a `system_info:` line reports as on (`AVX2 = 1`), e.g. {"AVX2", "FMA"}."""
    pairs = re.findall(r"([A-Z][A-Z0-9_]*) = (\d+)", system_info_line)
    return {name for name, value in pairs if value != "0"}


def system_info_line(log_text: str) -> str:
    for line in log_text.splitlines():
        if "system_info:" in line:
            return line
    return ""


def main() -> int:
    binary = llama_server_binary()
    if binary is None:
        print(f"smoke: llama-server is not installed; {REBUILD_HINT}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="llama-smoke-") as log_dir:
        # `-lv 4`: the `system_info` line with the CPU features is logged only at debug verbosity.
        server = LlamaServer(
            test_model_path(), binary=binary, log_dir=Path(log_dir), ctx_size=512, extra_args=["-lv", "4"]
        )
        try:
            with server:
                reply = generate(server.url, "The capital of France is", SMOKE_TOKENS, timeout_s=60)
                info = system_info_line(server.log_tail(200_000))
        except Exception as exc:  # report whatever broke, with the server's own last words
            print(f"smoke: llama-server failed: {exc}\n{server.log_tail()}\n{REBUILD_HINT}", file=sys.stderr)
            return 1
    features = enabled_cpu_features(info)
    bad = sorted(f for f in features if f.startswith(FORBIDDEN_FEATURES))
    if not info or bad:
        print(
            f"smoke: the build is not portable ({', '.join(bad) or 'no system_info line'});"
            f" {REBUILD_HINT}\n{info}",
            file=sys.stderr,
        )
        return 1
    predicted = int(reply.get("timings", {}).get("predicted_n", 0))
    if predicted < 1:
        print(f"smoke: llama-server answered but generated nothing: {reply}", file=sys.stderr)
        return 1
    print(f"provision: llama-server {binary} generated {predicted} tokens; CPU features {sorted(features)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
