"""Capture raw response bodies from the real llama-server for the proxy recorder's fixtures (#12).

Run: `.venv/bin/python -m tests.support.capture_streams [OUT_DIR]`
(default tests/fixtures/proxy/llama-server).
Each body is saved byte for byte as it came off the socket (transfer-decoded only, never content-decoded);
`captures.json` lists, per file, the request (method, path, body), the status and the response content-type.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.llama import LlamaServer

PROMPT = (
    "You are a careful assistant. List three colours of the rainbow, one per line, "
    "and say nothing else. The colours are:"
)
MESSAGES = [{"role": "user", "content": PROMPT}]
COMMON: dict[str, Any] = {"temperature": 0, "seed": 42}

# (file name, path, request body); run in this order on one fresh single-slot server.
CAPTURES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "chat_stream_usage.sse",
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}},
    ),
    (
        "chat_stream_usage_cached.sse",
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}},
    ),
    (
        "chat_stream_no_usage.sse",
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 12, "stream": True},
    ),
    ("chat_nonstream.json", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12}),
    ("completion_stream.sse", "/completion", {"prompt": PROMPT, "n_predict": 12, "stream": True}),
    (
        "completion_stream_progress.sse",
        "/completion",
        {"prompt": PROMPT + " red,", "n_predict": 12, "stream": True, "return_progress": True},
    ),
    ("completion_nonstream.json", "/completion", {"prompt": PROMPT, "n_predict": 12, "stream": False}),
    ("v1_completions_stream.sse", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "stream": True}),
    ("v1_completions_nonstream.json", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12}),
    ("responses_stream.sse", "/v1/responses", {"input": PROMPT, "max_output_tokens": 12, "stream": True}),
    ("responses_nonstream.json", "/v1/responses", {"input": PROMPT, "max_output_tokens": 12}),
]


def capture(out_dir: Path) -> None:
    """Start one llama-server, send every request in CAPTURES, save the raw bodies and the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: list[dict[str, Any]] = []
    with LlamaServer() as server, httpx.Client(timeout=httpx.Timeout(120.0)) as client:
        for name, path, body in CAPTURES:
            request = {**COMMON, **body}
            pieces: list[bytes] = []
            with client.stream("POST", server.url + path, json=request) as response:
                pieces.extend(response.iter_raw())
                status = response.status_code
                content_type = response.headers.get("content-type", "")
                encoding = response.headers.get("content-encoding")
            (out_dir / name).write_bytes(b"".join(pieces))
            manifest.append(
                {
                    "file": name,
                    "method": "POST",
                    "path": path,
                    "request": request,
                    "status": status,
                    "content_type": content_type,
                    "content_encoding": encoding,
                    "reads": len(pieces),
                }
            )
            print(f"{name}: {status} {content_type} {sum(map(len, pieces))} bytes in {len(pieces)} reads")
    (out_dir / "captures.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[1] / "fixtures" / "proxy" / "llama-server"
    capture(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
