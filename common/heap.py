"""Freed memory back to the operating system.

glibc's allocator keeps the memory a process freed in its heap for reuse, and reuses it
only for allocations that fit the holes; a service whose allocations come in bursts (a
sampler re-sending its kept batches to a restarted replay) then grows its resident memory
at each burst and never shrinks, although nothing is alive there. `trim()` hands the free
pages back (malloc_trim(3)); services call it every TRIM_EVERY_S seconds. Where the C
library is not glibc (musl, macOS) there is no such call and `trim()` does nothing.
"""

from __future__ import annotations

import ctypes
from typing import Any

TRIM_EVERY_S = 60.0  # seconds between trims: cheap (a few ms at most), and memory stays flat

_malloc_trim: Any = None


def _load() -> Any:
    """malloc_trim among the symbols the process has loaded (the C library's), or None.
    (Not ctypes.util.find_library: it runs ldconfig in a subprocess, a fork of a process whose
    ZeroMQ and torch threads run, for a symbol the process has already loaded.)"""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def trim() -> bool:
    """Hand the heap's free pages back to the system; False where the C library cannot."""
    global _malloc_trim
    if _malloc_trim is None:
        _malloc_trim = _load() or False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True
