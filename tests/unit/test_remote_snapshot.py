"""core/remote_snapshot.py: a remote agent's snapshot document back into core types (#15).

The document is written here by hand (shaped as docs/json.md shows it); every expected value is
read off it, not computed by the code under test.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from tests.support import snapshots as s
from trayapp.core.hardware_readings import RamBandwidthChange
from trayapp.core.jsonview import snapshot_json
from trayapp.core.model import Alert, PrefillProgress, RemoteMachine, ServerStatus, Snapshot
from trayapp.core.peers import PeerBand
from trayapp.core.remote_snapshot import RemoteDocError, remote_url, snapshot_from_json, tag_remote

DOC: dict[str, Any] = {
    "schema": 1,
    "t": 1796030210.366,
    "servers": [
        {
            "kind": "llamacpp",
            "url": "http://127.0.0.1:8080",
            "status": "ok",
            "reason": None,
            "version": "b6700-abc123",
            "age_s": None,
            "models": [
                {
                    "name": "gemma-3-270m-q4_k_m.gguf",
                    "size_bytes": None,
                    "weights_bytes": 246587904,
                    "vram_bytes": None,
                    "gpu_fraction": 0.75,
                    "gpu_fraction_source": "nvml",
                    "context_length": 8192,
                    "context_tokens": 1234,
                    "quantization": "Q4_K_M",
                    "parameter_count": 268098176,
                    "bytes_per_token": 246587904,
                    "bytes_per_token_exact": True,
                    "ceiling_tok_s": 118.3,
                    "full_gpu_ceiling_tok_s": 130.5,
                    "decode_tok_s": 51.2,
                    "decode_total_tok_s": 102.4,
                    "active_streams": 2,
                    "decode_exact": False,
                    "last_decode_tok_s": 50.9,
                    "prompt_tok_s": 310.0,
                    "prompt_exact": False,
                    "ttft_s": 0.21,
                    "ttft_exact": False,
                    "draft_acceptance": None,
                    "spec_type": None,
                    "spec_speedup": None,
                    "prefill_tokens_total": None,
                    "prefill_tokens_done": 512,
                    "prefill_cached_tokens": 256,
                    "prefill_tok_s": 400.0,
                    "prefill_eta_s": None,
                    "phase": "decoding",
                    "session_id": "20261130-091653-ab12cd",
                    "live_rate_reason": None,
                }
            ],
        },
        {
            "kind": "ollama",
            "url": "http://10.0.0.7:11434",
            "status": "unreachable",
            "reason": "connection refused",
            "version": None,
            "age_s": 4.0,
            "models": [],
        },
    ],
    "hardware": {
        "gpus": [
            {
                "name": "NVIDIA GeForce RTX 4090",
                "vendor": "nvidia",
                "vram_total_bytes": 25757220864,
                "vram_used_bytes": 1073741824,
                "bandwidth_gbps": 1008.1,
                "bandwidth_source": "nvml",
                "unified_memory": False,
                "util_gpu_pct": 97,
                "temperature_c": 71,
                "power_w": 350.2,
                "throttle_reasons": ["power cap"],
            }
        ],
        "gpu_reason": None,
        "ram_total_bytes": 25276502016,
        "ram_available_bytes": 24532684800,
        "ram_bandwidth_gbps": 54.0,
        "ram_bandwidth_source": "measured",
        "ram_bandwidth_measured_at": "1970-01-02T00:00:00Z",  # 86 400 s
        "ram_bandwidth_confidence": "quiet",
        "ram_bandwidth_change": {
            "previous_gbps": 48.2,
            "gbps": 54.0,
            "at": "1970-01-02T00:00:00Z",
            "reason": "first quiet measurement",
        },
        "cpu_percent": 12.5,
    },
    "alerts": [
        {
            "id": "offload-3f2a9c1d8e7b",
            "kind": "offload",
            "severity": "critical",
            "server": "http://127.0.0.1:8080",
            "model": "gemma-3-270m-q4_k_m.gguf",
            "message": "gemma is 25 % on the CPU",
            "fix": "Fix: a smaller context",
            "cause": None,
            "since": "1970-01-01T00:01:40.500000Z",  # 100.5 s
            "ended": None,
            "evidence": {"cpu_share": 0.25},
        }
    ],
}


def test_every_field_of_the_document_lands_where_it_belongs() -> None:
    doc = snapshot_from_json(copy.deepcopy(DOC))
    assert doc.t_wall_s == 1796030210.366
    llama, ollama = doc.servers
    assert (llama.kind, llama.url, llama.status, llama.version) == (
        "llamacpp",
        "http://127.0.0.1:8080",
        "ok",
        "b6700-abc123",
    )
    assert llama.machine is None and llama.age_s is None
    (model,) = llama.models
    assert model.name == "gemma-3-270m-q4_k_m.gguf" and model.phase == "decoding"
    assert (model.weights_bytes, model.context_length, model.context_tokens) == (246587904, 8192, 1234)
    assert (model.gpu_fraction, model.gpu_fraction_source) == (0.75, "nvml")
    assert (model.ceiling_tok_s, model.full_gpu_ceiling_tok_s) == (118.3, 130.5)
    assert (model.decode_tok_s, model.decode_total_tok_s, model.active_streams) == (51.2, 102.4, 2)
    assert model.decode_exact is False and model.ttft_exact is False and model.bytes_per_token_exact is True
    assert model.prompt_exact is False
    assert (model.prompt_tok_s, model.ttft_s, model.last_decode_tok_s) == (310.0, 0.21, 50.9)
    assert model.prefill == PrefillProgress(
        tokens_done=512, cached_tokens=256, tokens_total=None, tok_s=400.0
    )
    assert model.efficiency == pytest.approx(51.2 / 118.3)
    assert model.session_id == "20261130-091653-ab12cd" and model.quantization == "Q4_K_M"
    assert (ollama.status, ollama.reason, ollama.age_s, ollama.models) == (
        "unreachable",
        "connection refused",
        4.0,
        (),
    )

    (gpu,) = doc.hardware.gpus
    assert (gpu.index, gpu.name, gpu.vendor, gpu.bandwidth_source) == (
        0,
        "NVIDIA GeForce RTX 4090",
        "nvidia",
        "nvml",
    )
    assert (gpu.vram_total_bytes, gpu.vram_used_bytes, gpu.bandwidth_gbps) == (
        25757220864,
        1073741824,
        1008.1,
    )
    assert (gpu.util_gpu_pct, gpu.temperature_c, gpu.power_w) == (97.0, 71.0, 350.2)
    assert gpu.throttle_reasons == ("power cap",)
    host = doc.hardware.host
    assert (host.ram_total_bytes, host.ram_available_bytes, host.cpu_percent) == (
        25276502016,
        24532684800,
        12.5,
    )
    assert (host.ram_bandwidth_gbps, host.ram_bandwidth_source) == (54.0, "measured")
    assert host.ram_bandwidth_measured_wall_s == 86400.0 and host.ram_bandwidth_confidence == "quiet"
    assert host.ram_bandwidth_change == RamBandwidthChange(48.2, 54.0, 86400.0, "first quiet measurement")

    (alert,) = doc.alerts
    assert (alert.id, alert.kind, alert.severity) == ("offload-3f2a9c1d8e7b", "offload", "critical")
    assert alert.since_wall_s == 100.5 and alert.ended_wall_s is None
    assert alert.evidence == {"cpu_share": 0.25} and alert.fix == "Fix: a smaller context"
    assert alert.fix_commands == ()  # DOC's fix is the plain string of an agent before #20


def test_the_fix_is_read_in_both_forms() -> None:
    """#20: `fix` is `{"text", "commands"}`; an older agent sends the text alone."""
    doc = copy.deepcopy(DOC)
    doc["alerts"][0]["fix"] = {
        "text": "Lower the context to 4k tokens.",
        "commands": ["llama-server -c 4096"],
    }
    (alert,) = snapshot_from_json(doc).alerts
    assert (alert.fix, alert.fix_commands) == ("Lower the context to 4k tokens.", ("llama-server -c 4096",))
    doc["alerts"][0]["fix"] = {"text": "Check the server.", "commands": []}
    (alert,) = snapshot_from_json(doc).alerts
    assert (alert.fix, alert.fix_commands) == ("Check the server.", ())
    doc["alerts"][0]["fix"] = None
    (alert,) = snapshot_from_json(doc).alerts
    assert (alert.fix, alert.fix_commands) == ("", ())


