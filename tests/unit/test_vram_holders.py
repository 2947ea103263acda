"""core/vram_holders.py: labels, sizes, snapshots and the GPU card's holder lines (#21)."""

from __future__ import annotations

from dataclasses import replace

from tests.support.diagnose_inputs import hardware
from trayapp.core.hardware_readings import GpuProcess
from trayapp.core.vram_holders import (
    OTHER_USER,
    VramHolder,
    gpu_holders_lines,
    holders_besides,
    holders_text,
    keep_snapshot,
    layers_on_gpu,
)

FIREFOX = GpuProcess(2001, "firefox", 2_900_000_000)
STEAM = GpuProcess(2002, "steam", 1_600_000_000)
PYTHON = GpuProcess(4121, "python3", 1_300_000_000)
HIDDEN = GpuProcess(77, OTHER_USER, 700_000_000)
WDDM = GpuProcess(88, "game.exe", None)
SERVER = GpuProcess(3000, "llama-server", 6_000_000_000)


def test_the_issue_s_sentence() -> None:
    holders = holders_besides(hardware(12_000_000_000, (WDDM, PYTHON, SERVER, STEAM, FIREFOX)), (3000,))
    assert [h.pid for h in holders] == [2001, 2002, 4121, 88]  # largest first, unknown sizes last
    assert holders_text(holders) == "firefox 2.9 GB, steam 1.6 GB, python3 (pid 4121) 1.3 GB and 1 more"
    assert holders_text(holders, 5).endswith(", game.exe unavailable")  # never 0
    assert holders_text([VramHolder(77, OTHER_USER, 700_000_000), VramHolder(9, None, 1)]) == (
        "another user's process (pid 77) 0.7 GB, pid 9 0.0 GB"
    )
    two = [VramHolder(1, "ollama", 3_000_000_000), VramHolder(2, "ollama", 2_000_000_000)]
    assert holders_text(two) == "ollama (pid 1) 3.0 GB, ollama (pid 2) 2.0 GB"  # the same name: told apart


def test_layers_are_whole_and_in_range() -> None:
    # 0.5968 × 40 = 23.87 → 24; 0.99 × 33 = 32.67 → 33; 0.01 × 33 = 0.33 → 0.
    assert [layers_on_gpu(f, n) for f, n in ((0.5968, 40), (0.99, 33), (0.01, 33), (1.5, 10))] == [
        24,
        33,
        0,
        10,
    ]


def test_a_snapshot_is_kept_until_the_model_is_placed_again() -> None:
    busy = hardware(12_000_000_000, (SERVER, FIREFOX))
    quiet = hardware(6_000_000_000, (SERVER,))
    first = keep_snapshot(None, False, 0.6, busy, (3000,), 10.0)
    assert [h.pid for h in first.holders] == [2001] and first.t_wall_s == 10.0
    assert keep_snapshot(first, False, 0.602, quiet, (3000,), 11.0) is first  # the same placement
    assert keep_snapshot(first, False, 1.0, quiet, (3000,), 12.0).holders == ()  # placed again
    assert keep_snapshot(first, True, 0.6, quiet, (3000,), 13.0).t_wall_s == 13.0  # loading


def test_the_gpu_card_lists_the_holders_and_apple_its_ram_users() -> None:
    hw = hardware(12_000_000_000, (PYTHON, SERVER, HIDDEN))
    assert gpu_holders_lines(hw) == [
        "GPU memory held by: llama-server 6.0 GB, python3 (pid 4121) 1.3 GB, "
        "another user's process (pid 77) 0.7 GB"
    ]
    (gpu,) = hw.gpus
    apple = replace(
        gpu,
        processes=(GpuProcess(11, "ollama", 21_000_000_000),),
        processes_rss=True,
        memory_pressure="warning",
    )
    assert gpu_holders_lines(replace(hw, gpus=(apple,))) == [
        "RAM used by: ollama 21.0 GB · memory pressure: warning"
    ]
    assert holders_besides(replace(hw, gpus=(apple,)), ()) == ()  # RAM users are not GPU memory holders
    assert gpu_holders_lines(hardware(1_000_000_000)) == []


def test_status_names_who_holds_the_gpu_memory_under_its_line() -> None:
    from tests.support.snapshots import snap
    from trayapp.core.text import format_snapshot

    text = format_snapshot(replace(snap(0.0), hardware=hardware(12_000_000_000, (PYTHON, WDDM))))
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("GPU 0: NVIDIA GeForce RTX 4090")]
    assert lines[at + 1] == "  GPU memory held by: python3 (pid 4121) 1.3 GB, game.exe unavailable"
