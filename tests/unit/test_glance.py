"""icon_state / tooltip from synthetic snapshots (pure, no Qt)."""

from __future__ import annotations

from dataclasses import replace

from tests.support import snapshots
from tests.support.snapshots import LLAMA, OLLAMA
from trayapp.core.glance import (
    TOOLTIP_WIDTH_CHARS,
    GlanceTracker,
    IconState,
    choose_model,
    icon_state,
    wrap_lines,
)
from trayapp.core.hardware_readings import HardwareSnapshot, HostReading
from trayapp.core.model import Alert, ModelStatus, ServerStatus, Snapshot
from trayapp.core.thresholds import Thresholds
from trayapp.core.units import format_rate_short, format_tokens

HW = HardwareSnapshot(
    gpus=(),
    host=HostReading(ram_total_bytes=None, ram_available_bytes=None, ram_bandwidth_gbps=None),
    gpu_reason="no NVML",
)


def model(name: str = "llama3.1:8b", phase: str = "decoding", **kw: object) -> ModelStatus:
    return snapshots.model(name, phase, rate=42.2, exact=True, **kw)


def snap(*servers: ServerStatus, alerts: tuple[Alert, ...] = (), t: float = 100.0) -> Snapshot:
    return snapshots.snap(t, *servers, alerts=alerts, hardware=HW)


def llama(*models: ModelStatus) -> ServerStatus:
    return snapshots.server(*models, version=None)


def ollama(*models: ModelStatus) -> ServerStatus:
    return snapshots.server(*models, url=OLLAMA, kind="ollama", version=None)


def alert(severity: str = "warning", kind: str = "offload") -> Alert:
    return snapshots.alert(f"{kind}-1", kind, severity, fix="num_ctx 12k", cause=None, since_wall_s=1.0)


def test_generating_shows_number_ring_and_ok() -> None:
    state = icon_state(snap(llama(model())))
    assert state.health == "ok"
    assert state.text == "42"
    assert state.ring == 0.7  # 42.2 / 62 = 0.68 → 5 % steps
    assert not state.offload
    assert state.tooltip_lines == (
        "llama3.1:8b Q4_K_M · llama-server",
        "42 tok/s · 68 % of 62 tok/s ceiling",  # exact: unmarked
        "context 6.1k / 8k · 100 % GPU",
    )


def test_estimated_rate_says_so_and_small_rates_have_one_decimal() -> None:
    state = icon_state(snap(llama(model(decode_tok_s=4.26, decode_exact=False))))
    assert state.text == "4.3"
    assert state.tooltip_lines[1].startswith("~4.3 tok/s ·")  # "~": estimated
    assert state.health == "degraded"  # 4.3 / 62 is far under the 45 % threshold


def test_idle_has_no_number_and_faint_last_ring() -> None:
    idle = model(phase="idle", last_decode_tok_s=40.0, context_tokens=0)
    state = icon_state(snap(llama(idle)))
    assert state.health == "idle"
    assert state.text is None
    assert state.ring_faint and state.ring == 0.65
    assert state.tooltip_lines[1] == "idle · last 40 tok/s · TTFT 0.31 s · ceiling 62 tok/s"


def test_the_tooltip_marks_an_estimated_ttft_and_not_an_exact_one() -> None:
    estimated = model(phase="idle", last_decode_tok_s=40.0, ttft_s=0.5, ttft_exact=False)
    exact = model(phase="idle", last_decode_tok_s=40.0, ttft_s=0.214, ttft_exact=True)  # e.g. the proxy's
    assert "TTFT ~0.50 s" in icon_state(snap(llama(estimated))).tooltip_lines[1]
    assert "TTFT 0.21 s ·" in icon_state(snap(llama(exact))).tooltip_lines[1]


def test_alert_outranks_a_good_number() -> None:
    state = icon_state(snap(llama(model()), alerts=(alert(),)))
    assert state.health == "alert"
    assert state.text == "42"  # the number still shows
    assert "⚠ qwen3:30b spilled to the CPU (52 %)" in state.tooltip_lines
    info_only = icon_state(snap(llama(model()), alerts=(alert("info", "cold_load"),)))
    assert info_only.health == "ok"
    ended = replace(alert(), ended_wall_s=5.0)
    assert icon_state(snap(llama(model()), alerts=(ended,))).health == "ok"


