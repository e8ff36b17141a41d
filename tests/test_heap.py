"""common/heap.py: the memory a process freed goes back to the system."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from spreeze.common import heap


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_trim_gives_freed_heap_memory_back() -> None:
    heap.trim()
    # 64 KiB blocks come from the heap (below glibc's mmap threshold); the last one, kept, pins
    # the heap's top, so the freed ones below it stay in the process until trimmed
    blocks = [bytearray(64 * 1024) for _ in range(800)]  # 50 MiB, touched (zeroed)
    kept = blocks[-1]
    del blocks
    before = rss_mb()
    assert heap.trim() is True
    after = rss_mb()
    assert before - after > 25, (before, after)  # most of the 50 MiB freed went back
    assert len(kept) == 64 * 1024