def test_tagging_names_the_machine_and_keeps_ids_apart() -> None:
    servers, alerts = tag_remote(snapshot_from_json(copy.deepcopy(DOC)), "gpu-box")
    assert [s.url for s in servers] == ["http://gpu-box:8080", "http://10.0.0.7:11434"]
    assert {s.machine for s in servers} == {"gpu-box"}
    (alert,) = alerts
    assert (alert.id, alert.server, alert.machine) == (
        "gpu-box/offload-3f2a9c1d8e7b",
        "http://gpu-box:8080",
        "gpu-box",
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8080", "http://box:8080"),
        ("http://localhost:11434", "http://box:11434"),
        ("http://[::1]:1234", "http://box:1234"),
        ("http://0.0.0.0:8000/v1", "http://box:8000/v1"),
        ("http://192.168.1.5:8000", "http://192.168.1.5:8000"),
        ("https://api.example.com", "https://api.example.com"),
    ],
)
def test_remote_url(url: str, expected: str) -> None:
    assert remote_url(url, "box") == expected


def test_a_snapshot_survives_the_round_trip_through_its_document() -> None:
    alert = Alert(
        id="kv_slowdown-1",
        kind="kv_slowdown",
        severity="warning",
        server=s.LLAMA,
        model="llama3.1:8b",
        message="slower with a deep context",
        fix="Fix: start a new chat",
        since_wall_s=s.T0 + 1.25,
        evidence={"drop_pct": 31.0},
        fix_commands=("llama-server -fa on -ctk q8_0 -ctv q8_0",),
    )
    snap: Snapshot = s.snap(s.T0, s.server(s.model("llama3.1:8b", "decoding", 42.0)), alerts=(alert,))
    doc = snapshot_from_json(json.loads(json.dumps(snapshot_json(snap))))
    assert doc.alerts == (alert,)
    assert doc.hardware == snap.hardware
    (server,) = doc.servers
    original: ServerStatus = snap.servers[0]
    assert (server.kind, server.url, server.status, server.version) == (
        original.kind,
        original.url,
        original.status,
        original.version,
    )
    assert server.models[0].decode_tok_s == 42.0 and server.models[0].phase == "decoding"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema=2), "schema 2"),
        (lambda d: d.pop("t"), "t: missing"),
        (lambda d: d["servers"][0].update(status="asleep"), "status: 'asleep'"),
        (lambda d: d["servers"][0]["models"][0].update(decode_tok_s="fast"), "decode_tok_s"),
        (lambda d: d["servers"][0]["models"][0].update(active_streams=True), "active_streams"),
        (lambda d: d["alerts"][0].update(since="yesterday"), "yesterday"),
        (lambda d: d.update(hardware=[]), "hardware: expected an object"),
        (lambda d: d["alerts"][0].update(fix=5), "fix: expected an object"),
        (
            lambda d: d["alerts"][0].update(fix={"text": "t", "commands": "-c 4096"}),
            "commands: expected a list",
        ),
        (lambda d: d["alerts"][0].update(fix={"text": "t", "commands": [4096]}), "list of strings"),
    ],
)
def test_a_broken_document_is_refused_with_what_is_wrong(change: Any, message: str) -> None:
    doc = copy.deepcopy(DOC)
    change(doc)
    with pytest.raises(RemoteDocError, match=message.replace("(", r"\(")):
        snapshot_from_json(doc)
    with pytest.raises(RemoteDocError):
        snapshot_from_json([1, 2])


