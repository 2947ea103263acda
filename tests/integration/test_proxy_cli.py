"""`llm-tray proxy` as a user runs it, in front of the real llama-server (issue #12).

Canary prompts go through the proxy, streamed and not; the proxy prints one record per request,
its monitor stores them, and `export` returns the server's own timings for each. No canary text —
prompt or completion — may appear in the proxy's output, any file under LLM_TRAY_HOME, any
export format or the HTML report.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import trayapp
from tests.support.cli import WatchToFile, run_cli, wait_for
from tests.support.llama import LlamaServer

pytestmark = pytest.mark.llamacpp

RAM_GBPS = "50"  # given: no RAM benchmark in this test
PROSE = {
    "prompt": "Describe a harbour at dawn in three sentences.",
    "n_predict": 32,
    "ignore_eos": True,
    "temperature": 0,
    "seed": 7,
}


def _through(proxy_url: str, body: dict[str, Any], stream: bool) -> tuple[dict[str, Any], str]:
    """One /completion through the proxy → (the server's timings, the generated text)."""
    with httpx.Client(trust_env=False, timeout=120) as client:
        if not stream:
            result = client.post(proxy_url + "/completion", json=body).json()
            return result["timings"], result["content"]
        text, last = "", {}
        with client.stream("POST", proxy_url + "/completion", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    text += last.get("content", "")
        return last["timings"], text


def test_proxy_records_exact_requests_to_the_store_and_leaks_no_text(
    llama_server: LlamaServer, tmp_path: Path, _tray_home: Path
) -> None:
    canary = uuid.uuid4().hex
    body = {"prompt": f"CANARY-{canary} Write a line about boats.", "n_predict": 32, "ignore_eos": True}
    proxy = WatchToFile(
        tmp_path,
        "--listen", "127.0.0.1:0", "--upstream", f"llamacpp={llama_server.url}",
        "--ram-bandwidth-gbps", RAM_GBPS,
        command="proxy",
    )  # fmt: skip
    try:
        listening = proxy.wait_line(lambda line: line["event"] == "listening", 60, "the listening line")
        assert listening["upstream"] == llama_server.url and listening["listen"].startswith(
            "http://127.0.0.1:"
        )
        installed_loop = "asyncio" if importlib.util.find_spec("uvloop") is None else "uvloop"
        assert listening["event_loop"] == installed_loop  # said, and uvloop's where installed
        runs = [_through(listening["listen"], body, stream) for stream in (False, True)]
        # Sampled text may hold no phrase to search for (it once echoed the canary and a numbered
        # list): a greedy prose request too, whose text is the same on every run of this build.
        runs.append(_through(listening["listen"], PROSE, True))
        wait_for(lambda: sum(line["event"] == "request" for line in proxy.lines()) >= 3, 30, "three records")
    finally:
        assert proxy.stop() == 0, proxy.err_path.read_text()
    records = [line for line in proxy.lines() if line["event"] == "request"]
    assert len(records) == 3
    for record, (timings, _text) in zip(records, runs, strict=True):
        assert record["source"] == "proxy" and record["http_status"] == 200
        assert record["decode_tokens"] == timings["predicted_n"] == 32
        assert record["decode_tok_s"] == pytest.approx(timings["predicted_per_second"])
        assert record["cached_tokens"] == timings["cache_n"]

    exported = run_cli("export", "--table", "requests", "--format", "jsonl")
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    proxied = [row for row in rows if row["source"] == "proxy"]
    assert len(proxied) == 3, rows
    for row, (timings, _text) in zip(proxied, runs, strict=True):
        assert row["decode_tok_s"] == pytest.approx(timings["predicted_per_second"])
        assert row["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
        assert row["endpoint"] == "/completion" and row["exact"] in (1, True)
    samples = run_cli("export", "--table", "samples", "--format", "jsonl").stdout.splitlines()
    sampled_models = {json.loads(line)["model"] for line in samples if line.strip()}
    assert {row["model"] for row in proxied} <= sampled_models  # the model as the monitor names it

    # The canary: the prompt's uuid and what the model generated, nowhere. The generated text is
    # searched as runs of three consecutive words (a single common word could be static text of the
    # report; a run that also occurs in llm-tray's own source is no evidence either).
    own_text = "\n".join(p.read_text() for p in Path(trayapp.__file__).parent.rglob("*.py")).lower()
    generated = set()
    for _timings, text in runs:
        words = text.split()
        for i in range(len(words) - 2):
            phrase = " ".join(words[i : i + 3])
            if len(phrase) >= 12 and phrase.lower() not in own_text:
                generated.add(phrase)
            word = words[i].strip(".,;:!?\"'()*")
            if len(word) >= 7 and word.isalpha() and word.lower() not in own_text:
                generated.add(word)  # a rarer word alone, too: a token-by-token leak holds no phrase
    needles = [canary.encode(), *(needle.encode() for needle in generated)]
    outputs = {"proxy stdout": proxy.out_path.read_bytes(), "proxy stderr": proxy.err_path.read_bytes()}
    for fmt in ("csv", "jsonl"):
        for table in ("requests", "samples", "sessions"):
            result = run_cli("export", "--table", table, "--format", fmt)
            outputs[f"export {table} {fmt}"] = result.stdout.encode()
    report = run_cli("report", "-o", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    outputs["report"] = (tmp_path / "report.html").read_bytes()
    for path in _tray_home.rglob("*"):
        if path.is_file():
            outputs[str(path)] = path.read_bytes()
    leaks = [(where, needle) for where, data in outputs.items() for needle in needles if needle in data]
    assert not leaks, f"text leaked: {leaks[:5]}"
    assert generated, f"the model generated no phrase to look for: {[text for _t, text in runs]}"
