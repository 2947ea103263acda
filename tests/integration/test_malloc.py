"""glibc hands back what a process freed (sources/malloc.py), measured in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# 300 blocks of 100 KB: below glibc's mmap threshold (128 KiB), so from the heap, not their own mmaps.
# The last one stays alive and pins the heap's top, so free() alone cannot shrink it: 30 MB of free
# pages stay in the RSS until malloc_trim hands them back.
CHILD = """
import sys
from trayapp.sources.malloc import release_free_memory

def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

blocks = [bytearray(100_000) for _ in range(300)]
pin = blocks[-1]
for block in blocks[:-1]:
    block[::4096] = b"x" * len(block[::4096])  # touch every page
held = rss_bytes()
del block
blocks = None
freed = rss_bytes()
released = release_free_memory()
after = rss_bytes()
print(released, held, freed, after)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_free_pages_go_back_to_the_os() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    released, held, freed, after = result.stdout.split()
    assert int(held) - int(freed) < 5_000_000  # free() alone kept them (the premise)
    assert released == "True"
    assert int(freed) - int(after) >= 20_000_000  # of the 29.9 MB freed beneath the pinned block