def test_the_text_view_names_each_machine() -> None:
    from dataclasses import replace

    from trayapp.core.text import format_snapshot, format_watch_line

    servers, alerts = tag_remote(snapshot_from_json(copy.deepcopy(DOC)), "gpu-box")
    box = RemoteMachine("gpu-box", "http://gpu-box:9465", "ok", hardware=snapshot_from_json(DOC).hardware)
    gone = RemoteMachine("rack-2", "http://rack-2:9465", "unauthorized", "wrong token (401)")
    snap = replace(s.snap(1.0, *servers, alerts=alerts), machines=(box, gone))
    text = format_snapshot(snap).splitlines()
    assert text[0] == "[gpu-box] llamacpp b6700-abc123 http://gpu-box:8080 — ok"
    assert "[gpu-box] GPU 0: NVIDIA GeForce RTX 4090 · 1.1 GB/25.8 GB · 1008 GB/s" in text
    # The agent's ceiling change reaches the text (1970-01-02 00:00 UTC; `snap` is at t = 1 s).
    changed = "ceiling changed 48.2 → 54.0 GB/s RAM at 1970-01-02 00:00 UTC: first quiet measurement"
    assert f"[gpu-box] {changed}" in text
    assert "[rack-2] unauthorized — wrong token (401) (http://rack-2:9465)" in text
    assert "⚠ [gpu-box] [critical] gemma is 25 % on the CPU" in text
    line = format_watch_line(snap)
    assert "gpu-box: gemma-3-270m-q4_k_m.gguf decoding ~51 tok/s" in line and "rack-2 unauthorized" in line