def test_offload_mark_and_cpu_share_in_tooltip() -> None:
    spilled = model(
        name="qwen3:30b",
        gpu_fraction=0.48,
        decode_tok_s=9.1,
        ceiling_tok_s=12.0,
        full_gpu_ceiling_tok_s=48.0,
        quantization=None,
        context_length=32768,
        context_tokens=None,
    )
    state = icon_state(snap(ollama(spilled)))
    assert state.offload
    assert state.health == "degraded"
    assert state.tooltip_lines[0] == "qwen3:30b · Ollama"
    assert state.tooltip_lines[2] == "context — / 32k · 48 % GPU · 52 % CPU ⚠"
    assert not icon_state(snap(ollama(replace(spilled, gpu_fraction=0.99)))).offload


def test_no_server_is_hollow_and_says_what_was_probed() -> None:
    down = (
        ServerStatus(kind="ollama", url=OLLAMA, status="unreachable", reason="connection refused"),
        ServerStatus(kind="llamacpp", url="http://u:p@127.0.0.1:8080", status="unreachable"),
    )
    state = icon_state(snap(*down))
    assert state.health == "none"
    assert state.text is None and state.ring is None
    assert state.tooltip_lines[0] == "No LLM server found"
    assert state.tooltip_lines[1] == "probed: 127.0.0.1:11434, 127.0.0.1:8080"
    nothing = icon_state(snap(), discovery=False)
    assert nothing.health == "none"
    assert "discovery is off" in nothing.tooltip
    assert icon_state(None).health == "none"


def test_with_nothing_probed_the_tooltip_says_whether_discovery_is_on() -> None:
    """No endpoint configured and no server in the snapshot: the scan found nothing, or there is none."""
    scanning = icon_state(snap(), discovery=True)
    assert scanning.tooltip_lines == (
        "No LLM server found",
        "no endpoint configured; nothing answers on the default ports",
    )
    assert "discovery is off" not in scanning.tooltip
    assert scanning.tooltip == "\n".join(scanning.tooltip_lines)  # 60 characters: it does not wrap
    off = icon_state(snap(), discovery=False)
    assert off.tooltip_lines == (
        "No LLM server found",
        "nothing probed: no endpoints configured and discovery is off",
    )
    unknown = icon_state(snap())  # a caller that does not say: no claim either way
    assert unknown.tooltip_lines == ("No LLM server found", "no endpoints configured and no server found")
    assert GlanceTracker(discovery=True).update(snap()).tooltip_lines == scanning.tooltip_lines
    assert GlanceTracker(discovery=False).update(snap()).tooltip_lines == off.tooltip_lines


LONG_ALERT = (
    "qwen3:30b spilled to the CPU (52 %): decode runs at system-RAM speed, about 9 tok/s instead of "
    "48 tok/s; unload another model or pick a smaller quantization"
)  # 156 characters: one tooltip line of ~1,500 px before it wrapped


def test_a_long_alert_wraps_at_spaces_to_a_sane_width() -> None:
    long = replace(alert(), message=LONG_ALERT)
    state = icon_state(snap(llama(model()), alerts=(long,)))
    assert state.tooltip_lines[-1] == f"⚠ {LONG_ALERT}"  # the lines (bars, JSON) stay whole
    assert state.tooltip.split("\n") == [
        "llama3.1:8b Q4_K_M · llama-server",
        "42 tok/s · 68 % of 62 tok/s ceiling",  # exact: unmarked
        "context 6.1k / 8k · 100 % GPU",
        "⚠ qwen3:30b spilled to the CPU (52 %): decode runs at",  # 53; + " system-RAM" would be 64
        "  system-RAM speed, about 9 tok/s instead of 48 tok/s;",  # 54; + " unload" would be 61
        "  unload another model or pick a smaller quantization",  # 53
    ]
    assert TOOLTIP_WIDTH_CHARS == 60


def test_a_word_longer_than_the_width_stays_whole() -> None:
    url = "http://very-long-host-name.example.internal:8080/v1/chat/completions"  # 68 characters
    assert wrap_lines([f"error at {url} now"]) == ["error at", f"  {url}", "  now"]
    assert wrap_lines(["short", ""]) == ["short", ""]  # an empty line stays a line


