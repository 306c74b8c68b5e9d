"""glibc malloc settings that keep large attention tensors off ``mmap``.

A capture keeps every layer's pattern alive (``[batch, head, query_pos, key_pos]``, a
few MiB each). glibc serves blocks that large with a fresh ``mmap`` and returns them
with ``munmap`` on free, so every batch pays page faults to zero new pages: about 7% of
a MiniLM forward on this project's 2-core machine. Fixing the mmap threshold at 32 MiB
(and keeping up to 64 MiB of freed heap before trimming it) lets the heap reuse those
blocks: capture then costs 1.005x the plain forward instead of 1.07-1.18x.

The ``headscope`` command calls :func:`tune_allocator` at start
(``HEADSCOPE_MALLOC_TUNING=0`` turns it off); a notebook can call it once. It changes
only this process, and does nothing off glibc.

:func:`trim_heap` hands the heap's free pages back to the system (``malloc_trim(0)``): a load
frees its float32 reading copy (blocks under the mmap threshold, interleaved with the weights
kept) into the heap, which glibc trims only from its top; on a Qwen2-0.5B-shaped checkpoint
1.3 GiB stayed resident after the load (3.78 GiB), 2.48 GiB once trimmed. The report calls
it after the load and after each stage.

>>> isinstance(tune_allocator(), bool), isinstance(trim_heap(), bool)
(True, True)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["trim_heap", "tune_allocator"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` for this process.

    Returns True when both were set; False off Linux/glibc, when
    ``HEADSCOPE_MALLOC_TUNING=0``, or when glibc refuses a value.
    """
    if os.environ.get("HEADSCOPE_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) == 1 and mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)) == 1


def trim_heap() -> bool:
    """``malloc_trim(0)``: return the heap's free pages to the system (module doc); True when
    glibc released some, False when none or off glibc (``HEADSCOPE_MALLOC_TUNING=0``: off too)."""
    if os.environ.get("HEADSCOPE_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim(0) == 1