def test_the_machine_fields_are_documented() -> None:
    import re

    from tests.support.paths import TESTS_DIR
    from trayapp.core.jsonview import alert_json, machine_json, server_json

    text = (TESTS_DIR.parent / "docs" / "json.md").read_text(encoding="utf-8")
    documented = set(re.findall(r'^\s*"([a-z_]+)":', text, flags=re.M))
    written = (
        set(server_json(s.server()))
        | set(alert_json(s.alert()))
        | set(machine_json(RemoteMachine("box", "http://box:9465", "ok", hardware=s.HW, t_wall_s=s.T0)))
        | {"machines"}
    )
    assert written - documented == set()
    box = RemoteMachine("box", "http://box:9465", "ok", hardware=s.HW, t_wall_s=s.T0)
    assert "machines" not in snapshot_json(s.snap(1.0))  # a single machine's document is unchanged
    (entry,) = snapshot_json(replace_machines(s.snap(1.0), box))["machines"]
    assert (entry["name"], entry["status"], entry["t"]) == ("box", "ok", s.T0)
    assert entry["hardware"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"


def replace_machines(snap: Snapshot, *machines: RemoteMachine) -> Snapshot:
    from dataclasses import replace

    return replace(snap, machines=machines)


def test_gpu_memory_holders_survive_the_round_trip() -> None:
    """#21: per-process GPU memory in `hardware.gpus[].processes`, a size NVML does not report as null
    (never 0), another user's process by that name; Apple's RAM users and memory pressure."""
    from dataclasses import replace

    from trayapp.core.hardware_readings import GpuProcess
    from trayapp.core.vram_holders import OTHER_USER

    holders = (GpuProcess(4121, "python", 5_800_000_000), GpuProcess(77, OTHER_USER, None))
    (gpu,) = s.HW.gpus
    hw = replace(s.HW, gpus=(replace(gpu, processes=holders),))
    snap = replace(s.snap(s.T0), hardware=hw)
    written = json.loads(json.dumps(snapshot_json(snap)))
    assert written["hardware"]["gpus"][0]["processes"] == [
        {"pid": 4121, "name": "python", "used_bytes": 5_800_000_000},
        {"pid": 77, "name": "another user's process", "used_bytes": None},
    ]
    assert snapshot_from_json(written).hardware == hw
    apple = replace(
        gpu, processes=holders[:1], processes_rss=True, memory_pressure="warning", unified_memory=True
    )
    snap = replace(s.snap(s.T0), hardware=replace(s.HW, gpus=(apple,)))
    assert snapshot_from_json(json.loads(json.dumps(snapshot_json(snap)))).hardware.gpus == (apple,)
    older = json.loads(json.dumps(snapshot_json(s.snap(s.T0))))
    for entry in older["hardware"]["gpus"]:  # an agent before #21
        del entry["processes"], entry["processes_rss"], entry["memory_pressure"]
    assert snapshot_from_json(older).hardware.gpus[0].processes == ()


def test_a_peer_band_survives_the_round_trip() -> None:
    """A model's published peers' band (#23) reads back as written; a broken one is refused."""
    band = PeerBand(
        basis="M2 Max, Q4",
        scope="hardware",
        quant_group="Q4",
        n=14,
        median_share=0.58,
        low_share=0.52,
        high_share=0.62,
        min_share=0.45,
        max_share=0.66,
        causes=("too few threads",),
    )
    model = replace(s.model("llama3.1:8b", "decoding", 42.0), peer_band=band)
    doc = snapshot_json(s.snap(s.T0, s.server(model)))
    assert doc["servers"][0]["models"][0]["peer_band"]["label"] == "peers on M2 Max, Q4: 52–62 %, n=14"
    back = snapshot_from_json(json.loads(json.dumps(doc)))
    assert back.servers[0].models[0].peer_band == band
    doc["servers"][0]["models"][0]["peer_band"]["scope"] = "galaxy"
    with pytest.raises(RemoteDocError, match="scope"):
        snapshot_from_json(doc)


def test_per_position_draft_acceptance_survives_the_round_trip() -> None:
    """#22: the shares per draft position read back as written (4 digits); a broken list is refused."""
    model = replace(
        s.model("gemma", "decoding", 42.0), spec_type="draft-eagle3", draft_acceptance_by_position=(0.9, 0.5)
    )
    doc = snapshot_json(s.snap(s.T0, s.server(model)))
    assert doc["servers"][0]["models"][0]["draft_acceptance_by_position"] == [0.9, 0.5]
    back = snapshot_from_json(json.loads(json.dumps(doc)))
    assert back.servers[0].models[0].draft_acceptance_by_position == (0.9, 0.5)
    assert back.servers[0].models[0].spec_type == "draft-eagle3"
    doc["servers"][0]["models"][0]["draft_acceptance_by_position"] = ["high"]
    with pytest.raises(RemoteDocError, match="draft_acceptance_by_position"):
        snapshot_from_json(doc)