def test_server_without_models_is_idle() -> None:
    state = icon_state(snap(llama()))
    assert state.health == "idle"
    assert state.tooltip_lines == ("llama-server 127.0.0.1:8080 · no model loaded",)


def test_several_models_active_the_decoding_one_is_shown() -> None:
    idle = model(name="qwen3:30b", phase="idle")
    decoding = model(name="llama3.1:8b")
    state = icon_state(snap(ollama(idle), llama(decoding)))
    assert state.model_key == (LLAMA, "llama3.1:8b")
    assert state.text == "42"
    prefill = model(name="qwen3:30b", phase="prefill", prompt_tok_s=1850.0)
    assert choose_model(snap(ollama(prefill), llama(model(phase="idle"))))[1].name == "qwen3:30b"  # type: ignore[index]


def test_ties_go_to_the_most_recently_started() -> None:
    tracker = GlanceTracker()
    a = model(name="a", decode_tok_s=30.0)
    b = model(name="b", decode_tok_s=50.0)
    assert tracker.update(snap(llama(a), t=1.0)).model_key == (LLAMA, "a")
    assert tracker.update(snap(llama(a), ollama(b), t=2.0)).model_key == (OLLAMA, "b")  # b started later
    assert tracker.update(snap(llama(a), ollama(b), t=3.0)).model_key == (OLLAMA, "b")
    shown = tracker.update(snap(llama(a), ollama(replace(b, phase="idle")), t=4.0))
    assert shown.model_key == (LLAMA, "a")
    assert "+1 more model decoding" in tracker.update(snap(llama(a), ollama(b), t=5.0)).tooltip


def test_number_hysteresis_keeps_the_icon_still() -> None:
    tracker = GlanceTracker()
    first = tracker.update(snap(llama(model(decode_tok_s=42.2)), t=1))
    second = tracker.update(snap(llama(model(decode_tok_s=42.9)), t=2))  # would round to 43
    assert first == second and second.text == "42"
    third = tracker.update(snap(llama(model(decode_tok_s=45.0)), t=3))
    assert third.text == "45"
    assert third != second


def test_degraded_has_hysteresis() -> None:
    tracker = GlanceTracker(Thresholds(low_efficiency_ratio=0.45))
    assert tracker.update(snap(llama(model(decode_tok_s=27.0)), t=1)).health == "degraded"  # 0.435
    assert tracker.update(snap(llama(model(decode_tok_s=29.0)), t=2)).health == "degraded"  # 0.468 < 0.50
    assert tracker.update(snap(llama(model(decode_tok_s=32.0)), t=3)).health == "ok"  # 0.516


def test_low_efficiency_is_judged_only_fully_on_gpu_and_the_floor_always() -> None:
    cpu_only = model(gpu_fraction=None, decode_tok_s=20.0)  # 32 % of the ceiling, no GPU known
    assert icon_state(snap(llama(cpu_only))).health == "ok"
    assert icon_state(snap(llama(replace(cpu_only, decode_tok_s=2.5)))).health == "degraded"  # under 3 tok/s
    assert icon_state(snap(llama(replace(cpu_only, gpu_fraction=1.0)))).health == "degraded"


def test_icon_state_equality_ignores_tooltip() -> None:
    a = IconState("ok", "42", 0.7, tooltip_lines=("x",))
    b = IconState("ok", "42", 0.7, tooltip_lines=("y",))
    assert a == b and hash(a) == hash(b)
    assert IconState("ok", "42", 0.7) != IconState("alert", "42", 0.7)


def test_formatting() -> None:
    assert [format_rate_short(r) for r in (0.04, 9.4, 9.96, 42.4, 142.6, 999.4, 1500.0)] == [
        "0.0",
        "9.4",
        "10",
        "42",
        "143",
        "999",
        "2k",
    ]
    assert all(len(format_rate_short(r)) <= 3 for r in (0.0, 5.55, 99.9, 999.6, 12_345.0, 10**7))
    assert [format_tokens(n) for n in (850, 6246, 8192, 32768, 131072, 40_000)] == [
        "850",
        "6.2k",
        "8k",
        "32k",
        "128k",
        "40k",
    ]
